// Package controller assembles the controller process: the operator's controllers that
// do what the chart cannot express (failover, switchover, rolling updates, backups,
// credentials, roles, storage, status). Each is a package under this one, and none
// imports another: what they share is in internal/protocol and the operator's libraries.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/controller/backup"
	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/operator/controller/credentials"
	"github.com/pgpilot/pgpilot/internal/operator/controller/failover"
	"github.com/pgpilot/pgpilot/internal/operator/controller/restart"
	"github.com/pgpilot/pgpilot/internal/operator/controller/roles"
	"github.com/pgpilot/pgpilot/internal/operator/controller/rollout"
	"github.com/pgpilot/pgpilot/internal/operator/controller/status"
	"github.com/pgpilot/pgpilot/internal/operator/controller/storage"
	"github.com/pgpilot/pgpilot/internal/operator/opmetrics"
	"github.com/pgpilot/pgpilot/internal/operator/rolestatus"
	"github.com/pgpilot/pgpilot/internal/version"
)

// watched are the kinds the controllers watch.
var watched = []client.Object{
	&dbv1.PostgresCluster{}, &dbv1.PostgresBackup{}, &corev1.Pod{}, &corev1.Secret{}, &corev1.ConfigMap{},
	&coordinationv1.Lease{}, &appsv1.StatefulSet{}, &corev1.PersistentVolumeClaim{}, &appsv1.Deployment{},
	&batchv1.Job{},
}

// warmCaches starts the informers of every watched kind in every replica, the standbys'
// included: controller-runtime starts a controller's informers only when it is elected,
// so a standby that took over would first list every pod, Secret and Lease of every
// cluster (seconds at a thousand clusters) before its first failover. The replica is
// ready once they have synced, so a rolling update of the operator does not stop the
// old leader before its successor has them (docs/failover.md, "The operator's own
// availability").
type warmCaches struct {
	cache  cache.Cache
	synced *atomic.Bool
}

// NeedLeaderElection is false: the caches are warmed in standby replicas too.
func (*warmCaches) NeedLeaderElection() bool { return false }

// Start returns once every watched kind's informer has synced.
func (w *warmCaches) Start(ctx context.Context) error {
	for _, o := range watched {
		if _, err := w.cache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("starting the informer of %T: %w", o, err)
		}
	}
	w.synced.Store(true)
	return nil
}

// check is the readiness check: an error until every watched kind has synced.
func (w *warmCaches) check(*http.Request) error {
	if !w.synced.Load() {
		return errors.New("the caches of the watched kinds have not synced yet")
	}
	return nil
}

// EventSource is the component name on the controller's events.
const EventSource = "pgpilot-controller"

// Scheme returns a scheme with the Kubernetes types and pgpilot's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := dbv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// CacheOptions keeps only pgpilot's Pods, Secrets, ConfigMaps, Leases, StatefulSets,
// volume claims and Deployments (the pooler's) in the cache (those labelled with a cluster), not every one in the
// cluster, and none with its managed fields, which no controller reads (a pod's are a
// third of it).
func CacheOptions() cache.Options {
	req, err := labels.NewRequirement(dbv1.LabelCluster, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant label key cannot be invalid
	}
	selector := labels.NewSelector().Add(*req)
	labelled := cache.ByObject{Label: selector}
	return cache.Options{DefaultTransform: cache.TransformStripManagedFields(), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Label: selector, Transform: slimPod},
		&corev1.Secret{}:                labelled,
		&corev1.ConfigMap{}:             labelled,
		&coordinationv1.Lease{}:         labelled,
		&appsv1.StatefulSet{}:           {Label: selector, Transform: slimStatefulSet},
		&corev1.PersistentVolumeClaim{}: labelled,
		&appsv1.Deployment{}:            labelled,
		&batchv1.Job{}:                  labelled,
	}}
}

// slimPod keeps of a pod what the controllers read: its metadata, its status, its
// node, and its containers' names, images and resources (the status controller says
// which memory limit a container was killed at). The rest of the spec (environment,
// volumes, probes, security context) was most of each cached pod. No controller
// updates a pod from the cache: labels are merge-patched.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, 0, len(cs))
		for _, c := range cs {
			out = append(out, corev1.Container{Name: c.Name, Image: c.Image, Resources: c.Resources})
		}
		return out
	}
	p.ManagedFields = nil
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, Containers: slim(p.Spec.Containers), InitContainers: slim(p.Spec.InitContainers)}
	return p, nil
}

// slimStatefulSet keeps of a StatefulSet what the controllers read: its metadata, its
// replicas and its status (the revision its pods should run). Its pod and claim
// templates are the Helm manager's.
func slimStatefulSet(obj any) (any, error) {
	s, ok := obj.(*appsv1.StatefulSet)
	if !ok {
		return obj, nil
	}
	s.ManagedFields = nil
	s.Spec = appsv1.StatefulSetSpec{Replicas: s.Spec.Replicas, Selector: s.Spec.Selector, ServiceName: s.Spec.ServiceName}
	return s, nil
}

// Options are the controllers' settings from the command line.
type Options struct {
	// MaxRollingClusters is the most clusters whose pods are restarted for a new
	// template at once (0: no limit).
	MaxRollingClusters int
	// Warm, when set, is set once every watched kind's informer has synced (the
	// readiness check "caches"): leader election waits for it (cmd/controller).
	Warm *atomic.Bool
}

// DefaultMaxRollingClusters is MaxRollingClusters' default: a new agent image after an
// operator upgrade rolls every cluster, a few at a time.
const DefaultMaxRollingClusters = 3

// Setup adds the controller's controllers to mgr.
func Setup(mgr ctrl.Manager, clk clock.PassiveClock, opts Options) error {
	if err := clusterpods.Index(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := roles.Index(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	warm := &warmCaches{cache: mgr.GetCache(), synced: opts.Warm}
	if warm.synced == nil {
		warm.synced = new(atomic.Bool)
	}
	if err := mgr.Add(warm); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("caches", warm.check); err != nil {
		return err
	}
	recorder := mgr.GetEventRecorderFor(EventSource)
	if err := credentials.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetScheme(), recorder, nil).
		SetupWithManager(mgr); err != nil {
		return err
	}
	if err := certificates.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetScheme(), recorder, clk).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := failover.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), recorder, clk, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := backup.NewReconciler(mgr.GetClient(), recorder, clk, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := backup.NewScheduleReconciler(mgr.GetClient(), recorder, clk, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := backup.NewVerificationReconciler(mgr.GetClient(), mgr.GetAPIReader(), recorder).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := rollout.NewReconciler(mgr.GetClient(), recorder, opts.MaxRollingClusters).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := restart.NewReconciler(mgr.GetClient(), recorder, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := storage.NewReconciler(mgr.GetClient(), recorder, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	// The operator's own series, served with controller-runtime's reconcile metrics.
	opmetrics.Register(metrics.Registry, mgr.GetClient(), mgr.Elected(), mgr.GetLogger().WithName("metrics"))
	store := rolestatus.NewStore()
	if err := roles.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), recorder, store, nil).SetupWithManager(mgr); err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	return status.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clk, store, version.Version).
		WithMonitoringAPIs(&status.DiscoveryMonitoringAPIs{Client: disco, Now: clk.Now}).
		WithRecorder(recorder).
		SetupWithManager(mgr)
}
