//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
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
// it with a writer on the source, within a second as a reader of its -ro sees it, and
// says so in status.replica. Then the planned switch of roles, with writers on both
// clusters' -rw all along: the source is demoted (spec.replica naming the other), its
// demotion token goes into the other's promotionToken, the other is promoted once it
// has all the source wrote, and the old source follows the new one. No acknowledged
// row is lost, and the old source acknowledged nothing after the new one's first.
func TestReplicaCluster(t *testing.T) {
	// Each cluster's pods are in the other's namespace's clients, for when it follows.
	admitBoth := func(p *dbv1.PostgresCluster) {
		p.Spec.NetworkPolicy.Clients = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}},
			{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{dbv1.LabelCluster: "my-db"}}}}
	}
	src := newDB(t, 2, admitBoth)
	src.waitHealthy(2, 10*time.Minute)
	w := src.newTable()
	w.insert(100)

	srcHost := fmt.Sprintf("%s.%s.svc", dbv1.NamesOf(src.name).ReadWriteService(), src.ns)
	rep := newDB(t, 2, admitBoth, func(p *dbv1.PostgresCluster) {
		p.Spec.Replica = &dbv1.ReplicaSpec{Enabled: true, Source: dbv1.ReplicaSource{Host: srcHost, ReplicationSecretName: "my-db-source"}}
	})
	rep.loginAs = src
	copyReplicationSecret(t, src, rep)
	created := time.Now()
	st := rep.waitFollowing(2, 10*time.Minute)
	t.Logf("the replica cluster streamed from %s %s after it was created; designated primary %s", srcHost, time.Since(created).Round(time.Second), st.DesignatedPrimary)
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

	// The switch, with a writer on each cluster's -rw all along (the replica cluster's
	// with its own credentials: they work once it is promoted).
	repWrites := &writes{d: &db{t: t, ns: rep.ns, name: rep.name}, next: 1_000_000}
	var repAcked atomic.Int64 // the attempts are read once the writer stopped
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			_ = w.try()
			if repWrites.try() == nil {
				repAcked.Add(1)
			}
		}
	}()
	copyReplicationSecret(t, rep, src)
	repHost := fmt.Sprintf("%s.%s.svc", dbv1.NamesOf(rep.name).ReadWriteService(), rep.ns)
	switched := time.Now()
	src.update(func(p *dbv1.PostgresCluster) {
		p.Spec.Replica = &dbv1.ReplicaSpec{Enabled: true, Source: dbv1.ReplicaSource{Host: repHost, ReplicationSecretName: "my-db-source"}}
	})
	var token string
	testutil.Eventually(t, 3*time.Minute, func() error {
		if r := src.cluster().Status.Replica; r != nil && r.DemotionToken != "" {
			token = r.DemotionToken
			return nil
		}
		return fmt.Errorf("no demotion token in the source's status yet")
	})
	t.Logf("the source was demoted %s after spec.replica was set: token %s", time.Since(switched).Round(time.Millisecond), token)
	rep.update(func(p *dbv1.PostgresCluster) {
		p.Spec.Replica.Enabled = false
		p.Spec.Replica.PromotionToken = token
	})
	testutil.Eventually(t, 3*time.Minute, func() error {
		if n := repAcked.Load(); n < 50 {
			return fmt.Errorf("%d writes acknowledged by the promoted cluster", n)
		}
		return nil
	})
	close(stop)
	<-done
	lastOld, firstNew := lastAck(w.attempts), firstAck(repWrites.attempts)
	t.Logf("the old source's last acknowledged write came %s before the new primary's first; %s from spec.replica on the source to that first write",
		firstNew.Sub(lastOld).Round(time.Millisecond), firstNew.Sub(switched).Round(time.Millisecond))
	if !lastOld.Before(firstNew) {
		t.Errorf("the old source acknowledged a write at %s, after the new primary's first at %s: two writable clusters", lastOld, firstNew)
	}
	rep.loginAs = nil
	rep.waitHealthy(2, 5*time.Minute)
	if check := rep.checkRows("t", w.attempts); len(check.Lost) > 0 {
		t.Fatalf("%d of %d rows acknowledged by the old source are missing from the new primary: %v", len(check.Lost), check.Acked, check.Lost)
	}
	repWrites.check()
	if r := rep.cluster().Status.Replica; r == nil || r.PromotedAt == nil {
		t.Errorf("status.replica of the promoted cluster: %+v", r)
	} else {
		t.Logf("status.replica of the promoted cluster: %s", r.Message)
	}

	// The old source follows the new primary, and has its writes.
	src.loginAs = rep
	st = src.waitFollowing(2, 5*time.Minute)
	n, err := rep.count("rw", "t")
	if err != nil {
		t.Fatal(err)
	}
	src.waitCount("ro", "t", n, time.Minute)
	t.Logf("the old source follows %s (designated primary %s) with all %d rows", st.Source, st.DesignatedPrimary, n)
}

// copyReplicationSecret copies from's replication certificate into to's namespace as
// my-db-source: what a user copies from a source's Kubernetes cluster. Its ca.crt is
// the CA the source's server certificate is issued from.
func copyReplicationSecret(t *testing.T, from, to *db) {
	t.Helper()
	ctx := context.Background()
	var repl corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: from.ns, Name: dbv1.NamesOf(from.name).ReplicationTLSSecret()}, &repl); err != nil {
		t.Fatal(err)
	}
	copied := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-db-source", Namespace: to.ns},
		Data: map[string][]byte{"tls.crt": repl.Data["tls.crt"], "tls.key": repl.Data["tls.key"], "ca.crt": repl.Data["ca.crt"]}}
	if err := k8s.Create(ctx, copied); err != nil {
		t.Fatal(err)
	}
}

// lastAck and firstAck are when the last and the first acknowledged attempt ended.
func lastAck(attempts []testutil.Attempt) time.Time {
	var t time.Time
	for _, a := range attempts {
		if a.Acked() && a.End.After(t) {
			t = a.End
		}
	}
	return t
}

func firstAck(attempts []testutil.Attempt) time.Time {
	var t time.Time
	for _, a := range attempts {
		if a.Acked() && (t.IsZero() || a.End.Before(t)) {
			t = a.End
		}
	}
	return t
}

// waitFollowing waits until the replica cluster is Healthy with n ready instances and
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
