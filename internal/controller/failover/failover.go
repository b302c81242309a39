package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/agentapi"
	"github.com/pgpilot/pgpilot/internal/controller/clusterpods"
	"github.com/pgpilot/pgpilot/internal/controller/credentials"
)

// PollPeriod is how often each cluster's agents are asked for their status.
const PollPeriod = time.Second

// Event reasons.
const (
	ReasonPrimaryFailed     = "PrimaryFailed"
	ReasonFailoverBlocked   = "FailoverBlocked"
	ReasonFailoverStarted   = "FailoverStarted"
	ReasonFailoverCompleted = "FailoverCompleted"
	ReasonUnfenced          = "Unfenced"
	ReasonSwitchoverRefused = "SwitchoverRefused"
	ReasonSwitchedOver      = "SwitchedOver"
)

// FailoverReconciler watches every instance of every cluster and promotes a replica
// when the primary fails.
type FailoverReconciler struct {
	client   client.Client
	recorder record.EventRecorder
	clock    clock.PassiveClock
	http     *http.Client
	// agentURL is the base URL of a pod's agent.
	agentURL func(pod *corev1.Pod) string

	mu     sync.Mutex
	memory map[types.NamespacedName]*memory
}

// memory is what a cluster's decisions need from earlier observations. It is lost on
// a restart, which only delays a failover by the configured delay.
type memory struct {
	failedSince  time.Time
	syncStandbys []string
	lastReason   string
}

// NewFailoverReconciler returns a FailoverReconciler. agentURL nil means
// http://<pod IP>:8008.
func NewFailoverReconciler(c client.Client, recorder record.EventRecorder, clk clock.PassiveClock, agentURL func(*corev1.Pod) string) *FailoverReconciler {
	if agentURL == nil {
		agentURL = func(p *corev1.Pod) string {
			return "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(agentapi.Port))
		}
	}
	return &FailoverReconciler{
		client: c, recorder: recorder, clock: clk, agentURL: agentURL,
		http:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}},
		memory: map[types.NamespacedName]*memory{},
	}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile observes the cluster's instances, decides, acts, and comes back after
// PollPeriod.
func (r *FailoverReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	var lease coordinationv1.Lease
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.PrimaryLeaseName()}, &lease); err != nil {
		return ctrl.Result{RequeueAfter: PollPeriod}, client.IgnoreNotFound(err)
	}
	var secret corev1.Secret
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.AgentTokenSecretName()}, &secret); err != nil {
		return ctrl.Result{RequeueAfter: PollPeriod}, client.IgnoreNotFound(err)
	}
	token := string(secret.Data[credentials.KeyToken])
	pods, err := clusterpods.List(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	instances := r.observe(ctx, pods, token)

	mem := r.remember(req.NamespacedName)
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	// The synchronous set since the last failover: every standby seen in it, so one that
	// dropped out between two observations still counts (more members only makes a
	// failover wait for more of them to answer).
	for _, i := range instances {
		if i.Name == holder && i.Reachable && i.Status.Role == agentapi.RolePrimary && i.Status.Ready {
			for _, name := range syncStandbys(i.Status) {
				if !slices.Contains(mem.syncStandbys, name) {
					mem.syncStandbys = append(mem.syncStandbys, name)
				}
			}
		}
	}
	if err := r.unfence(ctx, &cluster, pods, instances, holder); err != nil {
		return ctrl.Result{}, err
	}

	if target, ok := cluster.Annotations[dbv1.AnnotationSwitchoverTo]; ok {
		return ctrl.Result{RequeueAfter: PollPeriod}, r.switchover(ctx, &cluster, &lease, pods, instances, holder, target, token)
	}

	d := Decide(Input{
		Holder: holder, Instances: instances, Enabled: cluster.FailoverEnabled(), Delay: cluster.FailoverDelay(),
		SynchronousReplicas: int(cluster.Spec.PostgreSQL.SynchronousReplicas), SyncStandbys: mem.syncStandbys,
		FailedSince: mem.failedSince, Now: r.clock.Now(),
	})
	mem.failedSince = d.FailedSince
	logger := log.FromContext(ctx)
	if d.Action != Blocked {
		if err := r.setBlocked(ctx, &lease, ""); err != nil {
			return ctrl.Result{}, err
		}
	}
	switch d.Action {
	case None:
		mem.lastReason = ""
	case Wait:
		if mem.lastReason == "" {
			logger.Info("Primary failed", "reason", d.Reason)
			r.recorder.Event(&cluster, corev1.EventTypeWarning, ReasonPrimaryFailed, d.Reason)
		}
		mem.lastReason = d.Reason
		return ctrl.Result{RequeueAfter: min(d.RequeueAfter, PollPeriod)}, nil
	case Blocked:
		if d.Reason != mem.lastReason {
			logger.Info("Failover blocked", "reason", d.Reason)
			r.recorder.Event(&cluster, corev1.EventTypeWarning, ReasonFailoverBlocked, d.Reason)
		}
		mem.lastReason = d.Reason
		if err := r.setBlocked(ctx, &lease, d.Reason); err != nil {
			return ctrl.Result{}, err
		}
	case Promote:
		if err := r.failover(ctx, &cluster, &lease, pods, holder, d, token); err != nil {
			return ctrl.Result{}, err
		}
		// Until the new primary is observed, its synchronous set is at most the
		// replicas streaming now: the fenced old primary cannot acknowledge anything on
		// the new timeline before it has been rewound.
		mem.failedSince, mem.lastReason, mem.syncStandbys = time.Time{}, "", streamingReplicas(instances, holder, d.Target)
	}
	return ctrl.Result{RequeueAfter: PollPeriod}, nil
}

