package restart

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

const (
	// busyPeriod is how often a cluster with settings waiting for a restart is looked at.
	busyPeriod = 2 * time.Second
	// idlePeriod is how often the agents are asked whether a setting waits while the
	// cluster's ConfigMap changed less than changeWindow ago: a changed ConfigMap
	// reaches the pods by the kubelet (within its sync period, a minute by default),
	// which nothing here can watch. quietPeriod is how often otherwise: a setting can
	// also come to wait without a change of the ConfigMap (ALTER SYSTEM by a
	// superuser), and an operator restarted asks every cluster at once. Asking every
	// cluster's agents every 10 s was 300 calls a second at 1,000 clusters.
	idlePeriod   = 10 * time.Second
	quietPeriod  = time.Minute
	changeWindow = 3 * time.Minute
	// statusTimeout bounds each agent's answer.
	statusTimeout = 2 * time.Second
)

// Record is what waits for a restart, kept in the cluster's report for the status
// controller's PendingRestart condition.
type Record = report.PendingRestart

// RecordOf is what d says for the record, with what each instance in waits for.
// RecordOf is what d says for the record, with what each instance in waits for and
// what it cannot use.
func RecordOf(d Decision, in []Instance) Record {
	r := Record{Message: "No setting waits for a restart"}
	if d.Action != Done {
		r = Record{Pending: true, Blocked: d.Action == Blocked, Message: d.Pending + "; " + d.Reason, Instances: map[string][]string{}}
		for _, i := range in {
			for _, p := range i.Status.PendingRestart {
				r.Instances[i.Name] = append(r.Instances[i.Name], fmt.Sprintf("%s: %s → %s", p.Name, p.Value, p.Pending))
			}
		}
	}
	for _, i := range in {
		if i.Reachable && i.Status.ConfigRejected != "" {
			if r.Rejected == nil {
				r.Rejected = map[string]string{}
			}
			r.Rejected[i.Name] = i.Status.ConfigRejected
		}
	}
	return r
}

// Reconciler restarts instances whose settings wait for a restart.
type Reconciler struct {
	client   client.Client
	recorder record.EventRecorder
	fleet    *fleet.Fleet

	mu sync.Mutex
	// changed is when each cluster's ConfigMap last changed, as this process saw it.
	changed map[types.NamespacedName]time.Time
	// switchovers are the switchovers decided and not yet asked for, and since when
	// (confirmedSwitchover).
	switchovers map[types.NamespacedName]decided
}

// decided is a switchover's target and when it was first decided.
type decided struct {
	target string
	at     time.Time
}

// switchoverConfirm is how long a switchover must stay the decision, every cycle,
// before it is asked for. It rests on the standbys' empty lists of settings waiting
// for a restart, and a list read a moment after the agent wrote postgresql.conf and
// signalled postgres can be empty because postgres has not read the file yet: the
// controller then switched over to a standby that had not restarted, and back.
const switchoverConfirm = 3 * time.Second

// confirmedSwitchover says whether the switchover to target, decided now for key, has
// been the decision for switchoverConfirm; forgetSwitchover drops it when any other
// decision is made.
func (r *Reconciler) confirmedSwitchover(key types.NamespacedName, target string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.switchovers[key]
	if !ok || d.target != target {
		r.switchovers[key] = decided{target: target, at: now}
		return false
	}
	if now.Sub(d.at) < switchoverConfirm {
		return false
	}
	delete(r.switchovers, key)
	return true
}

func (r *Reconciler) forgetSwitchover(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.switchovers, key)
}

// NewReconciler returns a Reconciler; agentURL nil means
// https://<pod IP>:8008.
func NewReconciler(c client.Client, recorder record.EventRecorder, agentURL func(*corev1.Pod) string) *Reconciler {
	return &Reconciler{client: c, recorder: recorder, fleet: fleet.New(c, agentURL), changed: map[types.NamespacedName]time.Time{},
		switchovers: map[types.NamespacedName]decided{}}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile observes the agents, records what waits for a restart, and takes the next
// step of applying it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	store := primarylease.ClientStore{Reader: r.client, Writer: r.client, Namespace: cluster.Namespace, Name: cluster.PrimaryLeaseName()}
	lease, err := store.Get(ctx)
	if err != nil {
		return ctrl.Result{RequeueAfter: idlePeriod}, client.IgnoreNotFound(err)
	}
	access, err := r.fleet.Access(ctx, &cluster)
	if err != nil {
		return ctrl.Result{RequeueAfter: idlePeriod}, client.IgnoreNotFound(err)
	}
	if rec := primarylease.Parse(lease); rec.Hibernation != nil || cluster.Spec.Stopped {
		return ctrl.Result{RequeueAfter: idlePeriod}, nil // stopped on purpose: settings apply at the start
	}
	in, pods, err := r.observe(ctx, &cluster, lease, access)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := Decide(in)
	if err := r.record(ctx, &cluster, RecordOf(d, in.Instances)); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.act(ctx, &cluster, d, pods, access); err != nil {
		return ctrl.Result{}, err
	}
	if d.Action == Done {
		return ctrl.Result{RequeueAfter: r.idle(req.NamespacedName)}, nil
	}
	return ctrl.Result{RequeueAfter: busyPeriod}, nil
}

// idle is when to ask a cluster with nothing waiting again: idlePeriod within
// changeWindow of a change of its ConfigMap, quietPeriod otherwise.
func (r *Reconciler) idle(key types.NamespacedName) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.changed[key]
	if ok && time.Since(at) < changeWindow {
		return idlePeriod
	}
	delete(r.changed, key)
	return quietPeriod
}

