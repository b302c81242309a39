package hollow

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// RenewPeriod is how often a hollow primary renews its Lease, as an agent does.
const RenewPeriod = time.Second

// Promotion is a hollow instance promoted by the operator.
type Promotion struct {
	Namespace, Pod string
	At             time.Time
}

// Kubelet runs the hollow instances of every PostgresCluster's StatefulSet.
type Kubelet struct {
	client client.Client
	// agents reads and writes the primary Leases, from the API server, as the agents
	// do: as a service account, not as the harness's administrator (AgentUser).
	agents client.Client
	log    logr.Logger

	mu        sync.Mutex
	instances map[string]*instance // by namespace/pod
	servers   map[string]context.CancelFunc
	leases    map[string]primarylease.Record // by namespace/cluster
	bootstrap map[string]bool                // namespace/cluster: its first primary was made
	nextIP    int
	promotion chan Promotion

	gapsMu sync.Mutex
	gaps   []time.Duration // between two renewals of a Lease (RenewalGaps)
}

// scheme is what the Kubelet reads.
func scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, coordinationv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AgentUser is who the hollow agents are to the API server when they read and write
// their Leases. Real agents are service accounts, whose requests API Priority and
// Fairness queues fairly with the operator's (both in workload-low); the harness's
// administrator is exempt from it, so 1,000 renewals a second sent as the
// administrator took the API server from the operator during a create wave, and the
// Helm manager lost its leader Lease.
const AgentUser = "system:serviceaccount:pgpilot-hollow:agent"

// agentRole lets AgentUser read and update Leases, as an agent's Role does in its
// namespace.
func agentRole(ctx context.Context, admin client.Client) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pgpilot-hollow-agent"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, Verbs: []string{"get", "update"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pgpilot-hollow-agent"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: AgentUser}}}
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// Start runs a Kubelet with cfg (which may create pods, set their status and update
// Leases) until ctx ends.
func Start(ctx context.Context, cfg *rest.Config, log logr.Logger) (*Kubelet, error) {
	s, err := scheme()
	if err != nil {
		return nil, err
	}
	if err := rbacv1.AddToScheme(s); err != nil {
		return nil, err
	}
	agentCfg := rest.CopyConfig(cfg)
	agentCfg.QPS, agentCfg.Burst = 2000, 4000
	agentCfg.Impersonate = rest.ImpersonationConfig{UserName: AgentUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:pgpilot-hollow", "system:authenticated"}}
	agents, err := client.New(agentCfg, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	req, err := labels.NewRequirement(dbv1.LabelCluster, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	labelled := cache.ByObject{Label: labels.NewSelector().Add(*req)}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 2000, 4000
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}, Logger: log,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: labelled, &appsv1.StatefulSet{}: labelled, &coordinationv1.Lease{}: labelled,
		}, DefaultTransform: cache.TransformStripManagedFields()},
	})
	if err != nil {
		return nil, err
	}
	if err := agentRole(ctx, mgr.GetClient()); err != nil {
		return nil, fmt.Errorf("letting the hollow agents write Leases: %w", err)
	}
	k := &Kubelet{
		client: mgr.GetClient(), agents: agents, log: log,
		instances: map[string]*instance{}, servers: map[string]context.CancelFunc{},
		leases: map[string]primarylease.Record{}, bootstrap: map[string]bool{},
		promotion: make(chan Promotion, 1024),
	}
	leases, err := mgr.GetCache().GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return nil, err
	}
	if _, err := leases.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    k.noteLease,
		UpdateFunc: func(_, o any) { k.noteLease(o) },
	}); err != nil {
		return nil, err
	}
	err = ctrl.NewControllerManagedBy(mgr).Named("hollow-kubelet").
		For(&appsv1.StatefulSet{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name := o.GetLabels()[dbv1.LabelCluster]
			if name == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: dbv1.NamesOf(name).StatefulSet()}}}
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 16}).
		Complete(reconcile.Func(k.reconcile))
	if err != nil {
		return nil, err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			log.Error(err, "The hollow kubelet stopped")
		}
	}()
	go k.renew(ctx)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return nil, errors.New("the hollow kubelet's cache did not sync")
	}
	return k, nil
}

