package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/dustin/go-humanize"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// PollPeriod is how often a running backup's agent is asked how it goes.
const PollPeriod = 2 * time.Second

// agents reaches the agents of a cluster's pods.
type agents struct {
	client client.Client
	fleet  *fleet.Fleet
}

func newAgents(c client.Client, agentURL func(*corev1.Pod) string) agents {
	return agents{client: c, fleet: fleet.New(c, agentURL)}
}

func (a agents) access(ctx context.Context, c *dbv1.PostgresCluster) (fleet.Access, error) {
	return a.fleet.Access(ctx, c)
}

// instance is a pod and what its agent said (the zero Status when it did not answer or
// the pod is being deleted).
type instance struct {
	pod    *corev1.Pod
	status agentapi.Status
	client *agentapi.Client
}

// observe asks every running pod's agent for its status, all at once.
func (a agents) observe(ctx context.Context, pods []corev1.Pod, access fleet.Access) []instance {
	var out []instance
	for _, in := range a.fleet.Observe(ctx, pods, access, 2*time.Second) {
		i := instance{pod: in.Pod, client: a.fleet.Client(in.Pod, access)}
		if in.Reachable && !in.Terminating {
			i.status = in.Status
		}
		out = append(out, i)
	}
	return out
}

// ChooseInstance picks where a backup runs: with prefer-replica the ready replica with
// the most WAL replayed, else the ready primary; "" when no instance is ready.
func ChooseInstance(statuses []agentapi.Status, target dbv1.BackupTarget) string {
	var replicas []agentapi.Status
	primary := ""
	for _, st := range statuses {
		switch {
		case !st.Ready || !st.Running:
		case st.Role == agentapi.RolePrimary:
			primary = st.Pod
		case st.Role == agentapi.RoleReplica:
			replicas = append(replicas, st)
		}
	}
	if target == dbv1.BackupTargetPrimary || len(replicas) == 0 {
		return primary
	}
	sort.SliceStable(replicas, func(i, j int) bool {
		a, _ := agentapi.ParseLSN(replicas[i].ReplayedLSN)
		b, _ := agentapi.ParseLSN(replicas[j].ReplayedLSN)
		return a > b
	})
	return replicas[0].Pod
}

// Reconciler runs PostgresBackups: it picks an instance, has its agent take the
// backup, follows it to the end and records the outcome in the backup's status, which
// it alone writes.
type Reconciler struct {
	agents
	recorder record.EventRecorder
	clock    clock.PassiveClock
}

// NewReconciler returns a Reconciler; agentURL nil means
// https://<pod IP>:8008.
func NewReconciler(c client.Client, recorder record.EventRecorder, clk clock.PassiveClock, agentURL func(*corev1.Pod) string) *Reconciler {
	return &Reconciler{agents: newAgents(c, agentURL), recorder: recorder, clock: clk}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresbackups,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=db.example.com,resources=postgresbackups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch

// Reconcile moves one backup along Pending → Running → Completed or Failed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var b dbv1.PostgresBackup
	if err := r.client.Get(ctx, req.NamespacedName, &b); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ended(&b) {
		return ctrl.Result{}, nil
	}
	// The cluster label lets the status and retention controllers find it.
	if b.Labels[dbv1.LabelCluster] != b.Spec.Cluster.Name {
		patch := client.MergeFrom(b.DeepCopy())
		if b.Labels == nil {
			b.Labels = map[string]string{}
		}
		b.Labels[dbv1.LabelCluster] = b.Spec.Cluster.Name
		if err := r.client.Patch(ctx, &b, patch); err != nil {
			return ctrl.Result{}, err
		}
		// The patch answers with the backup as it is now, at its new resourceVersion: it
		// may have ended since the read, and a status written from here on would pass the
		// optimistic lock and overwrite that end (CI: a backup recorded Completed became
		// Failed for naming a cluster that does not exist here).
		if ended(&b) {
			return ctrl.Result{}, nil
		}
	}
	var cluster dbv1.PostgresCluster
	err := r.client.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: b.Spec.Cluster.Name}, &cluster)
	switch {
	case apierrors.IsNotFound(err):
		return ctrl.Result{}, r.fail(ctx, &b, fmt.Sprintf("PostgresCluster %q does not exist in namespace %q", b.Spec.Cluster.Name, b.Namespace))
	case err != nil:
		return ctrl.Result{}, err
	case cluster.Spec.Backup == nil:
		return ctrl.Result{}, r.fail(ctx, &b, fmt.Sprintf("PostgresCluster %q has no spec.backup.store: set one to take backups", cluster.Name))
	}
	access, err := r.access(ctx, &cluster)
	if err != nil {
		return ctrl.Result{RequeueAfter: PollPeriod}, client.IgnoreNotFound(err)
	}
	if b.Status.Phase == dbv1.BackupRunning {
		return r.follow(ctx, &b, &cluster, access)
	}
	return r.start(ctx, &b, &cluster, access)
}