// configChanges notes when a cluster's ConfigMap is made or changed, and reconciles it.
func (r *Reconciler) configChanges() handler.EventHandler {
	note := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		cluster := o.GetLabels()[dbv1.LabelCluster]
		if cluster == "" || o.GetName() != dbv1.NamesOf(cluster).ConfigMap() {
			return
		}
		key := types.NamespacedName{Namespace: o.GetNamespace(), Name: cluster}
		r.mu.Lock()
		r.changed[key] = time.Now()
		r.mu.Unlock()
		q.Add(reconcile.Request{NamespacedName: key})
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			note(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			note(e.ObjectNew, q)
		},
	}
}

// observe asks every instance's agent for its status and reads what else Plan needs.
func (r *Reconciler) observe(ctx context.Context, c *dbv1.PostgresCluster, lease *coordinationv1.Lease, access fleet.Access) (Input, []corev1.Pod, error) {
	pods, err := clusterpods.List(ctx, r.client, c)
	if err != nil {
		return Input{}, nil, err
	}
	var sts appsv1.StatefulSet
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(c), &sts); err != nil && !apierrors.IsNotFound(err) {
		return Input{}, nil, err
	}
	replicas := int(c.Spec.Replicas)
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	rec := primarylease.Parse(lease)
	in := Input{Replicas: replicas, Primary: rec.Holder, Switchover: c.Annotations[dbv1.AnnotationSwitchoverTo], Fenced: rec.Fenced}
	for _, o := range r.fleet.Observe(ctx, pods, access, statusTimeout) {
		ordinal, _ := c.Names().Ordinal(o.Name)
		rev := sts.Status.UpdateRevision
		in.Instances = append(in.Instances, Instance{Name: o.Name, Ordinal: ordinal, Reachable: o.Reachable, Status: o.Status,
			Terminating: o.Terminating, Outdated: rev != "" && o.Pod.Labels[appsv1.ControllerRevisionHashLabelKey] != rev})
	}
	return in, pods, nil
}

// record writes what waits for a restart into the cluster's report when it changed,
// then the events of the change.
func (r *Reconciler) record(ctx context.Context, c *dbv1.PostgresCluster, next Record) error {
	old, err := report.Read(ctx, r.client, c)
	if err != nil {
		return err
	}
	if old.PendingRestart != nil && equality.Semantic.DeepEqual(*old.PendingRestart, next) {
		return nil
	}
	if err := report.Write(ctx, r.client, c, report.KeyPendingRestart, &next); err != nil {
		return client.IgnoreNotFound(err)
	}
	var was Record
	if old.PendingRestart != nil {
		was = *old.PendingRestart
	}
	switch {
	case len(next.Rejected) > 0 && !maps.Equal(next.Rejected, was.Rejected):
		r.recorder.Event(c, corev1.EventTypeWarning, dbv1.ReasonParametersRejected, next.RejectedMessage())
	case len(was.Rejected) > 0 && len(next.Rejected) == 0:
		r.recorder.Event(c, corev1.EventTypeNormal, dbv1.ReasonParametersApplied, "Every instance can use the settings of spec.postgresql.parameters again")
	}
	switch {
	case was.Pending && !next.Pending:
		r.recorder.Event(c, corev1.EventTypeNormal, dbv1.ReasonPendingRestartApplied, "Every instance runs with its configured settings: none waits for a restart")
	case next.Blocked && !was.Blocked:
		r.recorder.Event(c, corev1.EventTypeWarning, dbv1.ReasonRestartBlocked, next.Message)
	}
	return nil
}

// act carries out d.
func (r *Reconciler) act(ctx context.Context, c *dbv1.PostgresCluster, d Decision, pods []corev1.Pod, access fleet.Access) error {
	logger := log.FromContext(ctx)
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
	if d.Action != Switchover {
		r.forgetSwitchover(key)
	}
	switch d.Action {
	case RestartStandby, RestartPrimary:
		pod := podNamed(pods, d.Target)
		if pod == nil {
			return nil
		}
		logger.Info("Restarting an instance to apply settings", "pod", d.Target, "reason", d.Reason, "pending", d.Pending)
		r.recorder.Event(c, corev1.EventTypeNormal, dbv1.ReasonRestartingInstance, d.Reason)
		if _, err := r.fleet.Client(pod, access).Restart(ctx); err != nil {
			if errors.Is(err, agentapi.ErrConflict) {
				logger.Info("The agent refused the restart; trying again later", "pod", d.Target, "error", err.Error())
				return nil
			}
			return fmt.Errorf("restarting %s: %w", d.Target, err)
		}
	case Switchover:
		if !r.confirmedSwitchover(key, d.Target, time.Now()) {
			logger.V(1).Info("Switchover to apply settings decided; asked for once it stays the decision", "to", d.Target, "for", switchoverConfirm.String())
			return nil
		}
		logger.Info("Switching over to apply settings", "to", d.Target, "reason", d.Reason)
		r.recorder.Event(c, corev1.EventTypeNormal, dbv1.ReasonSwitchingOverForRestart, d.Reason)
		return switchover.Request(ctx, r.client, c, d.Target)
	}
	return nil
}

func podNamed(pods []corev1.Pod, name string) *corev1.Pod {
	for i := range pods {
		if pods[i].Name == name {
			return &pods[i]
		}
	}
	return nil
}

// SetupWithManager watches clusters, their pods and their ConfigMaps.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("restart").
		For(&dbv1.PostgresCluster{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Watches(&corev1.ConfigMap{}, r.configChanges()).
		// Clusters are independent, and each reconcile waits for the agents.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}