// Promotions are the promotions as they happen.
func (k *Kubelet) Promotions() <-chan Promotion { return k.promotion }

func (k *Kubelet) noteLease(o any) {
	l, ok := o.(*coordinationv1.Lease)
	if !ok {
		return
	}
	cluster := l.Labels[dbv1.LabelCluster]
	if cluster == "" || l.Name != dbv1.NamesOf(cluster).PrimaryLease() {
		return
	}
	r := primarylease.Parse(l)
	k.mu.Lock()
	k.leases[l.Namespace+"/"+cluster] = r
	holder := k.instances[l.Namespace+"/"+r.Holder]
	k.mu.Unlock()
	if holder != nil {
		// An agent promotes itself once the Lease names it, whether or not the
		// operator's call reached it.
		holder.promoteFrom(r)
	}
}

func (k *Kubelet) leaseOf(namespace, cluster string) primarylease.Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.leases[namespace+"/"+cluster]
}

// firstHolder reports whether in, named by its cluster's Lease, is the cluster's first
// primary (bootstrapped as initdb would), marking it so.
func (k *Kubelet) firstHolder(in *instance) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := in.namespace + "/" + in.cluster
	if k.bootstrap[key] {
		return false
	}
	k.bootstrap[key] = true
	return true
}

// bootstrapped reports whether in's cluster had its first primary.
func (k *Kubelet) bootstrapped(in *instance) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bootstrap[in.namespace+"/"+in.cluster]
}

// readLease reads in's cluster's Lease from the API server.
func (k *Kubelet) readLease(ctx context.Context, in *instance) (primarylease.Record, error) {
	var l coordinationv1.Lease
	if err := k.agents.Get(ctx, client.ObjectKey{Namespace: in.namespace, Name: dbv1.NamesOf(in.cluster).PrimaryLease()}, &l); err != nil {
		return primarylease.Record{}, err
	}
	k.noteLease(&l)
	return primarylease.Parse(&l), nil
}

// peersOf are the instances of in's cluster that stream from it.
func (k *Kubelet) peersOf(in *instance) []string {
	k.mu.Lock()
	var peers []*instance
	for _, o := range k.instances {
		if o != in && o.namespace == in.namespace && o.cluster == in.cluster {
			peers = append(peers, o)
		}
	}
	k.mu.Unlock()
	var names []string
	for _, o := range peers {
		if o.following() {
			names = append(names, o.pod)
		}
	}
	slices.Sort(names)
	return names
}

func (k *Kubelet) promoted(in *instance, at time.Time) {
	select {
	case k.promotion <- Promotion{Namespace: in.namespace, Pod: in.pod, At: at}:
	default:
	}
}

// release gives the Lease up after a clean stop, as a demoted primary's agent does.
func (k *Kubelet) release(ctx context.Context, in *instance, h primarylease.Handover) error {
	store := primarylease.ClientStore{Reader: k.agents, Writer: k.agents, Namespace: in.namespace, Name: dbv1.NamesOf(in.cluster).PrimaryLease()}
	r := in.lease()
	current, err := store.Get(ctx)
	if err != nil {
		return err
	}
	_, err = primarylease.Apply(ctx, store, current, time.Now, primarylease.Release(in.pod, r.Term, h))
	return err
}

// Kill makes the instance of pod die as a node would: it answers nothing from now on
// and renews nothing. It returns when it died.
func (k *Kubelet) Kill(namespace, pod string) (time.Time, error) {
	k.mu.Lock()
	in := k.instances[namespace+"/"+pod]
	stop := k.servers[namespace+"/"+pod]
	delete(k.servers, namespace+"/"+pod)
	k.mu.Unlock()
	if in == nil {
		return time.Time{}, fmt.Errorf("no hollow instance %s/%s", namespace, pod)
	}
	in.mu.Lock()
	in.dead = true
	in.mu.Unlock()
	at := time.Now()
	if stop != nil {
		stop()
	}
	return at, nil
}