func (r *Reconciler) start(ctx context.Context, b *dbv1.PostgresBackup, cluster *dbv1.PostgresCluster, access fleet.Access) (ctrl.Result, error) {
	if b.Status.Phase == "" {
		if err := r.setStatus(ctx, b, func(st *dbv1.PostgresBackupStatus) { st.Phase = dbv1.BackupPending }); err != nil {
			return ctrl.Result{}, err
		}
	}
	pods, err := clusterpods.List(ctx, r.client, cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	instances := r.observe(ctx, pods, access)
	statuses := make([]agentapi.Status, 0, len(instances))
	for _, in := range instances {
		statuses = append(statuses, in.status)
	}
	target := cluster.Spec.Backup.Target
	if b.Spec.Target != "" {
		target = b.Spec.Target
	}
	chosen := ChooseInstance(statuses, target)
	if chosen == "" {
		log.FromContext(ctx).Info("No instance is ready to take the backup; waiting", "backup", b.Name)
		return ctrl.Result{RequeueAfter: 5 * PollPeriod}, nil
	}
	var agent *agentapi.Client
	for _, in := range instances {
		if in.pod.Name == chosen {
			agent = in.client
		}
	}
	st, err := agent.StartBackup(ctx, b.Name)
	if errors.Is(err, agentapi.ErrConflict) {
		log.FromContext(ctx).Info("The instance cannot take the backup now; retrying", "backup", b.Name, "instance", chosen, "reason", err.Error())
		return ctrl.Result{RequeueAfter: 5 * PollPeriod}, nil
	}
	if err != nil {
		return ctrl.Result{}, r.fail(ctx, b, fmt.Sprintf("starting the backup on %s: %v", chosen, err))
	}
	now := metav1.NewTime(r.clock.Now())
	if err := r.setStatus(ctx, b, func(s *dbv1.PostgresBackupStatus) {
		s.Phase, s.Instance, s.BackupID, s.Location = dbv1.BackupRunning, chosen, b.Name, st.Location
		s.Store = cluster.Spec.Backup.Store.DeepCopy()
		s.StartedAt = &now
	}); err != nil {
		return ctrl.Result{}, err
	}
	r.recorder.Eventf(b, corev1.EventTypeNormal, dbv1.ReasonBackupStarted, "Taking the backup on %s", chosen)
	return ctrl.Result{RequeueAfter: PollPeriod}, nil
}

func (r *Reconciler) follow(ctx context.Context, b *dbv1.PostgresBackup, cluster *dbv1.PostgresCluster, access fleet.Access) (ctrl.Result, error) {
	var pod corev1.Pod
	err := r.client.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: b.Status.Instance}, &pod)
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, r.fail(ctx, b, fmt.Sprintf("the instance %s is gone", b.Status.Instance))
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if pod.Status.PodIP == "" {
		return ctrl.Result{RequeueAfter: PollPeriod}, nil
	}
	st, err := r.fleet.Client(&pod, access).Backup(ctx, b.Name)
	switch {
	case errors.Is(err, agentapi.ErrNotFound):
		return ctrl.Result{}, r.fail(ctx, b, fmt.Sprintf("the agent of %s restarted during the backup", b.Status.Instance))
	case err != nil:
		log.FromContext(ctx).Info("Cannot reach the instance taking the backup; retrying", "instance", b.Status.Instance, "error", err.Error())
		return ctrl.Result{RequeueAfter: PollPeriod}, nil
	}
	switch st.Phase {
	case agentapi.BackupCompleted:
		if err := r.setStatus(ctx, b, func(s *dbv1.PostgresBackupStatus) {
			s.Phase = dbv1.BackupCompleted
			s.StartedAt, s.StoppedAt = &metav1.Time{Time: st.StartedAt}, timePtr(st.StoppedAt)
			s.BeginLSN, s.EndLSN, s.Timeline = st.BeginLSN, st.EndLSN, st.Timeline
			s.SizeBytes, s.Size = st.SizeBytes, humanBytes(st.SizeBytes)
			s.Error = ""
		}); err != nil {
			return ctrl.Result{}, err
		}
		r.recorder.Eventf(b, corev1.EventTypeNormal, dbv1.ReasonBackupCompleted, "Backup completed on %s: %s, WAL %s to %s",
			b.Status.Instance, humanBytes(st.SizeBytes), st.BeginLSN, st.EndLSN)
		r.recorder.Eventf(cluster, corev1.EventTypeNormal, dbv1.ReasonBackupCompleted, "Backup %s completed", b.Name)
		return ctrl.Result{}, nil
	case agentapi.BackupFailed:
		return ctrl.Result{}, r.fail(ctx, b, st.Error)
	}
	return ctrl.Result{RequeueAfter: PollPeriod}, nil
}

func (r *Reconciler) fail(ctx context.Context, b *dbv1.PostgresBackup, why string) error {
	now := metav1.NewTime(r.clock.Now())
	if err := r.setStatus(ctx, b, func(s *dbv1.PostgresBackupStatus) {
		s.Phase, s.Error, s.StoppedAt = dbv1.BackupFailed, why, &now
	}); err != nil {
		return err
	}
	r.recorder.Event(b, corev1.EventTypeWarning, dbv1.ReasonBackupFailed, why)
	return nil
}

// ended reports whether b needs nothing more: it completed, failed or is being deleted.
func ended(b *dbv1.PostgresBackup) bool {
	return b.Status.Phase == dbv1.BackupCompleted || b.Status.Phase == dbv1.BackupFailed || !b.DeletionTimestamp.IsZero()
}

// setStatus patches b's status from what was read: with an optimistic lock, so that a
// decision made on a stale read (a backup that meanwhile completed, say) conflicts and
// is made again on the new state instead of overwriting it.
func (r *Reconciler) setStatus(ctx context.Context, b *dbv1.PostgresBackup, change func(*dbv1.PostgresBackupStatus)) error {
	patch := client.MergeFromWithOptions(b.DeepCopy(), client.MergeFromWithOptimisticLock{})
	change(&b.Status)
	return r.client.Status().Patch(ctx, b, patch)
}

func timePtr(t *time.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	return &metav1.Time{Time: *t}
}

// humanBytes is n in binary units with two or three significant digits: "12 MiB",
// "1.2 GiB".
func humanBytes(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }

// SetupWithManager runs the reconciler on PostgresBackups.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("backup").
		For(&dbv1.PostgresBackup{}).
		Complete(r)
}
