// Package primary keeps the record of who is primary: the per-cluster Lease, created
// naming the first instance, and the role label of every instance pod, derived from it.
package primary

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/controller/clusterpods"
)

// PrimaryReconciler creates a cluster's primary Lease and labels its pods by role.
type PrimaryReconciler struct {
	client   client.Client
	recorder record.EventRecorder
	clock    clock.PassiveClock
}

// NewPrimaryReconciler returns a PrimaryReconciler.
func NewPrimaryReconciler(c client.Client, recorder record.EventRecorder, clk clock.PassiveClock) *PrimaryReconciler {
	return &PrimaryReconciler{client: c, recorder: recorder, clock: clk}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile makes sure the Lease exists and every pod's role label agrees with it.
func (r *PrimaryReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	lease, err := r.ensureLease(ctx, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	pods, err := clusterpods.List(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.markBootstrapped(ctx, lease, pods, holder); err != nil {
		return ctrl.Result{}, err
	}
	for i := range pods {
		pod := &pods[i]
		role, ok := Role(pod, holder)
		if !ok {
			continue
		}
		patch := client.MergeFrom(pod.DeepCopy())
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[dbv1.LabelRole] = role
		if err := r.client.Patch(ctx, pod, patch); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return ctrl.Result{}, fmt.Errorf("labelling pod %s %s: %w", pod.Name, role, err)
		}
		log.FromContext(ctx).Info("Labelled pod", "pod", pod.Name, "role", role)
	}
	return ctrl.Result{}, nil
}

// Role is the role label pod should carry when holder is the primary, and whether the
// label must change. A pod labelled primary that no longer holds the Lease is a former
// primary and becomes fenced, never replica: until its agent has rewound it, it may
// still accept writes. A fenced pod keeps its label; only the failover controller
// removes a fence, once the agent reports the pod rejoined.
func Role(pod *corev1.Pod, holder string) (string, bool) {
	current := pod.Labels[dbv1.LabelRole]
	want := dbv1.RoleReplica
	switch {
	case pod.Name == holder:
		want = dbv1.RolePrimary
	case current == dbv1.RoleFenced:
		return current, false
	case current == dbv1.RolePrimary:
		want = dbv1.RoleFenced
	}
	return want, current != want
}

// ensureLease returns the primary's pod name, creating the Lease with the first
// instance as holder when the cluster has none yet.
//
// The Lease has no owner reference on purpose: like the volumes, it outlives the
// cluster, so a cluster created again on the kept volumes resumes with the instance
// that had the newest data as primary rather than with whichever is first.
func (r *PrimaryReconciler) ensureLease(ctx context.Context, c *dbv1.PostgresCluster) (*coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.PrimaryLeaseName()}, &lease)
	if err == nil {
		return &lease, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	holder := c.InstanceName(0)
	now := metav1.NewMicroTime(r.clock.Now())
	lease = coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      c.PrimaryLeaseName(),
			Namespace: c.Namespace,
			Labels:    map[string]string{dbv1.LabelCluster: c.Name},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &holder,
			AcquireTime:    &now,
			RenewTime:      &now,
		},
	}
	if err := r.client.Create(ctx, &lease); err != nil {
		return nil, fmt.Errorf("creating Lease %s: %w", lease.Name, err)
	}
	log.FromContext(ctx).Info("Designated the first primary", "lease", lease.Name, "primary", holder)
	r.recorder.Eventf(c, corev1.EventTypeNormal, dbv1.ReasonPrimaryDesignated,
		"Designated %s as the first primary (Lease %s)", holder, lease.Name)
	return &lease, nil
}

// markBootstrapped annotates the Lease once its holder is Ready for the first time: from
// then on an agent whose volume is empty must not initialise a new database, even when
// the Lease names it.
func (r *PrimaryReconciler) markBootstrapped(ctx context.Context, lease *coordinationv1.Lease, pods []corev1.Pod, holder string) error {
	if lease.Annotations[dbv1.AnnotationBootstrapped] == "true" {
		return nil
	}
	for i := range pods {
		if pods[i].Name != holder || !clusterpods.IsReady(&pods[i]) {
			continue
		}
		patch := client.MergeFrom(lease.DeepCopy())
		metav1.SetMetaDataAnnotation(&lease.ObjectMeta, dbv1.AnnotationBootstrapped, "true")
		if err := r.client.Patch(ctx, lease, patch); err != nil {
			return fmt.Errorf("marking Lease %s bootstrapped: %w", lease.Name, err)
		}
		log.FromContext(ctx).Info("Marked the cluster bootstrapped", "lease", lease.Name, "primary", holder)
	}
	return nil
}

// SetupWithManager watches clusters, their Leases and their pods.
func (r *PrimaryReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("primary").
		For(&dbv1.PostgresCluster{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Complete(r)
}