// Primary is the instance the cluster's Lease names, "" when none.
func (k *Kubelet) Primary(namespace, cluster string) string {
	return k.leaseOf(namespace, cluster).Holder
}

// renewers is how many renewals may be in flight at once. 1,000 agents renew 1,000
// Leases a second; the 2-core bench machine cannot carry that beside the operator. 256
// at once renewed them every second, but the API server, shared with etcd, the operator
// and this harness, then answered so slowly that the Helm manager and the controller
// lost their leader Leases and stopped, whether the renewals were sent as the
// administrator (a create wave) or as a service account queued fairly with the
// operator's requests (an idle minute after a 25-minute wave). 32 leave the API server
// room; benchscale prints the renewal gaps they reach.
const renewers = 32

// renew renews every primary's Lease each RenewPeriod, as its agent would. Agents renew
// each on its own clock: the renewals are spread over the period, in the same order
// every period. Sent together at each tick in map order, a Lease was renewed at a random
// moment of each period, up to two periods apart: later than an agent renews it.
func (k *Kubelet) renew(ctx context.Context) {
	tick := time.NewTicker(RenewPeriod)
	defer tick.Stop()
	work := make(chan *instance)
	for range renewers {
		go func() {
			for in := range work {
				k.renewOne(ctx, in)
			}
		}()
	}
	defer close(work)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k.mu.Lock()
		all := make([]*instance, 0, len(k.instances))
		for _, in := range k.instances {
			all = append(all, in)
		}
		k.mu.Unlock()
		// The same order every period: an agent renews every RenewPeriod, not at a
		// random moment of each.
		slices.SortFunc(all, func(a, b *instance) int {
			return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.pod, b.pod))
		})
		start := time.Now()
		gap := RenewPeriod / time.Duration(max(len(all), 1))
		for i, in := range all {
			if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			r := in.lease()
			in.mu.Lock()
			holds := !in.dead && in.isPrimaryLocked(r) && r.Holder == in.pod && r.Term == in.term
			in.mu.Unlock()
			if !holds {
				continue
			}
			select {
			case work <- in:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (k *Kubelet) renewOne(ctx context.Context, in *instance) {
	rctx, cancel := context.WithTimeout(ctx, RenewPeriod)
	defer cancel()
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: in.namespace, Name: dbv1.NamesOf(in.cluster).PrimaryLease()}
	if err := k.client.Get(rctx, key, &l); err != nil {
		return
	}
	in.mu.Lock()
	term := in.term
	in.mu.Unlock()
	store := primarylease.ClientStore{Reader: k.agents, Writer: k.agents, Namespace: in.namespace, Name: key.Name}
	if _, err := primarylease.Apply(rctx, store, &l, time.Now, primarylease.Renew(in.pod, term, nil)); err != nil {
		return
	}
	now := time.Now()
	in.mu.Lock()
	last := in.renewed
	in.renewed = now
	in.mu.Unlock()
	if !last.IsZero() {
		k.gapsMu.Lock()
		k.gaps = append(k.gaps, now.Sub(last))
		k.gapsMu.Unlock()
	}
}

// RenewalGaps returns the times between two successful renewals of a Lease by the same
// primary since the last call, sorted: how far the harness is from renewing every
// RenewPeriod, as agents do.
func (k *Kubelet) RenewalGaps() []time.Duration {
	k.gapsMu.Lock()
	defer k.gapsMu.Unlock()
	gaps := k.gaps
	k.gaps = nil
	slices.Sort(gaps)
	return gaps
}

// reconcile does for one StatefulSet what the StatefulSet controller and the kubelet
// would: every ordinal below spec.replicas has a running, ready pod with an address and
// a hollow instance behind it; a pod being deleted is deleted at once and made again
// (its instance, whose "volume" is kept, serves the new pod); ordinals above are
// removed.
func (k *Kubelet) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sts appsv1.StatefulSet
	if err := k.client.Get(ctx, req.NamespacedName, &sts); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	cluster := sts.Labels[dbv1.LabelCluster]
	if cluster == "" {
		return reconcile.Result{}, nil
	}
	revision := templateRevision(&sts)
	var pods corev1.PodList
	if err := k.client.List(ctx, &pods, client.InNamespace(sts.Namespace), client.MatchingLabels{dbv1.LabelCluster: cluster}); err != nil {
		return reconcile.Result{}, err
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	replicas := 1
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	ready := 0
	for _, p := range byName {
		ordinal, ok := dbv1.NamesOf(cluster).Ordinal(p.Name)
		if !ok {
			continue
		}
		if !p.DeletionTimestamp.IsZero() || ordinal >= replicas {
			if err := k.client.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
			if ordinal >= replicas {
				k.remove(sts.Namespace, p.Name)
			}
			delete(byName, p.Name)
		}
	}
	for i := range replicas {
		name := dbv1.NamesOf(cluster).Instance(i)
		in, err := k.instanceFor(ctx, &sts, cluster, name)
		if err != nil {
			return reconcile.Result{}, err
		}
		p := byName[name]
		if p == nil {
			if p, err = k.createPod(ctx, &sts, name, revision); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
				}
				return reconcile.Result{}, err
			}
		}
		if p.Status.PodIP != in.ip || !clusterpods.IsReady(p) {
			if err := k.setRunning(ctx, p, in.ip); err != nil {
				return reconcile.Result{}, err
			}
		}
		ready++
	}
	if sts.Status.ReadyReplicas != int32(ready) || sts.Status.UpdateRevision != revision || sts.Status.ObservedGeneration != sts.Generation {
		sts.Status.ObservedGeneration = sts.Generation
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.AvailableReplicas = int32(replicas), int32(ready), int32(ready)
		sts.Status.CurrentReplicas, sts.Status.UpdatedReplicas = int32(replicas), int32(replicas)
		sts.Status.CurrentRevision, sts.Status.UpdateRevision = revision, revision
		if err := k.client.Status().Update(ctx, &sts); err != nil && !apierrors.IsConflict(err) {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// templateRevision stands in for the StatefulSet controller's revision of the pod
// template.
func templateRevision(sts *appsv1.StatefulSet) string {
	b, _ := json.Marshal(sts.Spec.Template)
	sum := sha256.Sum256(b)
	return sts.Name + "-" + hex.EncodeToString(sum[:5])
}

func (k *Kubelet) createPod(ctx context.Context, sts *appsv1.StatefulSet, name, revision string) (*corev1.Pod, error) {
	labels := map[string]string{}
	for key, v := range sts.Spec.Template.Labels {
		labels[key] = v
	}
	labels[appsv1.ControllerRevisionHashLabelKey] = revision
	labels[appsv1.StatefulSetPodNameLabel] = name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sts.Namespace, Labels: labels, Annotations: sts.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}},
		Spec: *sts.Spec.Template.Spec.DeepCopy(),
	}
	for _, claim := range sts.Spec.VolumeClaimTemplates {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: claim.Name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name + "-" + name}}})
	}
	pod.Spec.NodeName = "hollow-node"
	pod.Spec.Hostname, pod.Spec.Subdomain = name, sts.Spec.ServiceName
	if err := k.client.Create(ctx, pod); err != nil {
		return nil, err
	}
	return pod, nil
}