// observe asks every pod's agent for its status, all at once, each within a second.
func (r *FailoverReconciler) observe(ctx context.Context, pods []corev1.Pod, token string) []Instance {
	out := make([]Instance, len(pods))
	var wg sync.WaitGroup
	for i := range pods {
		out[i].Name = pods[i].Name
		if pods[i].Status.PodIP == "" || !pods[i].DeletionTimestamp.IsZero() {
			continue
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, PollPeriod)
			defer cancel()
			st, err := r.agent(&pods[i], token).Status(pctx)
			if err == nil {
				out[i].Reachable, out[i].Status = true, st
			}
		}(i)
	}
	wg.Wait()
	return out
}

// streamingReplicas are the running replicas other than the old and new primary.
func streamingReplicas(instances []Instance, oldPrimary, newPrimary string) []string {
	out := []string{}
	for _, i := range instances {
		if i.Name != oldPrimary && i.Name != newPrimary && i.Reachable && i.Status.Role == agentapi.RoleReplica && i.Status.Running {
			out = append(out, i.Name)
		}
	}
	return out
}

// syncStandbys are the standbys a primary reports in sync or quorum state.
func syncStandbys(st agentapi.Status) []string {
	var out []string
	for _, r := range st.Replicas {
		if r.SyncState == "sync" || r.SyncState == "quorum" {
			out = append(out, r.Name)
		}
	}
	return out
}

// failover fences the old primary, moves the Lease and promotes the target.
func (r *FailoverReconciler) failover(ctx context.Context, c *dbv1.PostgresCluster, lease *coordinationv1.Lease,
	pods []corev1.Pod, holder string, d Decision, token string) error {
	logger := log.FromContext(ctx)
	start := r.clock.Now()
	logger.Info("Failing over", "from", holder, "to", d.Target, "reason", d.Reason)
	r.recorder.Event(c, corev1.EventTypeWarning, ReasonFailoverStarted, d.Reason)

	// 1. Fence: out of the read-write Service at once, and told to stop if it answers.
	for i := range pods {
		if pods[i].Name == holder {
			if err := r.label(ctx, &pods[i], dbv1.RoleFenced); err != nil {
				return err
			}
		}
	}
	for i := range pods {
		if pods[i].Name == holder && pods[i].Status.PodIP != "" {
			fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := r.agent(&pods[i], token).Fence(fctx)
			cancel()
			if err != nil {
				logger.Info("Could not fence the old primary through its agent; the Lease and the label fence it", "pod", holder, "error", err.Error())
			}
		}
	}

	// 2. The Lease names the new primary, with the record of this failover.
	err := r.moveLease(ctx, lease, d.Target, func(now metav1.Time) error {
		record, err := json.Marshal(dbv1.FailoverRecord{From: holder, To: d.Target, Time: now,
			Duration: r.clock.Since(d.FailedSince).Round(time.Millisecond).String(), Reason: d.Reason})
		if err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&lease.ObjectMeta, dbv1.AnnotationLastFailover, string(record))
		delete(lease.Annotations, dbv1.AnnotationFailoverBlocked)
		return nil
	})
	if err != nil {
		return err
	}

	// 3. Promote.
	r.promote(ctx, pods, d.Target, token)
	msg := fmt.Sprintf("Promoted %s in place of %s in %s", d.Target, holder, r.clock.Since(start).Round(time.Millisecond))
	logger.Info("Failed over", "from", holder, "to", d.Target, "took", r.clock.Since(start).String())
	r.recorder.Event(c, corev1.EventTypeNormal, ReasonFailoverCompleted, msg)
	return nil
}

