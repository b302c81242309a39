package backup

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// CheckPeriod is how often a cluster with backups is looked at between ticks: for
// retention by age and for the archiver's health.
const CheckPeriod = 30 * time.Second

// ScheduleReconciler creates a cluster's scheduled PostgresBackups, applies its
// retention, and records the primary's archiving health on the primary Lease (for the
// status controller's ContinuousArchiving condition).
type ScheduleReconciler struct {
	agents
	recorder record.EventRecorder
	clock    clock.PassiveClock

	mu     sync.Mutex
	pruned map[types.NamespacedName]string // newest completed backup retention last ran for
}

// NewScheduleReconciler returns a ScheduleReconciler; agentURL nil means
// https://<pod IP>:8008.
func NewScheduleReconciler(c client.Client, recorder record.EventRecorder, clk clock.PassiveClock, agentURL func(*corev1.Pod) string) *ScheduleReconciler {
	return &ScheduleReconciler{agents: newAgents(c, agentURL), recorder: recorder, clock: clk, pruned: map[types.NamespacedName]string{}}
}

// Reconcile handles one cluster.
func (r *ScheduleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cluster.Spec.Backup == nil || !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	var list dbv1.PostgresBackupList
	if err := r.client.List(ctx, &list, client.InNamespace(cluster.Namespace), client.MatchingLabels{dbv1.LabelCluster: cluster.Name}); err != nil {
		return ctrl.Result{}, err
	}
	requeue := CheckPeriod
	if next, err := r.schedule(ctx, &cluster, list.Items); err != nil {
		return ctrl.Result{}, err
	} else if !next.IsZero() {
		requeue = min(requeue, max(next.Sub(r.clock.Now()), time.Second))
	}
	access, err := r.access(ctx, &cluster)
	if err != nil {
		return ctrl.Result{RequeueAfter: requeue}, client.IgnoreNotFound(err)
	}
	pods, err := clusterpods.List(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	var primary *instance
	for _, in := range r.observe(ctx, pods, access) {
		if in.status.Role == agentapi.RolePrimary && in.status.Ready {
			primary = &in
		}
	}
	if primary == nil {
		return ctrl.Result{RequeueAfter: requeue}, nil
	}
	if err := r.recordArchiving(ctx, &cluster, primary.status); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.retain(ctx, &cluster, list.Items, primary.client); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// schedule creates the backup of the latest tick not yet taken, and returns the next
// tick (zero without a schedule).
func (r *ScheduleReconciler) schedule(ctx context.Context, cluster *dbv1.PostgresCluster, backups []dbv1.PostgresBackup) (time.Time, error) {
	if cluster.Spec.Backup.Schedule == "" {
		return time.Time{}, nil
	}
	sched, err := ParseSchedule(cluster.Spec.Backup.Schedule)
	if err != nil {
		r.recorder.Event(cluster, corev1.EventTypeWarning, dbv1.ReasonBackupScheduled, err.Error())
		return time.Time{}, nil
	}
	// Ticks before the cluster existed, or already taken, do not count.
	after := cluster.CreationTimestamp.Time
	for _, b := range backups {
		if v, ok := b.Labels[dbv1.LabelScheduledAt]; ok {
			if unix, err := strconv.ParseInt(v, 10, 64); err == nil && time.Unix(unix, 0).After(after) {
				after = time.Unix(unix, 0)
			}
		}
	}
	tick, due, next := Due(sched, after, r.clock.Now())
	if !due || cluster.Spec.Stopped {
		// A stopped cluster's data does not change: the tick waits, and is taken once
		// the cluster runs again.
		return next, nil
	}
	b := &dbv1.PostgresBackup{
		ObjectMeta: metav1.ObjectMeta{
			Name: ScheduledName(cluster.Name, tick), Namespace: cluster.Namespace,
			Labels: map[string]string{dbv1.LabelCluster: cluster.Name, dbv1.LabelScheduledAt: strconv.FormatInt(tick.Unix(), 10)},
		},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: cluster.Name}, Method: "basebackup"},
	}
	switch err := r.client.Create(ctx, b); {
	case apierrors.IsAlreadyExists(err):
	case err != nil:
		return next, err
	default:
		log.FromContext(ctx).Info("Created a scheduled backup", "backup", b.Name, "tick", tick)
		r.recorder.Eventf(cluster, corev1.EventTypeNormal, dbv1.ReasonBackupScheduled, "Created backup %s for the %s tick", b.Name, tick.Format(time.RFC3339))
	}
	return next, nil
}

