// Package status writes the controller's part of a PostgresCluster's status: phase,
// currentPrimary, readyInstances, instances, roles, databases, operatorVersion and its
// conditions. It is the only writer of
// those fields, and writes them back whenever the Helm manager's status write drops them.
package status

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/claims"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/rolestatus"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// Reconciler writes the observed state of a cluster into its status.
type Reconciler struct {
	client client.Client
	// reader reads uncached: the cluster right before a status write, and Secrets
	// missing from the cache (which holds only Secrets labelled with a cluster).
	reader client.Reader
	clock  clock.PassiveClock
	// roles are the roles controller's outcomes; nil when it does not run.
	roles *rolestatus.Store
	// operatorVersion is this operator's version, written to status.operatorVersion.
	operatorVersion string
	// monitoring says whether the Prometheus Operator's kinds are served; nil leaves
	// the MonitoringReady condition alone.
	monitoring MonitoringAPIs
	// recorder, when set, tells each instance's problem as an event when it changes.
	recorder record.EventRecorder
}

// WithRecorder has r tell, as events, when an instance stops or starts running.
func (r *Reconciler) WithRecorder(rec record.EventRecorder) *Reconciler {
	r.recorder = rec
	return r
}

// WithMonitoringAPIs has r report whether spec.monitoring.enabled can be served.
func (r *Reconciler) WithMonitoringAPIs(m MonitoringAPIs) *Reconciler {
	r.monitoring = m
	return r
}

// NewReconciler returns a Reconciler; rolesStore may be nil. operatorVersion
// is this operator's version (internal/version.Version).
func NewReconciler(c client.Client, reader client.Reader, clk clock.PassiveClock, rolesStore *rolestatus.Store, operatorVersion string) *Reconciler {
	return &Reconciler{client: c, reader: reader, clock: clk, roles: rolesStore, operatorVersion: operatorVersion}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters/status,verbs=get;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=db.example.com,resources=postgresbackups,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=list;create;patch

// Reconcile observes, decides and writes the status once, only when it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	obs, err := r.observe(ctx, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	// A pod's problem is told once it lasted problemGrace: while one is not ready, look
	// again then.
	var result ctrl.Result
	for i := range obs.Pods {
		if !clusterpods.IsReady(&obs.Pods[i]) {
			result.RequeueAfter = problemGrace
		}
	}
	if equality.Semantic.DeepEqual(Decide(obs, metav1.NewTime(r.clock.Now())), cluster.Status) {
		return result, nil
	}
	// Write against the newest cluster: the cache may not have seen the Helm manager's
	// latest status write yet, and its conditions must be kept.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var latest dbv1.PostgresCluster
		if err := r.reader.Get(ctx, req.NamespacedName, &latest); err != nil {
			return err
		}
		obs.Cluster = &latest
		want := Decide(obs, metav1.NewTime(r.clock.Now()))
		if equality.Semantic.DeepEqual(want, latest.Status) {
			return nil
		}
		before := latest.Status.Instances
		latest.Status = want
		if err := r.client.Status().Update(ctx, &latest); err != nil {
			return err
		}
		if r.recorder != nil {
			for _, e := range InstanceEvents(before, want.Instances) {
				r.recorder.Event(&latest, e.Type, e.Reason, e.Message)
			}
		}
		return nil
	})
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return result, nil
}

