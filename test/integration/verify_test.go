package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/verification"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// spec.backup.verify renders its CronJob through the operator, and the controller
// records each finished verification Job in status.lastBackupVerification with an
// event: the result its pod wrote as its termination message, or, for a Job that ended
// without one (its deadline), the Job's reason. The test does what the CronJob and Job
// controllers and the kubelet would (envtest runs none).
func TestRestoreVerificationIsReported(t *testing.T) {
	ns := newNamespace(t)
	c := newCluster(ns, "my-db", withS3Backup(""), func(c *dbv1.PostgresCluster) {
		c.Spec.Backup.Verify = &dbv1.BackupVerifySpec{Schedule: "0 5 * * 0"}
	})
	create(t, c)
	var cj batchv1.CronJob
	testutil.Eventually(t, timeout, func() error { return get(ns, "my-db-verify", &cj) })
	if cj.Spec.Schedule != "0 5 * * 0" || *cj.Spec.JobTemplate.Spec.ActiveDeadlineSeconds != 6*3600 {
		t.Errorf("CronJob schedule %q, deadline %d s", cj.Spec.Schedule, *cj.Spec.JobTemplate.Spec.ActiveDeadlineSeconds)
	}

	started := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	res := verification.Result{Succeeded: true, Backup: "nightly-1", StartedAt: started, FinishedAt: started.Add(50 * time.Second),
		Message: "backup nightly-1 restored (66 MB) in 1 s, opened in 2 s; 3 databases, 1234 relations, pg_amcheck found no corruption"}
	runVerification(t, &cj, "my-db-verify-1", &res, true)
	got := waitVerification(t, ns, "my-db-verify-1")
	if got.Result != dbv1.VerificationSucceeded || got.Backup != "nightly-1" || got.Message != res.Message ||
		got.StartedAt == nil || !got.StartedAt.Time.Equal(started) {
		t.Errorf("status.lastBackupVerification = %+v", got)
	}
	waitEvent(t, ns, "my-db", "BackupVerified")

	// A Job that hit its deadline: no result, the Job's reason.
	runVerification(t, &cj, "my-db-verify-2", nil, false)
	got = waitVerification(t, ns, "my-db-verify-2")
	if got.Result != dbv1.VerificationFailed || !strings.Contains(got.Message, "DeadlineExceeded") {
		t.Errorf("status.lastBackupVerification = %+v", got)
	}
	waitEvent(t, ns, "my-db", "BackupVerificationFailed")
}

// runVerification creates Job name of CronJob cj as the CronJob controller would, its
// pod, terminated with res as its termination message (none when res is nil), and
// marks the Job succeeded or failed (by its deadline).
func runVerification(t *testing.T, cj *batchv1.CronJob, name string, res *verification.Result, succeeded bool) {
	t.Helper()
	ctx := context.Background()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cj.Namespace, Labels: cj.Spec.JobTemplate.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec: *cj.Spec.JobTemplate.Spec.DeepCopy(),
	}
	create(t, job)
	if res != nil {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: cj.Namespace, Labels: job.Spec.Template.Labels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}},
			Spec: *job.Spec.Template.Spec.DeepCopy(),
		}
		pod.Spec.NodeName = "node-a"
		create(t, pod)
		msg, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "verify", Image: pod.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: string(msg),
				StartedAt: metav1.Time{Time: res.StartedAt}, FinishedAt: metav1.Time{Time: res.FinishedAt}}},
		}}}
		if err := k8s.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	now := metav1.Now()
	start := metav1.NewTime(now.Add(-time.Minute))
	job.Status.StartTime = &start
	if succeeded {
		job.Status.Succeeded, job.Status.CompletionTime = 1, &now
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
	} else {
		job.Status.Failed = 1
		job.Status.Conditions = []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, LastTransitionTime: now, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, LastTransitionTime: now, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"},
		}
	}
	if err := k8s.Status().Update(ctx, job); err != nil {
		t.Fatalf("finishing Job %s: %v", name, err)
	}
}

func waitVerification(t *testing.T, ns, job string) dbv1.BackupVerification {
	t.Helper()
	var got dbv1.BackupVerification
	testutil.Eventually(t, timeout, func() error {
		var c dbv1.PostgresCluster
		if err := get(ns, "my-db", &c); err != nil {
			return err
		}
		if v := c.Status.LastBackupVerification; v == nil || v.Job != job {
			return fmt.Errorf("status.lastBackupVerification = %+v, want Job %s's", v, job)
		}
		got = *c.Status.LastBackupVerification
		return nil
	})
	return got
}

func waitEvent(t *testing.T, ns, object, reason string) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == object && e.Reason == reason {
				return nil
			}
		}
		return fmt.Errorf("no %s event on %s", reason, object)
	})
}