func (k *Kubelet) setRunning(ctx context.Context, p *corev1.Pod, ip string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pod corev1.Pod
		if err := k.client.Get(ctx, client.ObjectKeyFromObject(p), &pod); err != nil {
			return client.IgnoreNotFound(err)
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		pod.Status.HostIP = "127.0.0.1"
		pod.Status.StartTime = &now
		pod.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		pod.Status.ContainerStatuses = nil
		for _, c := range pod.Spec.Containers {
			pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		return k.client.Status().Update(ctx, &pod)
	})
}

// instanceFor is the hollow instance of pod, made and served on its own address the
// first time (once the operator made the cluster's certificate and token).
func (k *Kubelet) instanceFor(ctx context.Context, sts *appsv1.StatefulSet, cluster, pod string) (*instance, error) {
	key := sts.Namespace + "/" + pod
	k.mu.Lock()
	in := k.instances[key]
	k.mu.Unlock()
	if in != nil {
		return in, nil
	}
	names := dbv1.NamesOf(cluster)
	var token, server corev1.Secret
	if err := k.client.Get(ctx, client.ObjectKey{Namespace: sts.Namespace, Name: names.AgentTokenSecret()}, &token); err != nil {
		return nil, fmt.Errorf("the agent token of %s: %w", cluster, err)
	}
	if err := k.client.Get(ctx, client.ObjectKey{Namespace: sts.Namespace, Name: names.ServerTLSSecret()}, &server); err != nil {
		return nil, fmt.Errorf("the server certificate of %s: %w", cluster, err)
	}
	cert, err := tls.X509KeyPair(server.Data[corev1.TLSCertKey], server.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the server certificate of %s: %w", cluster, err)
	}
	k.mu.Lock()
	if in = k.instances[key]; in != nil {
		k.mu.Unlock()
		return in, nil
	}
	k.nextIP++
	in = &instance{pod: pod, namespace: sts.Namespace, cluster: cluster, ip: loopback(k.nextIP), k: k, started: time.Now(),
		version: versionOf(sts), system: systemOf(sts), token: string(token.Data["token"]), cert: cert}
	k.instances[key] = in
	k.mu.Unlock()
	if err := k.serve(ctx, in); err != nil {
		return nil, err
	}
	return in, nil
}