func (r *Reconciler) observe(ctx context.Context, c *dbv1.PostgresCluster) (Observed, error) {
	obs := Observed{Cluster: c, OperatorVersion: r.operatorVersion}
	if r.monitoring != nil && c.Spec.Monitoring.Enabled {
		served, err := r.monitoring.Served(ctx)
		if err != nil {
			return obs, err
		}
		obs.MonitoringAPIs = served
	}
	if r.roles != nil {
		if o, ok := r.roles.Get(client.ObjectKeyFromObject(c)); ok {
			obs.Roles = &o
		}
	}
	pods, err := clusterpods.List(ctx, r.client, c)
	if err != nil {
		return obs, err
	}
	obs.Pods = pods
	if obs.Claims, err = claims.InstanceClaims(ctx, r.client, c); err != nil {
		return obs, err
	}

	var lease coordinationv1.Lease
	err = r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.PrimaryLeaseName()}, &lease)
	switch {
	case err == nil:
		rec := primarylease.Parse(&lease)
		obs.Primary = rec.Holder
		if h := rec.Hibernation; h != nil && h.Holder == rec.Holder && h.Term == rec.Term {
			obs.Hibernation = h
		}
	case !apierrors.IsNotFound(err):
		return obs, err
	}

	if c.Spec.Pooler != nil {
		var d appsv1.Deployment
		err := r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Names().PoolerReadWrite()}, &d)
		switch {
		case err == nil:
			obs.Pooler = &d
		case !apierrors.IsNotFound(err):
			return obs, err
		}
	}

	rep, err := report.Read(ctx, r.client, c)
	if err != nil {
		return obs, err
	}
	obs.Streaming, obs.FailoverBlocked, obs.LastFailover = rep.Streaming, rep.FailoverBlocked, rep.LastFailover
	obs.DataGuard, obs.DataVersion, obs.PendingRestart = rep.DataGuard, rep.DataVersion, rep.PendingRestart
	obs.Upgrade, obs.BackupVerification, obs.Replica = rep.Upgrade, rep.BackupVerification, rep.Replica
	obs.Agents = rep.AgentErrors.Messages()
	obs.Health = rep.Health
	if int32(len(pods)) < c.Spec.Replicas && !c.Spec.Stopped {
		if obs.CreateFailure, err = r.createFailure(ctx, c); err != nil {
			return obs, err
		}
	}
	if a := rep.Archiving; a != nil {
		obs.Archiving = &ArchivingHealth{OK: a.OK, Message: a.Message}
	}

	var backups dbv1.PostgresBackupList
	if err := r.client.List(ctx, &backups, client.InNamespace(c.Namespace), client.MatchingLabels{dbv1.LabelCluster: c.Name}); err != nil {
		return obs, err
	}
	var newest time.Time
	for _, b := range backups.Items {
		if b.Status.Phase == dbv1.BackupCompleted && b.Status.StoppedAt != nil && b.Status.StoppedAt.After(newest) {
			obs.LastBackup, newest = b.Name, b.Status.StoppedAt.Time
		}
	}

	for _, want := range secrets.Wanted(c) {
		var s corev1.Secret
		key := client.ObjectKey{Namespace: c.Namespace, Name: want.Name}
		err := r.client.Get(ctx, key, &s)
		if apierrors.IsNotFound(err) {
			err = r.reader.Get(ctx, key, &s)
		}
		switch {
		case apierrors.IsNotFound(err):
			obs.CredentialProblems = append(obs.CredentialProblems, fmt.Sprintf("Secret %s does not exist yet", want.Name))
		case err != nil:
			return obs, err
		default:
			if p := secrets.Problem(&s); p != "" {
				obs.CredentialProblems = append(obs.CredentialProblems, p)
			}
		}
	}
	return obs, nil
}

// createFailureAge bounds how old a FailedCreate event may be to still explain a
// missing pod: the StatefulSet controller tries again with a back-off, and a newer
// attempt that failed for the same reason is a newer event (or a newer count of it).
const createFailureAge = 10 * time.Minute

// createFailure is the message of the newest recent FailedCreate event of the
// cluster's StatefulSet, "" when there is none: the StatefulSet controller says why it
// cannot create a pod (a quota, an admission webhook, the pod security admission, an
// invalid pod) only in that event.
func (r *Reconciler) createFailure(ctx context.Context, c *dbv1.PostgresCluster) (string, error) {
	var events corev1.EventList
	if err := r.reader.List(ctx, &events, client.InNamespace(c.Namespace), client.MatchingFields{
		"involvedObject.kind": "StatefulSet", "involvedObject.name": c.Names().StatefulSet(), "reason": "FailedCreate",
	}); err != nil {
		return "", fmt.Errorf("reading the StatefulSet's events: %w", err)
	}
	var newest time.Time
	msg := ""
	for _, e := range events.Items {
		at := e.LastTimestamp.Time
		if e.Series != nil && e.Series.LastObservedTime.After(at) {
			at = e.Series.LastObservedTime.Time
		}
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if at.After(newest) && r.clock.Since(at) < createFailureAge {
			newest, msg = at, e.Message
		}
	}
	return msg, nil
}

// SetupWithManager watches clusters (status writes included, to restore the fields a
// Helm status write drops), and the pods, Leases and Secrets labelled with a cluster.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)
	b := ctrl.NewControllerManagedBy(mgr).
		Named("status").
		For(&dbv1.PostgresCluster{}).
		Watches(&corev1.Pod{}, byLabel).
		// Not at a renewal, which changes nothing the status shows: a primary renews
		// every second, and each renewal made a reconcile of its cluster (1,000 a
		// second at 1,000 clusters).
		Watches(&coordinationv1.Lease{}, byLabel, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, okO := e.ObjectOld.(*coordinationv1.Lease)
				n, okN := e.ObjectNew.(*coordinationv1.Lease)
				return !okO || !okN || !primarylease.OnlyRenewed(o, n)
			},
		})).
		Watches(&corev1.ConfigMap{}, byLabel).
		Watches(&corev1.Secret{}, byLabel).
		Watches(&dbv1.PostgresBackup{}, byLabel).
		Watches(&corev1.PersistentVolumeClaim{}, byLabel).
		Watches(&appsv1.Deployment{}, byLabel).
		// Clusters are independent: one worker left 1,000 new clusters' status
		// minutes behind.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4})
	if r.roles != nil {
		b = b.WatchesRawSource(source.Channel(r.roles.Changes(), &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}
