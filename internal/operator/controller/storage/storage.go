package storage

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/claims"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
)

// Periods of the storage controller.
const (
	// ResizePeriod is how often an expansion under way is looked at.
	ResizePeriod = 15 * time.Second
	// UsagePeriod is how often the agents are asked how full the volumes are, with
	// autoGrow.
	UsagePeriod = 30 * time.Second
)

// Reconciler expands the instances' volume claims.
type Reconciler struct {
	client   client.Client
	recorder record.EventRecorder
	fleet    *fleet.Fleet
	mu       sync.Mutex
	// refused is the last refusal reported per claim, so that each is an event once.
	refused map[types.NamespacedName]string
}

// NewReconciler returns a Reconciler; agentURL is nil but in tests (fleet.New).
func NewReconciler(c client.Client, recorder record.EventRecorder, agentURL func(*corev1.Pod) string) *Reconciler {
	return &Reconciler{client: c, recorder: recorder, fleet: fleet.New(c, agentURL), refused: map[types.NamespacedName]string{}}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile expands every claim of the cluster's instances that requests less than the
// cluster wants, and grows them all when autoGrow says so.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	pvcs, err := claims.InstanceClaims(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	have := make([]claims.Claim, len(pvcs))
	for i := range pvcs {
		have[i] = claims.ClaimOf(&pvcs[i])
	}
	want := claims.Want(cluster.Spec.Storage, have)
	if cluster.Spec.Storage.AutoGrow != nil {
		grow := AutoGrow(cluster.Spec.Storage, want, have, r.usage(ctx, &cluster))
		switch {
		case !grow.Size.IsZero():
			log.FromContext(ctx).Info("Growing the volumes", "reason", grow.Reason)
			r.recorder.Event(&cluster, corev1.EventTypeNormal, dbv1.ReasonVolumeAutoGrown, grow.Reason)
			want = grow.Size
		case grow.AtMax:
			r.once(&cluster, types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name + "/max"}, dbv1.ReasonVolumeAtMaxSize, grow.Reason)
		}
	}
	resizing := false
	for i := range pvcs {
		pvc := &pvcs[i]
		if have[i].Capacity.Cmp(have[i].Requested) < 0 {
			resizing = true
		}
		if have[i].Requested.Cmp(want) >= 0 {
			continue
		}
		resizing = true
		if err := r.expand(ctx, &cluster, pvc, want); err != nil {
			return ctrl.Result{}, err
		}
	}
	switch {
	case resizing:
		return ctrl.Result{RequeueAfter: ResizePeriod}, nil
	case cluster.Spec.Storage.AutoGrow != nil:
		return ctrl.Result{RequeueAfter: UsagePeriod}, nil
	}
	return ctrl.Result{}, nil
}

// expand has pvc request size. A refusal by the API server (a StorageClass that does
// not allow expansion, a claim not bound) is said once in an event and is not an
// error: the StorageResized condition shows it until the spec or the class changes.
func (r *Reconciler) expand(ctx context.Context, cluster *dbv1.PostgresCluster, pvc *corev1.PersistentVolumeClaim, size resource.Quantity) error {
	if pvc.Namespace != cluster.Namespace || pvc.Labels[dbv1.LabelCluster] != cluster.Name {
		return fmt.Errorf("claim %s/%s is not labelled with cluster %s: refusing to change it", pvc.Namespace, pvc.Name, cluster.Name)
	}
	from := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if pvc.Spec.Resources.Requests == nil {
		pvc.Spec.Resources.Requests = corev1.ResourceList{}
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = size
	key := client.ObjectKeyFromObject(pvc)
	if err := r.client.Patch(ctx, pvc, patch); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			r.once(cluster, key, dbv1.ReasonVolumeExpansionRefused,
				fmt.Sprintf("Expanding %s from %s to %s was refused: %v", pvc.Name, from.String(), size.String(), err))
			return nil
		}
		return fmt.Errorf("expanding %s to %s: %w", pvc.Name, size.String(), err)
	}
	r.mu.Lock()
	delete(r.refused, key)
	r.mu.Unlock()
	log.FromContext(ctx).Info("Expanding a volume", "claim", pvc.Name, "from", from.String(), "to", size.String())
	r.recorder.Eventf(cluster, corev1.EventTypeNormal, dbv1.ReasonVolumeExpanding, "Expanding %s from %s to %s", pvc.Name, from.String(), size.String())
	return nil
}

// once records a Warning event for key unless the same message was the last one.
func (r *Reconciler) once(cluster *dbv1.PostgresCluster, key types.NamespacedName, reason, msg string) {
	r.mu.Lock()
	same := r.refused[key] == msg
	r.refused[key] = msg
	r.mu.Unlock()
	if !same {
		r.recorder.Event(cluster, corev1.EventTypeWarning, reason, msg)
	}
}

// usage asks every ready instance's agent how full its volume is; an agent that does
// not answer is left out.
func (r *Reconciler) usage(ctx context.Context, cluster *dbv1.PostgresCluster) []Usage {
	access, err := r.fleet.Access(ctx, cluster)
	if err != nil {
		return nil
	}
	pods, err := clusterpods.List(ctx, r.client, cluster)
	if err != nil {
		return nil
	}
	var out []Usage
	for _, i := range r.fleet.Observe(ctx, pods, access, 5*time.Second) {
		if i.Reachable {
			out = append(out, Usage{Instance: i.Name, Bytes: i.Status.VolumeBytes, FreeBytes: i.Status.VolumeFreeBytes})
		}
	}
	return out
}

// SetupWithManager watches clusters, their StatefulSets and their claims.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)
	return ctrl.NewControllerManagedBy(mgr).
		Named("storage").
		For(&dbv1.PostgresCluster{}).
		Watches(&appsv1.StatefulSet{}, byLabel).
		Watches(&corev1.PersistentVolumeClaim{}, byLabel).
		Complete(r)
}
