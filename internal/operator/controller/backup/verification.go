package backup

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
	"github.com/pgpilot/pgpilot/internal/protocol/verification"
)

// Events of restore verifications.
const (
	EventBackupVerified           = "BackupVerified"
	EventBackupVerificationFailed = "BackupVerificationFailed"
)

// VerificationReconciler records how a cluster's last restore verification went
// (spec.backup.verify): the chart's CronJob runs each in a Job, whose pod writes its
// result as its termination message; the newest finished Job's is reported once
// (report.KeyBackupVerification), with an event, and the status controller copies it
// to status.lastBackupVerification.
type VerificationReconciler struct {
	client client.Client
	// reader reads the Jobs' pods, which the cache does not hold (they carry no
	// cluster label); one List per finished Job.
	reader   client.Reader
	recorder record.EventRecorder
}

// NewVerificationReconciler returns a VerificationReconciler.
func NewVerificationReconciler(c client.Client, reader client.Reader, recorder record.EventRecorder) *VerificationReconciler {
	return &VerificationReconciler{client: c, reader: reader, recorder: recorder}
}

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch

// Reconcile handles one cluster.
func (r *VerificationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var jobs batchv1.JobList
	if err := r.client.List(ctx, &jobs, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{dbv1.LabelCluster: cluster.Name, dbv1.LabelVerify: cluster.Name}); err != nil {
		return ctrl.Result{}, err
	}
	var newest *batchv1.Job
	var newestAt time.Time
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if end := jobEnd(j); end != nil && (newest == nil || newer(j, end.LastTransitionTime.Time, newest, newestAt)) {
			newest, newestAt = j, end.LastTransitionTime.Time
		}
	}
	if newest == nil {
		return ctrl.Result{}, nil
	}
	rep, err := report.Read(ctx, r.client, &cluster)
	if err != nil {
		return ctrl.Result{}, err
	}
	if last := rep.BackupVerification; last != nil && last.Job == newest.Name {
		return ctrl.Result{}, nil
	}
	v, err := r.outcome(ctx, newest)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := report.Write(ctx, r.client, &cluster, report.KeyBackupVerification, &v); err != nil {
		return ctrl.Result{}, err
	}
	if v.Result == dbv1.VerificationSucceeded {
		r.recorder.Event(&cluster, corev1.EventTypeNormal, EventBackupVerified, v.Message)
	} else {
		r.recorder.Eventf(&cluster, corev1.EventTypeWarning, EventBackupVerificationFailed, "Job %s: %s", v.Job, v.Message)
	}
	return ctrl.Result{}, nil
}

// newer reports whether Job a, finished at aAt, is newer than b, finished at bAt. The
// times have seconds only: ties go to the Job created later, then to the later name (a
// CronJob's Jobs are named after their scheduled minute).
func newer(a *batchv1.Job, aAt time.Time, b *batchv1.Job, bAt time.Time) bool {
	switch {
	case !aAt.Equal(bAt):
		return aAt.After(bAt)
	case !a.CreationTimestamp.Equal(&b.CreationTimestamp):
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// jobEnd is the condition that says how job ended (Complete or Failed), nil while it runs.
func jobEnd(job *batchv1.Job) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// outcome is what finished Job job found: its pod's result when the pod is still there
// and wrote one, else what the Job's conditions say (a deadline, a pod that never
// started).
func (r *VerificationReconciler) outcome(ctx context.Context, job *batchv1.Job) (dbv1.BackupVerification, error) {
	end := jobEnd(job)
	succeeded := end.Type == batchv1.JobComplete
	v := dbv1.BackupVerification{Job: job.Name, Result: dbv1.VerificationFailed, StartedAt: job.Status.StartTime,
		FinishedAt: &metav1.Time{Time: end.LastTransitionTime.Time}}
	if succeeded {
		v.Result = dbv1.VerificationSucceeded
	}
	var pods corev1.PodList
	if err := r.reader.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{dbv1.LabelVerify: job.Labels[dbv1.LabelVerify]}); err != nil {
		return v, err
	}
	for _, p := range pods.Items {
		if !metav1.IsControlledBy(&p, job) {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Terminated == nil || cs.State.Terminated.Message == "" {
				continue
			}
			var res verification.Result
			if err := json.Unmarshal([]byte(cs.State.Terminated.Message), &res); err != nil {
				v.Message = fmt.Sprintf("the verification's pod %s ended with exit code %d and an unreadable result: %v", p.Name, cs.State.Terminated.ExitCode, err)
				return v, nil
			}
			v.Backup, v.Message = res.Backup, res.Message
			if !res.StartedAt.IsZero() {
				v.StartedAt = &metav1.Time{Time: res.StartedAt}
			}
			if !res.FinishedAt.IsZero() {
				v.FinishedAt = &metav1.Time{Time: res.FinishedAt}
			}
			if succeeded != res.Succeeded {
				// A pod that wrote success and then failed (or the reverse) is no success.
				v.Result = dbv1.VerificationFailed
			}
			return v, nil
		}
	}
	if !succeeded {
		v.Message = fmt.Sprintf("the verification failed without a result: %s: %s", end.Reason, end.Message)
		return v, nil
	}
	v.Message = "the verification's pod is gone: its result is lost"
	v.Result = dbv1.VerificationFailed
	return v, nil
}

// SetupWithManager runs the reconciler on clusters and their verification Jobs.
func (r *VerificationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("backup-verification").
		// A cluster's status changes often and says nothing new to this reconciler.
		For(&dbv1.PostgresCluster{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Complete(r)
}