// setBlocked records on the Lease why no failover can happen ("" when one can), for the
// status controller's FailoverReady condition; it writes only on change.
func (r *FailoverReconciler) setBlocked(ctx context.Context, lease *coordinationv1.Lease, reason string) error {
	if lease.Annotations[dbv1.AnnotationFailoverBlocked] == reason {
		return nil
	}
	patch := client.MergeFrom(lease.DeepCopy())
	if reason == "" {
		delete(lease.Annotations, dbv1.AnnotationFailoverBlocked)
	} else {
		metav1.SetMetaDataAnnotation(&lease.ObjectMeta, dbv1.AnnotationFailoverBlocked, reason)
	}
	return client.IgnoreNotFound(r.client.Patch(ctx, lease, patch))
}

// switchover hands the primary role to target: the holder is demoted first (a clean
// shutdown sends every WAL record to the connected standbys), then the Lease moves and
// target is promoted. The request annotation is removed when done or refused.
func (r *FailoverReconciler) switchover(ctx context.Context, c *dbv1.PostgresCluster, lease *coordinationv1.Lease,
	pods []corev1.Pod, instances []Instance, holder, target, token string) error {
	logger := log.FromContext(ctx)
	if why := CheckSwitchover(holder, target, instances); why != "" {
		logger.Info("Switchover refused", "to", target, "reason", why)
		r.recorder.Eventf(c, corev1.EventTypeWarning, ReasonSwitchoverRefused, "Switchover to %s refused: %s", target, why)
		return r.clearSwitchover(ctx, c)
	}
	start := r.clock.Now()
	for i := range pods {
		if pods[i].Name == holder {
			if err := r.label(ctx, &pods[i], dbv1.RoleFenced); err != nil {
				return err
			}
			dctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := r.agent(&pods[i], token).Demote(dctx)
			cancel()
			if err != nil {
				// Not demoted: it may still accept writes. Put it back and report.
				_ = r.label(ctx, &pods[i], dbv1.RolePrimary)
				r.recorder.Eventf(c, corev1.EventTypeWarning, ReasonSwitchoverRefused, "Switchover to %s failed: demoting %s: %v", target, holder, err)
				return r.clearSwitchover(ctx, c)
			}
		}
	}
	if err := r.moveLease(ctx, lease, target, func(metav1.Time) error { return nil }); err != nil {
		return err
	}
	r.promote(ctx, pods, target, token)
	took := r.clock.Since(start).Round(time.Millisecond)
	logger.Info("Switched over", "from", holder, "to", target, "took", took.String())
	r.recorder.Eventf(c, corev1.EventTypeNormal, ReasonSwitchedOver, "Switched over from %s to %s in %s", holder, target, took)
	return r.clearSwitchover(ctx, c)
}

// agent is a client of pod's agent API.
func (r *FailoverReconciler) agent(pod *corev1.Pod, token string) *agentapi.Client {
	return agentapi.NewClient(r.agentURL(pod), token, r.http)
}