// serve serves in's agent API on its address until Kill or remove.
func (k *Kubelet) serve(ctx context.Context, in *instance) error {
	l, err := net.Listen("tcp", net.JoinHostPort(in.ip, strconv.Itoa(agentapi.Port)))
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	k.mu.Lock()
	k.servers[in.namespace+"/"+in.pod] = stop
	k.mu.Unlock()
	srv := agentapi.NewServer(in, agentapi.ServerOptions{
		Token: in.token, Logger: logr.Discard(),
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{in.cert}},
	})
	go func() { _ = srv.Serve(sctx, l) }()
	return nil
}

// remove stops and forgets the instance of pod (its ordinal was scaled away).
func (k *Kubelet) remove(namespace, pod string) {
	key := namespace + "/" + pod
	k.mu.Lock()
	stop := k.servers[key]
	delete(k.servers, key)
	delete(k.instances, key)
	k.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// loopback is the n-th address of 127.1.0.0/16 onwards, none ending in 0 or 255.
func loopback(n int) string {
	host := n%254 + 1
	n /= 254
	return fmt.Sprintf("127.%d.%d.%d", 1+n/256, n%256, host)
}

// versionOf is the server_version_num of the StatefulSet's postgres image (postgres:16.11
// is 160011), 0 when its tag says none.
func versionOf(sts *appsv1.StatefulSet) int {
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name != "postgres" {
			continue
		}
		tag := c.Image[strings.LastIndex(c.Image, ":")+1:]
		major, minor, _ := strings.Cut(tag, ".")
		ma, err1 := strconv.Atoi(major)
		mi, err2 := strconv.Atoi(strings.SplitN(minor, "-", 2)[0])
		if err1 == nil && err2 == nil {
			return ma*10000 + mi
		}
	}
	return 0
}

// systemOf is a database system identifier of the cluster's own.
func systemOf(sts *appsv1.StatefulSet) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(sts.UID))
	return strconv.FormatUint(h.Sum64()>>1, 10)
}

// Revive brings a killed instance back, as its pod restarted on a node: it serves again
// on its address and, the Lease having moved on, follows the new primary (its agent
// would rewind it first).
func (k *Kubelet) Revive(ctx context.Context, namespace, pod string) error {
	key := namespace + "/" + pod
	k.mu.Lock()
	in := k.instances[key]
	k.mu.Unlock()
	if in == nil {
		return fmt.Errorf("no hollow instance %s", key)
	}
	in.mu.Lock()
	in.dead, in.primary, in.fenced, in.frozen = false, false, false, false
	in.started = time.Now()
	in.mu.Unlock()
	return k.serve(ctx, in)
}
