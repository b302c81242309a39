//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A cluster with a backup store on a PersistentVolumeClaim and a schedule of every
// minute: a scheduled backup completes, a restore verification started by hand from
// its CronJob restores it into a throw-away instance and is reported in status, and a
// new cluster restored from it (with a replica that clones from the restored primary)
// has exactly the rows written before it.
func TestScheduledBackupRestores(t *testing.T) {
	store := dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "backups"}}
	d := newDB(t, 2, func(c *dbv1.PostgresCluster) {
		c.Spec.Backup = &dbv1.BackupSpec{Store: store, Schedule: "* * * * *",
			// Run by hand below, as `kubectl create job --from=cronjob/...` would.
			Verify: &dbv1.BackupVerifySpec{Schedule: "0 0 1 1 *"}}
	})
	ctx := context.Background()
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "backups"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := k8s.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	d.waitHealthy(2, 10*time.Minute)
	w := d.newTable()
	w.insert(100)
	written := time.Now()

	// The first backup scheduled after the rows were written.
	var backup dbv1.PostgresBackup
	testutil.Eventually(t, 5*time.Minute, func() error {
		var list dbv1.PostgresBackupList
		if err := k8s.List(ctx, &list, client.InNamespace(d.ns)); err != nil {
			return err
		}
		for _, b := range list.Items {
			if _, scheduled := b.Labels[dbv1.LabelScheduledAt]; !scheduled || b.Status.StartedAt == nil || b.Status.StartedAt.Time.Before(written) {
				continue
			}
			switch b.Status.Phase {
			case dbv1.BackupCompleted:
				backup = b
				return nil
			case dbv1.BackupFailed:
				t.Fatalf("scheduled backup %s failed: %s", b.Name, b.Status.Error)
			}
		}
		return fmt.Errorf("no scheduled backup started after the rows were written has completed yet (%d backups)", len(list.Items))
	})
	t.Logf("scheduled backup %s completed: %s from %s, %s to %s", backup.Name, backup.Status.Size, backup.Status.Instance,
		backup.Status.StartedAt.Format(time.TimeOnly), backup.Status.StoppedAt.Format(time.TimeOnly))

	// A restore verification run now restores that backup in a Job of its own, and the
	// operator reports it.
	verifyNow(t, d, backup.Name)

	restored := &db{t: t, ns: d.ns, name: "restored"}
	pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: restored.name},
		Spec: dbv1.PostgresClusterSpec{Replicas: 2, Version: version}}
	pgc.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: backup.Name}
	if err := k8s.Create(ctx, pgc); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	restored.waitHealthy(2, 10*time.Minute)
	t.Logf("restored cluster Healthy %s after creation", time.Since(start).Round(time.Second))
	restored.waitStreaming(1, 2*time.Minute)
	n, err := restored.count("rw", "t")
	if err != nil {
		t.Fatal(err)
	}
	if n != w.acked() {
		t.Errorf("the restored cluster has %d rows, want the %d written before the backup", n, w.acked())
	}
	restored.waitCount("ro", "t", n, time.Minute)
}

// verifyNow starts a restore verification from d's CronJob, as
// `kubectl create job --from=cronjob/<name>-verify` does, and waits until the operator
// reports it succeeded on backup.
func verifyNow(t *testing.T, d *db, backup string) {
	t.Helper()
	ctx := context.Background()
	var cj batchv1.CronJob
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).VerifyCronJob()}, &cj); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: cj.Name + "-now", Labels: cj.Spec.JobTemplate.Labels,
			Annotations:     map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Spec: cj.Spec.JobTemplate.Spec,
	}
	if err := k8s.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var got dbv1.BackupVerification
	testutil.Eventually(t, 10*time.Minute, func() error {
		var c dbv1.PostgresCluster
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name}, &c); err != nil {
			return err
		}
		if v := c.Status.LastBackupVerification; v == nil || v.Job != job.Name {
			return fmt.Errorf("status.lastBackupVerification = %+v, want Job %s's", v, job.Name)
		}
		got = *c.Status.LastBackupVerification
		return nil
	})
	t.Logf("verification reported %s after %s: %s", got.Result, time.Since(start).Round(time.Second), got.Message)
	if got.Result != dbv1.VerificationSucceeded || got.Backup != backup {
		t.Errorf("status.lastBackupVerification = %+v, want backup %s Succeeded", got, backup)
	}
}