// retain deletes what the retention rules prune, from the store first (through the
// primary's agent, which also removes the WAL no kept backup needs), then the objects.
func (r *ScheduleReconciler) retain(ctx context.Context, cluster *dbv1.PostgresCluster, backups []dbv1.PostgresBackup, agent *agentapi.Client) error {
	retention := dbv1.RetentionSpec{Count: ptr.To[int32](7)} // the CRD's default
	if cluster.Spec.Backup.Retention != nil {
		retention = *cluster.Spec.Backup.Retention
	}
	prune := Prune(backups, retention, r.clock.Now())
	newest := ""
	var newestAt time.Time
	for _, b := range backups {
		if b.Status.Phase == dbv1.BackupCompleted && stoppedAt(b).After(newestAt) {
			newest, newestAt = b.Name, stoppedAt(b)
		}
	}
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: cluster.Name}
	r.mu.Lock()
	done := r.pruned[key] == newest
	r.mu.Unlock()
	if len(prune) == 0 && (done || newest == "") {
		return nil
	}
	var ids []string
	for _, b := range prune {
		if b.Status.Phase == dbv1.BackupCompleted && b.Status.BackupID != "" {
			ids = append(ids, b.Status.BackupID)
		}
	}
	res, err := agent.Retention(ctx, agentapi.RetentionRequest{Delete: ids})
	if err != nil {
		r.recorder.Eventf(cluster, corev1.EventTypeWarning, dbv1.ReasonBackupPruned, "Applying the backup retention failed: %v", err)
		return nil
	}
	for i := range prune {
		if err := r.client.Delete(ctx, &prune[i]); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if len(prune) > 0 || res.WALDeleted > 0 {
		r.recorder.Eventf(cluster, corev1.EventTypeNormal, dbv1.ReasonBackupPruned,
			"Retention deleted %d backups and %d archived WAL files", len(prune), res.WALDeleted)
	}
	r.mu.Lock()
	r.pruned[key] = newest
	r.mu.Unlock()
	return nil
}

// ArchiveFailingMessage says why the primary in st cannot archive, how much WAL waits
// on its volume, and how long until the volume is full. Figures are rounded so that
// the message, kept in the Lease and a condition, changes at most every few minutes.
func ArchiveFailingMessage(st agentapi.Status) string {
	a := st.Archiver
	why := a.LastError
	if why == "" {
		why = "see the primary's log"
	}
	msg := fmt.Sprintf("Archiving WAL %s failed %d times (%s); %d segments (%s) wait on the primary's volume",
		a.LastFailedWAL, a.FailedCount, why, a.Pending, humanBytes(a.PendingBytes))
	if st.VolumeBytes > 0 {
		msg += fmt.Sprintf(", %s of %s free", humanBytes(st.VolumeFreeBytes), humanBytes(st.VolumeBytes))
	}
	if st.VolumeFullInSeconds > 0 {
		msg += fmt.Sprintf("; at the last 10 minutes' rate the volume is full in about %s", roundDuration(time.Duration(st.VolumeFullInSeconds)*time.Second))
	}
	return msg + ". PostgreSQL stops when it is: fix the store, or give the volume room (expand its PersistentVolumeClaim)"
}

// roundDuration is d to the minute under 2 hours, to the hour beyond.
func roundDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return "a minute"
	case d < 2*time.Hour:
		return fmt.Sprintf("%d minutes", int(d.Round(time.Minute).Minutes()))
	}
	return fmt.Sprintf("%d hours", int(d.Round(time.Hour).Hours()))
}

// recordArchiving writes the primary's archiving health into the cluster's report for
// the status controller's ContinuousArchiving condition, when it changed, with a Warning
// event when archiving starts failing.
func (r *ScheduleReconciler) recordArchiving(ctx context.Context, cluster *dbv1.PostgresCluster, st agentapi.Status) error {
	a := st.Archiver
	if a == nil {
		return nil
	}
	rec := report.Archiving{OK: true, Message: "No WAL segment archived yet"}
	switch {
	case a.Failing():
		rec = report.Archiving{Message: ArchiveFailingMessage(st)}
	case a.LastArchivedAt != nil:
		rec.Message = fmt.Sprintf("Last archived %s at %s", a.LastArchivedWAL, a.LastArchivedAt.UTC().Format(time.RFC3339))
	}
	was, err := report.Read(ctx, r.client, cluster)
	if err != nil {
		return err
	}
	if was.Archiving != nil && *was.Archiving == rec {
		return nil
	}
	if was.Archiving != nil && was.Archiving.OK && !rec.OK {
		r.recorder.Event(cluster, corev1.EventTypeWarning, dbv1.ReasonArchiveFailing, rec.Message)
	}
	return client.IgnoreNotFound(report.Write(ctx, r.client, cluster, report.KeyArchiving, &rec))
}

// SetupWithManager runs the reconciler on clusters and their backups.
func (r *ScheduleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("backup-schedule").
		For(&dbv1.PostgresCluster{}).
		Watches(&dbv1.PostgresBackup{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Complete(r)
}
