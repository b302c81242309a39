package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/controller/backup"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/test/testutil"
)

func withS3Backup(schedule string) clusterOption {
	return func(c *dbv1.PostgresCluster) {
		c.Spec.Backup = &dbv1.BackupSpec{
			Schedule: schedule,
			Store: dbv1.BackupStore{S3: &dbv1.S3Store{
				Endpoint: "http://s3.example:9000", Bucket: "backups",
				Credentials: dbv1.S3Credentials{SecretName: "s3-credentials"},
			}},
		}
	}
}

// startScheduler runs a schedule controller of its own on clk, as the operator's
// ServiceAccount; the suite's operator runs one on the real clock, for which the ticks
// used here are in the future.
func startScheduler(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(operatorCfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: controller.CacheOptions(), Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	r := backup.NewScheduleReconciler(mgr.GetClient(), mgr.GetEventRecorderFor("test-scheduler"), clk, nil)
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the manager: %v", err)
		}
	})
}

func scheduledBackups(ns, cluster string) ([]string, error) {
	var list dbv1.PostgresBackupList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns), client.HasLabels{dbv1.LabelScheduledAt},
		client.MatchingLabels{dbv1.LabelCluster: cluster}); err != nil {
		return nil, err
	}
	var names []string
	for _, b := range list.Items {
		names = append(names, b.Name)
	}
	return names, nil
}

// A scheduled backup is created at its tick, under a name that is the tick's, once;
// ticks missed while the operator was away collapse into one backup.
func TestScheduledBackupsFireAtTheirTick(t *testing.T) {
	ns := newNamespace(t)
	c := newCluster(ns, "sched", withS3Backup("0 3 * * *"))
	create(t, c)
	created := c.CreationTimestamp.UTC()
	// The first 03:00 UTC tick at least a minute after the cluster was created: the
	// tick before it precedes the cluster (with the next midnight instead, a cluster
	// created between 00:00 and 03:00 UTC had a missed tick that day).
	tick := created.Truncate(24 * time.Hour).Add(3 * time.Hour)
	for !tick.Add(-time.Minute).After(created) {
		tick = tick.Add(24 * time.Hour)
	}
	day := tick.Add(-3 * time.Hour) // that tick's midnight
	clk := clocktesting.NewFakeClock(day.Add(3*time.Hour - time.Minute))
	startScheduler(t, clk)
	poke := func() {
		t.Helper()
		if err := update(ns, c.Name, func(c *dbv1.PostgresCluster) {
			metav1.SetMetaDataAnnotation(&c.ObjectMeta, "test/poke", clk.Now().String())
		}); err != nil {
			t.Fatal(err)
		}
	}
	poke()
	time.Sleep(2 * time.Second)
	if names, err := scheduledBackups(ns, c.Name); err != nil || len(names) != 0 {
		t.Fatalf("a minute before the tick: %v %v; want no backup", names, err)
	}

	clk.SetTime(day.Add(3*time.Hour + 30*time.Second))
	poke()
	first := "sched-" + day.Format("20060102") + "t030000z"
	testutil.Eventually(t, 30*time.Second, func() error {
		names, err := scheduledBackups(ns, c.Name)
		if err != nil {
			return err
		}
		if len(names) != 1 || names[0] != first {
			return fmt.Errorf("scheduled backups %v, want [%s]", names, first)
		}
		return nil
	})
	var b dbv1.PostgresBackup
	if err := get(ns, first, &b); err != nil {
		t.Fatal(err)
	}
	if b.Spec.Cluster.Name != c.Name || b.Labels[dbv1.LabelScheduledAt] != fmt.Sprint(day.Add(3*time.Hour).Unix()) {
		t.Errorf("the scheduled backup: %+v", b.ObjectMeta.Labels)
	}

	// Three days later: the two missed ticks and today's make one backup, today's.
	clk.SetTime(day.Add(3*24*time.Hour + 4*time.Hour))
	poke()
	latest := "sched-" + day.Add(3*24*time.Hour).Format("20060102") + "t030000z"
	testutil.Eventually(t, 30*time.Second, func() error {
		names, err := scheduledBackups(ns, c.Name)
		if err != nil {
			return err
		}
		if len(names) != 2 || names[1] != latest {
			return fmt.Errorf("scheduled backups %v, want [%s %s]", names, first, latest)
		}
		return nil
	})
	poke()
	time.Sleep(2 * time.Second)
	if names, _ := scheduledBackups(ns, c.Name); len(names) != 2 {
		t.Errorf("after another look at the same time: %v; want no new backup", names)
	}
}

