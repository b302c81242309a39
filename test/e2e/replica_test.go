//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// Two namespaces stand in for two Kubernetes clusters. A replica cluster of my-db,
// given only the source's -rw name and a copy of its replication certificate, follows
// it with a writer on the source, within a few seconds as a reader of its -ro sees it,
// and says so in status.replica. Then the planned move: the source stops (spec.stopped,
// its primary first, cleanly), the replica cluster has every acknowledged row, and once
// promoted (spec.replica.enabled: false) takes writes on its own -rw with its own
// credentials. At no moment do both take writes.
func TestReplicaCluster(t *testing.T) {
	src := newDB(t, 2, func(p *dbv1.PostgresCluster) {
		// The replica cluster's pods are in another namespace: the source admits them.
		p.Spec.NetworkPolicy.Clients = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}},
			{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{dbv1.LabelCluster: "my-db"}}}}
	})
	src.waitHealthy(2, 10*time.Minute)
	w := src.newTable()
	w.insert(100)

	host := fmt.Sprintf("%s.%s.svc", dbv1.NamesOf(src.name).ReadWriteService(), src.ns)
	rep := newDB(t, 2, func(p *dbv1.PostgresCluster) {
		p.Spec.Replica = &dbv1.ReplicaSpec{Enabled: true, Source: dbv1.ReplicaSource{Host: host, ReplicationSecretName: "my-db-source"}}
	})
	rep.loginAs = src
	// What a user copies from the source's cluster: its replication certificate, whose
	// ca.crt is the CA the source's server certificate is issued from.
	ctx := context.Background()
	var repl corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: src.ns, Name: dbv1.NamesOf(src.name).ReplicationTLSSecret()}, &repl); err != nil {
		t.Fatal(err)
	}
	copied := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-db-source", Namespace: rep.ns},
		Data: map[string][]byte{"tls.crt": repl.Data["tls.crt"], "tls.key": repl.Data["tls.key"], "ca.crt": repl.Data["ca.crt"]}}
	if err := k8s.Create(ctx, copied); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	st := rep.waitFollowing(2, 10*time.Minute)
	t.Logf("the replica cluster streamed from %s %s after it was created; designated primary %s", host, time.Since(created).Round(time.Second), st.DesignatedPrimary)
	rep.waitRouted(time.Minute, "ro")
	rep.waitCount("ro", "t", 100, time.Minute)
	if err := rep.exec("ro", "INSERT INTO t (id) VALUES (-1)"); err == nil {
		t.Error("the replica cluster took a write")
	}

	// A writer on the source; each acknowledged row is looked for through the replica
	// cluster's -ro.
	var lags []time.Duration
	for range 10 {
		w.insert(20)
		last := w.next - 1
		from := time.Now()
		testutil.Eventually(t, time.Minute, func() error {
			var n int64
			if err := rep.queryRow("ro", "SELECT count(*) FROM t WHERE id = $1", []any{last}, &n); err != nil {
				return err
			}
			if n != 1 {
				return fmt.Errorf("row %d not through the replica cluster's -ro yet", last)
			}
			return nil
		})
		lags = append(lags, time.Since(from))
	}
	slices.Sort(lags)
	t.Logf("an acknowledged row on the source was read through the replica cluster's -ro after %s (median), %s (most) of 10",
		lags[5].Round(time.Millisecond), lags[9].Round(time.Millisecond))
	if lags[9] > 10*time.Second {
		t.Errorf("the replica cluster lags %s, want under 10 s", lags[9])
	}
	if pgc := rep.cluster(); pgc.Status.Replica == nil || pgc.Status.Replica.LagSeconds >= 10 {
		t.Errorf("status.replica: %+v", pgc.Status.Replica)
	}

	// The planned move: the source stops, primary first, its final WAL sent.
	acked := w.acked()
	src.update(func(p *dbv1.PostgresCluster) { p.Spec.Stopped = true })
	testutil.Eventually(t, 5*time.Minute, func() error {
		if pgc := src.cluster(); pgc.Status.Phase != dbv1.PhaseStopped {
			return fmt.Errorf("the source is %s", pgc.Status.Phase)
		}
		return nil
	})
	rep.waitCount("ro", "t", acked, time.Minute)
	testutil.Eventually(t, time.Minute, func() error {
		if r := rep.cluster().Status.Replica; r == nil || r.Streaming {
			return fmt.Errorf("status.replica %+v: want not streaming from the stopped source", r)
		}
		return nil
	})
	promoted := time.Now()
	rep.update(func(p *dbv1.PostgresCluster) { p.Spec.Replica.Enabled = false })
	rep.loginAs = nil
	rw := &writes{d: rep, next: 1_000_000}
	took := rw.untilWritable(promoted, 3*time.Minute)
	t.Logf("the promoted replica cluster took a write through its own -rw %s after spec.replica.enabled was set false", took.Round(time.Millisecond))
	rw.insert(10)
	rep.waitHealthy(2, 5*time.Minute)
	if check := rep.checkRows("t", w.attempts); len(check.Lost) > 0 {
		t.Fatalf("%d of %d rows acknowledged by the source are missing from the promoted cluster: %v", len(check.Lost), check.Acked, check.Lost)
	}
	rw.check()
	testutil.Eventually(t, time.Minute, func() error {
		if r := rep.cluster().Status.Replica; r == nil || r.PromotedAt == nil {
			return fmt.Errorf("status.replica %+v: no promotion recorded", r)
		}
		return nil
	})
	t.Logf("status.replica after the promotion: %s", rep.cluster().Status.Replica.Message)
}

// waitReplica waits until the replica cluster is Healthy with n ready instances and
// its designated primary streams from the source.
func (d *db) waitFollowing(n int32, timeout time.Duration) dbv1.ReplicaStatus {
	d.t.Helper()
	var st dbv1.ReplicaStatus
	testutil.Eventually(d.t, timeout, func() error {
		pgc := d.cluster()
		if pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != n {
			return fmt.Errorf("phase %s, %d ready instances", pgc.Status.Phase, pgc.Status.ReadyInstances)
		}
		if r := pgc.Status.Replica; r == nil || !r.Streaming {
			return fmt.Errorf("status.replica: %+v", r)
		}
		st = *pgc.Status.Replica
		return nil
	})
	return st
}

// queryRow runs one query through svc and scans its row.
func (d *db) queryRow(svc, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, svc)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}
