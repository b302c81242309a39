//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/failover"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// nextVersion is the newer major of the local images (E2E_PG_NEXT in hack/e2e/lib.sh).
var nextVersion = envOr("E2E_PG_NEXT", "17")

// withS3 gives the cluster a backup store on an S3 server in its namespace, and lets
// the superuser log in over the network (archiveCurrentWAL, the functions below).
func withS3(c *dbv1.PostgresCluster) {
	c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Path: "e2e", S3: &dbv1.S3Store{
		Endpoint: "http://s3:7070", Bucket: "pgpilot", Credentials: dbv1.S3Credentials{SecretName: "s3-credentials"},
	}}}
	c.Spec.PostgreSQL.SuperuserNetworkAccess = true
}

// A three-instance cluster of the local node's PostgreSQL 15, with rows, a backup and
// a writer all along, set to 17: every instance runs 17, every acknowledged row is
// there, statistics are rebuilt, a base backup of 17 is taken, and a point-in-time
// restore from it has exactly the rows written before its target.
func TestMajorUpgrade(t *testing.T) {
	d := newDB(t, 3, withS3)
	s3 := startS3(t, d.ns)
	makeBucket(t, s3, "pgpilot")
	d.waitHealthy(3, 10*time.Minute)
	w := d.newTable()
	w.insert(100)
	d.takeBackup("before")

	ctx := context.Background()
	began := time.Now()
	gap := w.continuously(func() {
		d.update(func(c *dbv1.PostgresCluster) { c.Spec.Version = nextVersion })
		d.waitUpgraded(3, 20*time.Minute)
	})
	t.Logf("upgraded %s → %s in %s; writes were unavailable for at most %s", version, nextVersion, time.Since(began).Round(time.Second), gap.Round(time.Millisecond))
	w.check()
	pgc := d.cluster()
	if c := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionMajorUpgrade); c != nil {
		t.Logf("MajorUpgrade: %s", c.Message)
	}
	for _, p := range d.pods() {
		st, err := d.agentStatus(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if st.PostgresVersion/10000 != 17 {
			t.Errorf("%s runs PostgreSQL %d", p.Name, st.PostgresVersion)
		}
	}
	var stats int
	conn, err := d.conn(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stats WHERE tablename = 't'").Scan(&stats); err != nil || stats == 0 {
		t.Errorf("no planner statistics for t after the upgrade (%d, %v)", stats, err)
	}
	_ = conn.Close(ctx)
	d.logEvents()

	// The base backup the operator takes of the new major, and a point in time after it.
	after := d.waitBackup(failover.UpgradeBackupName(d.name, nextVersion), 10*time.Minute)
	t.Logf("backup of PostgreSQL %s %s completed: %s", nextVersion, after.Name, after.Status.Size)
	w.insert(20)
	rows, err := d.count("rw", "t")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	target := time.Now()
	time.Sleep(time.Second)
	w.insert(20)
	d.archiveCurrentWAL()
	restored := &db{t: t, ns: d.ns, name: "restored"}
	rpgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: restored.name},
		Spec: dbv1.PostgresClusterSpec{Replicas: 1, Version: nextVersion}}
	rpgc.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: after.Name, TargetTime: &metav1.Time{Time: target}}
	if err := k8s.Create(ctx, rpgc); err != nil {
		t.Fatal(err)
	}
	restored.waitHealthy(1, 10*time.Minute)
	if n, err := restored.count("rw", "t"); err != nil || n != rows {
		t.Errorf("the cluster restored to a time after the upgrade has %d rows (%v), want %d", n, err, rows)
	}
}

