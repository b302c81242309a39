package rollout

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// checkPeriod is how often a rollout in progress is looked at.
const checkPeriod = 2 * time.Second

// Reconciler applies a changed instance template, one pod at a time, to at most
// maxClusters clusters at once.
type Reconciler struct {
	client   client.Client
	recorder record.EventRecorder

	mu        sync.Mutex
	admission Admission
	// held are the clusters told they wait (paused or queued), not to tell them twice.
	held map[string]string
}

// NewReconciler returns a Reconciler that rolls at most maxClusters clusters at once (0:
// no limit).
func NewReconciler(c client.Client, recorder record.EventRecorder, maxClusters int) *Reconciler {
	return &Reconciler{client: c, recorder: recorder, admission: Admission{Max: maxClusters}, held: map[string]string{}}
}

// hold tells, once, why cluster's rollout waits; "" forgets it.
func (r *Reconciler) hold(cluster *dbv1.PostgresCluster, reason, msg string) {
	key := cluster.Namespace + "/" + cluster.Name
	r.mu.Lock()
	told := r.held[key] == reason
	if reason == "" {
		delete(r.held, key)
	} else {
		r.held[key] = reason
	}
	r.mu.Unlock()
	if reason != "" && !told {
		r.recorder.Event(cluster, corev1.EventTypeNormal, reason, msg)
	}
}

// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch;patch

// Reconcile takes the next step of the cluster's rollout, if any.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if _, busy := cluster.Annotations[dbv1.AnnotationSwitchoverTo]; busy {
		return ctrl.Result{RequeueAfter: checkPeriod}, nil // a switchover is under way
	}
	var sts appsv1.StatefulSet
	if err := r.client.Get(ctx, req.NamespacedName, &sts); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var lease coordinationv1.Lease
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.PrimaryLeaseName()}, &lease); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	rec := primarylease.Parse(&lease)
	if rec.Hibernation != nil || cluster.Spec.Stopped {
		return ctrl.Result{RequeueAfter: checkPeriod}, nil // stopped on purpose: the pods start with the new template
	}
	primary := rec.Holder
	pods, err := clusterpods.List(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	var plan []Pod
	for i := range pods {
		p := &pods[i]
		ordinal, _ := strconv.Atoi(p.Name[strings.LastIndex(p.Name, "-")+1:])
		plan = append(plan, Pod{Name: p.Name, Revision: p.Labels[appsv1.ControllerRevisionHashLabelKey],
			Ready: clusterpods.IsReady(p), Terminating: !p.DeletionTimestamp.IsZero(), Ordinal: ordinal, Fenced: rec.IsFenced(p.Name)})
	}
	replicas := int(cluster.Spec.Replicas)
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	d := Decide(plan, replicas, primary, sts.Status.UpdateRevision)
	logger := log.FromContext(ctx)
	key := req.String()
	if d.Action == Done {
		r.mu.Lock()
		r.admission.Done(key)
		r.mu.Unlock()
		r.hold(&cluster, "", "")
		return ctrl.Result{}, nil
	}
	if cluster.Annotations[dbv1.AnnotationRolloutPaused] == "true" {
		r.hold(&cluster, dbv1.ReasonRolloutPaused, fmt.Sprintf("the rolling update waits: %s is \"true\"; remove it to go on", dbv1.AnnotationRolloutPaused))
		return ctrl.Result{RequeueAfter: checkPeriod}, nil
	}
	r.mu.Lock()
	admitted := r.admission.Admit(key, Begun(plan, sts.Status.UpdateRevision))
	rolling := r.admission.Rolling()
	r.mu.Unlock()
	if !admitted {
		r.hold(&cluster, dbv1.ReasonRolloutQueued, fmt.Sprintf("the rolling update waits its turn: %d clusters are rolling, at most %d at once (the controller's --max-rolling-clusters)", rolling, r.admission.Max))
		return ctrl.Result{RequeueAfter: checkPeriod}, nil
	}
	r.hold(&cluster, "", "")
	switch d.Action {
	case Done:
		return ctrl.Result{}, nil
	case Wait:
		return ctrl.Result{RequeueAfter: checkPeriod}, nil
	case DeleteReplica, DeletePrimary, HandOver:
		var acquired time.Time
		if lease.Spec.AcquireTime != nil {
			acquired = lease.Spec.AcquireTime.Time
		}
		if left := settleLeft(acquired, time.Now()); left > 0 {
			logger.V(1).Info("Rolling update waits for the routes to the old primary to go", "pod", d.Target, "for", left.String())
			return ctrl.Result{RequeueAfter: left}, nil
		}
		logger.Info("Rolling update", "reason", d.Reason)
		reason := dbv1.ReasonRestartingInstance
		if d.Action == HandOver {
			reason = dbv1.ReasonSwitchingOverForUpdate
		}
		r.recorder.Event(&cluster, corev1.EventTypeNormal, reason, d.Reason)
		if err := clusterpods.Delete(ctx, r.client, &cluster, podNamed(pods, d.Target)); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: checkPeriod}, nil
}

// podNamed is the pod of pods named name; a pod of no cluster when none is, which
// clusterpods.Delete refuses.
func podNamed(pods []corev1.Pod, name string) *corev1.Pod {
	for i := range pods {
		if pods[i].Name == name {
			return &pods[i]
		}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// SetupWithManager watches clusters, their StatefulSets and pods.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)
	return ctrl.NewControllerManagedBy(mgr).
		Named("rollout").
		For(&dbv1.PostgresCluster{}).
		Watches(&corev1.Pod{}, byLabel).
		Watches(&appsv1.StatefulSet{}, byLabel).
		Complete(r)
}