// Wrong backup settings are refused with messages that say what to do.
func TestBackupValidation(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(*dbv1.PostgresCluster)
		want   string
	}{
		{"both stores", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup.Store.Volume = &dbv1.VolumeStore{ClaimName: "backups"}
		}, "exactly one of volume or s3"},
		{"an endpoint without a scheme", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup.Store.S3.Endpoint = "s3.example:9000"
		}, "spec.backup.store.s3.endpoint"},
		{"a path escaping its prefix", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup.Store.Path = "a/../b"
		}, "path cannot contain . or .. segments"},
		{"restore from both", func(c *dbv1.PostgresCluster) {
			c.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: "b", Store: &c.Spec.Backup.Store, ClusterName: "x"}
		}, "exactly one of backupName or store"},
		{"a schedule that is not cron", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup.Schedule = "every night at 3"
		}, "schedule must be a cron expression"},
		{"a minute out of range", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup.Schedule = "60 3 * * *"
		}, "schedule must be a cron expression"},
		{"two targets", func(c *dbv1.PostgresCluster) {
			c.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: "b", TargetLSN: "0/3000000", TargetTime: &metav1.Time{Time: time.Now()}}
		}, "at most one of targetTime and targetLSN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(ns, "bad", withS3Backup(""))
			tc.change(c)
			err := k8s.Create(ctx, c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}

	// A backup of a cluster without a store fails, saying so.
	create(t, newCluster(ns, "nostore"))
	b := &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b1"},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: "nostore"}}}
	create(t, b)
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := get(ns, b.Name, b); err != nil {
			return err
		}
		if b.Status.Phase != dbv1.BackupFailed || !strings.Contains(b.Status.Error, "has no spec.backup.store") {
			return fmt.Errorf("status %+v", b.Status)
		}
		return nil
	})
	// Events are recorded asynchronously: the status can be read before the event.
	testutil.Eventually(t, 10*time.Second, func() error {
		var events corev1.EventList
		if err := k8s.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == b.Name && e.Reason == dbv1.ReasonBackupFailed {
				return nil
			}
		}
		return errors.New("no BackupFailed event on the backup")
	})
}

// completedBackup creates PostgresBackup name of cluster old-db, Completed to a volume
// store, as the backup controller leaves one. That controller leaves a terminal phase
// alone; should it mark the backup Failed first (old-db does not exist here), the status
// is written again.
func completedBackup(t *testing.T, ns, name string) {
	t.Helper()
	create(t, &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: "old-db"}}})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var b dbv1.PostgresBackup
		if err := get(ns, name, &b); err != nil {
			return err
		}
		b.Status = dbv1.PostgresBackupStatus{Phase: dbv1.BackupCompleted, BackupID: "20250601T000000Z",
			Store: &dbv1.BackupStore{Path: "pg", Volume: &dbv1.VolumeStore{ClaimName: "old-backups"}}}
		return k8s.Status().Update(context.Background(), &b)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// restoreOf is the restore block of the cluster's deployed config.json, and the claim
// its StatefulSet mounts as restore-store ("" for none).
func restoreOf(ns, name string) (*clusterconfig.Restore, string, error) {
	var cm corev1.ConfigMap
	if err := get(ns, dbv1.NamesOf(name).ConfigMap(), &cm); err != nil {
		return nil, "", err
	}
	var config clusterconfig.Config
	if err := json.Unmarshal([]byte(cm.Data["config.json"]), &config); err != nil {
		return nil, "", err
	}
	var sts appsv1.StatefulSet
	if err := get(ns, dbv1.NamesOf(name).StatefulSet(), &sts); err != nil {
		return nil, "", err
	}
	claim := ""
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "restore-store" && v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	return config.Restore, claim, nil
}

// The operator resolves bootstrap.fromBackup.backupName through the real API server:
// a missing PostgresBackup fails the cluster saying so; once there, the restore is
// planned from it; once deployed, the cluster keeps its restore and can still be changed
// after the PostgresBackup is deleted.
func TestRestoreFromBackupNameIsResolvedOnce(t *testing.T) {
	ns := newNamespace(t)
	c := newCluster(ns, "restored")
	c.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: "nightly"}
	create(t, c)
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, c.Name, c); err != nil {
			return err
		}
		ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
		if c.Status.Phase != dbv1.PhaseFailed || ready == nil ||
			!strings.Contains(ready.Message, `PostgresBackup "nightly" does not exist in namespace`) {
			return fmt.Errorf("phase %q, Ready %+v", c.Status.Phase, ready)
		}
		return nil
	})

	completedBackup(t, ns, "nightly")
	want := &clusterconfig.Restore{
		Store:    clusterconfig.Store{Directory: "/var/lib/pgpilot/restore", Prefix: "pg/old-db"},
		BackupID: "20250601T000000Z",
	}
	testutil.Eventually(t, timeout, func() error {
		restore, claim, err := restoreOf(ns, c.Name)
		if err != nil {
			return err
		}
		if diff := cmp.Diff(want, restore); diff != "" || claim != "old-backups" {
			return fmt.Errorf("restore-store claim %q, restore (-want +got):\n%s", claim, diff)
		}
		return nil
	})

	if err := k8s.Delete(context.Background(), &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nightly"}}); err != nil {
		t.Fatal(err)
	}
	if err := update(ns, c.Name, func(c *dbv1.PostgresCluster) {
		c.Spec.PostgreSQL.Parameters = map[string]string{"work_mem": "8MB"}
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		var cm corev1.ConfigMap
		if err := get(ns, dbv1.NamesOf(c.Name).ConfigMap(), &cm); err != nil {
			return err
		}
		if !strings.Contains(cm.Data["config.json"], `"work_mem":"8MB"`) {
			return fmt.Errorf("config.json without the new parameter: %s", cm.Data["config.json"])
		}
		return nil
	})
	restore, claim, err := restoreOf(ns, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, restore); diff != "" || claim != "old-backups" {
		t.Errorf("after the PostgresBackup was deleted: restore-store claim %q, restore (-want +got):\n%s", claim, diff)
	}
}