// An upgrade that cannot be made (a function whose library the new image lacks, as a
// missing extension's would be) stops nothing: the cluster serves PostgreSQL 15 on and
// says why; spec.version set back to 15 returns it to its image.
func TestMajorUpgradeRefused(t *testing.T) {
	d := newDB(t, 1, func(c *dbv1.PostgresCluster) { c.Spec.PostgreSQL.SuperuserNetworkAccess = true })
	d.waitHealthy(1, 10*time.Minute)
	w := d.newTable()
	w.insert(10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	su, err := d.superuserConn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE FUNCTION gone() RETURNS language_handler LANGUAGE c AS '$libdir/plpgsql', 'plpgsql_call_handler'",
		"UPDATE pg_proc SET probin = '$libdir/pgpilot_gone' WHERE proname = 'gone'",
	} {
		if _, err := su.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	_ = su.Close(ctx)

	d.update(func(c *dbv1.PostgresCluster) { c.Spec.Version = nextVersion })
	var cond *dbv1.Condition
	testutil.Eventually(t, 10*time.Minute, func() error {
		pgc := d.cluster()
		cond = dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionMajorUpgrade)
		if cond == nil || cond.Reason != dbv1.ReasonUpgradeFailed {
			return fmt.Errorf("MajorUpgrade %+v", cond)
		}
		return nil
	})
	t.Logf("MajorUpgrade: %s", cond.Message)
	if !strings.Contains(cond.Message, "pgpilot_gone") {
		t.Errorf("the condition does not name the missing library: %q", cond.Message)
	}
	pgc := d.waitHealthy(1, 5*time.Minute)
	if pgc.Status.DataVersion != version {
		t.Errorf("data version %q after the refused upgrade, want %s", pgc.Status.DataVersion, version)
	}
	w.insert(10)
	d.logEvents()

	d.update(func(c *dbv1.PostgresCluster) { c.Spec.Version = version })
	testutil.Eventually(t, 10*time.Minute, func() error {
		for _, p := range d.pods() {
			for _, c := range p.Spec.InitContainers {
				if c.Name == "carry-postgres" {
					return fmt.Errorf("%s still carries PostgreSQL %s", p.Name, version)
				}
			}
		}
		if pgc := d.cluster(); pgc.Status.Phase != dbv1.PhaseHealthy {
			return fmt.Errorf("phase %s", pgc.Status.Phase)
		}
		return nil
	})
	back := time.Now()
	d.waitRouted(3*time.Minute, "rw")
	t.Logf("-rw took writes %s after the cluster was Healthy on %s again", time.Since(back).Round(time.Millisecond), version)
	w.insert(10)
	// One instance: no -ro to compare with (writes.check), the rows through -rw only.
	if check := d.checkRows("t", w.attempts); len(check.Lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost: ids %v", len(check.Lost), check.Acked, check.Lost)
	}
}

// waitUpgraded waits until the data runs the next major on n ready instances and the
// MajorUpgrade condition says it completed.
func (d *db) waitUpgraded(n int32, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		pgc := d.cluster()
		c := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionMajorUpgrade)
		switch {
		case c != nil && c.Reason == dbv1.ReasonUpgradeFailed:
			d.t.Fatalf("the upgrade failed: %s", c.Message)
		case c == nil || c.Status != metav1.ConditionTrue:
			return fmt.Errorf("MajorUpgrade %+v", c)
		case pgc.Status.DataVersion != nextVersion || pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != n:
			return fmt.Errorf("data version %s, phase %s, %d ready", pgc.Status.DataVersion, pgc.Status.Phase, pgc.Status.ReadyInstances)
		}
		return nil
	})
	d.waitRouted(timeout, "rw", "ro")
}

// takeBackup takes a base backup named name and waits for it.
func (d *db) takeBackup(name string) dbv1.PostgresBackup {
	d.t.Helper()
	b := &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: name},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: d.name}}}
	if err := k8s.Create(context.Background(), b); err != nil {
		d.t.Fatal(err)
	}
	return d.waitBackup(name, 5*time.Minute)
}

// waitBackup waits until the PostgresBackup name exists and completed.
func (d *db) waitBackup(name string, timeout time.Duration) dbv1.PostgresBackup {
	d.t.Helper()
	var b dbv1.PostgresBackup
	testutil.Eventually(d.t, timeout, func() error {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: name}, &b); err != nil {
			return err
		}
		switch b.Status.Phase {
		case dbv1.BackupCompleted:
			return nil
		case dbv1.BackupFailed:
			d.t.Fatalf("backup %s failed: %s", name, b.Status.Error)
		}
		return fmt.Errorf("backup %s %s", name, b.Status.Phase)
	})
	return b
}

// logEvents logs the cluster's events by reason. Events are not asserted: client-go
// drops an object's events beyond a burst of 25 (one more every five minutes), and a
// cluster that restarts emits that many; the conditions are what the tests check.
func (d *db) logEvents() {
	d.t.Helper()
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(d.ns)); err != nil {
		d.t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "PostgresCluster" && e.InvolvedObject.Name == d.name && strings.Contains(e.Reason, "pgrad") {
			d.t.Logf("event %s: %s", e.Reason, e.Message)
		}
	}
}