// moveLease makes target the Lease's holder, the single source of truth for who is
// primary, written with optimistic concurrency so that two operators can never both
// move it; annotate adds to the same write.
func (r *FailoverReconciler) moveLease(ctx context.Context, lease *coordinationv1.Lease, target string, annotate func(now metav1.Time) error) error {
	now := metav1.NewMicroTime(r.clock.Now())
	lease.Spec.HolderIdentity = &target
	lease.Spec.AcquireTime, lease.Spec.RenewTime = &now, &now
	transitions := int32(1)
	if lease.Spec.LeaseTransitions != nil {
		transitions += *lease.Spec.LeaseTransitions
	}
	lease.Spec.LeaseTransitions = &transitions
	if err := annotate(metav1.NewTime(now.Time)); err != nil {
		return err
	}
	if err := r.client.Update(ctx, lease); err != nil {
		return fmt.Errorf("moving the primary Lease to %s: %w", target, err)
	}
	return nil
}

// promote asks target's agent to promote. The agent also promotes itself once it sees
// the Lease name it; the call only makes that sooner, so a failed call is logged only.
func (r *FailoverReconciler) promote(ctx context.Context, pods []corev1.Pod, target, token string) {
	for i := range pods {
		if pods[i].Name != target {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := r.agent(&pods[i], token).Promote(pctx)
		cancel()
		if err != nil {
			log.FromContext(ctx).Info("The promote call failed; the agent promotes itself from the Lease", "pod", target, "error", err.Error())
		}
	}
}

func (r *FailoverReconciler) clearSwitchover(ctx context.Context, c *dbv1.PostgresCluster) error {
	patch := client.MergeFrom(c.DeepCopy())
	delete(c.Annotations, dbv1.AnnotationSwitchoverTo)
	return client.IgnoreNotFound(r.client.Patch(ctx, c, patch))
}

// unfence relabels a fenced pod once its agent reports it healthy in a role: a replica
// that rejoined, or the Lease's holder serving as primary (a fence whose Lease move
// failed, from which the old primary recovered), which would otherwise leave the
// read-write Service without an endpoint.
func (r *FailoverReconciler) unfence(ctx context.Context, c *dbv1.PostgresCluster, pods []corev1.Pod, instances []Instance, holder string) error {
	for i := range pods {
		p := &pods[i]
		if p.Labels[dbv1.LabelRole] != dbv1.RoleFenced {
			continue
		}
		st := instances[i]
		if p.Name == holder {
			if st.Reachable && st.Status.Role == agentapi.RolePrimary && st.Status.Ready {
				if err := r.label(ctx, p, dbv1.RolePrimary); err != nil {
					return err
				}
				r.recorder.Eventf(c, corev1.EventTypeNormal, ReasonUnfenced, "%s serves as primary again and holds the Lease", p.Name)
			}
			continue
		}
		if st.Reachable && st.Status.Role == agentapi.RoleReplica && st.Status.Ready {
			if err := r.label(ctx, p, dbv1.RoleReplica); err != nil {
				return err
			}
			r.recorder.Eventf(c, corev1.EventTypeNormal, ReasonUnfenced, "%s rejoined as a replica", p.Name)
		}
	}
	return nil
}

func (r *FailoverReconciler) label(ctx context.Context, p *corev1.Pod, role string) error {
	if p.Labels[dbv1.LabelRole] == role {
		return nil
	}
	patch := client.MergeFrom(p.DeepCopy())
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[dbv1.LabelRole] = role
	if err := r.client.Patch(ctx, p, patch); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("labelling %s %s: %w", p.Name, role, err)
	}
	return nil
}

func (r *FailoverReconciler) remember(key types.NamespacedName) *memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.memory[key]
	if !ok {
		m = &memory{}
		r.memory[key] = m
	}
	return m
}

func (r *FailoverReconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.memory, key)
}

// SetupWithManager reconciles each cluster when it, its pods or its Lease change, and
// every PollPeriod.
func (r *FailoverReconciler) SetupWithManager(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)
	return ctrl.NewControllerManagedBy(mgr).
		Named("failover").
		For(&dbv1.PostgresCluster{}).
		Watches(&corev1.Pod{}, byLabel).
		Watches(&coordinationv1.Lease{}, byLabel).
		// Each reconcile waits up to PollPeriod for the agents: enough workers that a
		// slow cluster does not hold up the others.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(r)
}
