package pg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// startOperated starts every instance of an operated cluster and waits until the
// read-write Service routes to the first and the others stream.
func startOperated(t *testing.T, c *cluster) {
	t.Helper()
	c.startAll()
	testutil.Eventually(t, 30*time.Second, func() error {
		if rw := c.readWrite(); rw != c.instances[0] {
			return fmt.Errorf("the read-write Service routes to %v", rw)
		}
		return nil
	})
}

// podRole is the role label the controller gave the instance's pod.
func (c *cluster) podRole(in *instance) string {
	var pod corev1.Pod
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: in.pod}, &pod); err != nil {
		return ""
	}
	return pod.Labels[dbv1.LabelRole]
}

// events are the cluster's events with reason.
func (c *cluster) events(reason string) []corev1.Event {
	var list corev1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(c.namespace)); err != nil {
		return nil
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason && e.InvolvedObject.Name == c.name {
			out = append(out, e)
		}
	}
	return out
}

// hasEvent reports whether the cluster got an event with reason.
func (c *cluster) hasEvent(reason string) bool { return len(c.events(reason)) > 0 }

// The operator fails over on its own: kill -9 of the primary (agent and postmaster),
// a replica is promoted and the read-write Service routes to it, the other replica
// follows, and the old primary rejoins as a replica and is unfenced.
func TestOperatorFailsOver(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	old := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE t (id bigserial PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if err := c.writeThroughRW("INSERT INTO t (v) SELECT 'before' FROM generate_series(1, 50)"); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.instances[1:] {
		r.waitCount("t", 50, 30*time.Second)
	}

	killed := time.Now()
	old.kill9()
	// next is the endpoint that took the first write; reading the Service again later
	// could catch a moment with no single ready endpoint.
	var next *instance
	testutil.Eventually(t, time.Minute, func() error {
		next = c.readWrite()
		if next == nil || next == old {
			return errors.New("the read-write Service does not route to a new primary yet")
		}
		return next.exec("INSERT INTO t (v) VALUES ('after')")
	})
	t.Logf("first write through the read-write Service %s after kill -9 of the primary (failover delay 3s)", time.Since(killed).Round(10*time.Millisecond))
	if got := c.podRole(old); got != dbv1.RoleFenced {
		t.Errorf("the old primary's pod is labelled %q, want fenced", got)
	}
	for _, in := range c.instances {
		if in != old && in != next {
			in.waitRole(agentapi.RoleReplica, 2, time.Minute)
			in.waitCount("t", 51, 30*time.Second)
		}
	}
	if !c.hasEvent(dbv1.ReasonFailoverCompleted) {
		t.Error("no FailoverCompleted event")
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return err
		}
		lf := pgc.Status.LastFailover
		if lf == nil || lf.From != old.pod || lf.To != next.pod || pgc.Status.CurrentPrimary != next.pod {
			return fmt.Errorf("status: lastFailover %+v, currentPrimary %s", lf, pgc.Status.CurrentPrimary)
		}
		return nil
	})

	old.start()
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	old.waitCount("t", 51, 30*time.Second)
	testutil.Eventually(t, 30*time.Second, func() error {
		if got := c.podRole(old); got != dbv1.RoleReplica {
			return fmt.Errorf("the rejoined old primary's pod is labelled %q, want replica", got)
		}
		return nil
	})
}

// A graceful stop of the primary (SIGTERM: a pod deletion, a drain) is a handover, not a
// crash: in asynchronous mode, with a writer on a persistent and a per-statement
// connection through the read-write Service the whole time, no acknowledged row is
// lost, and the writes resume on a standby that had the old primary's final WAL.
func TestGracefulStopHandsOverWithoutLoss(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	old := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1, Interval: 5 * time.Millisecond,
		PerStatementInterval: 100 * time.Millisecond})
	// A backend busy with a long query never looks whether its postmaster is still
	// alive: the handover must kill it too, or it outlives the agent.
	busy, err := old.conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close(context.Background())
	go func() {
		_, _ = busy.Exec(context.Background(), "SELECT count(*) FROM generate_series(1, 1e11::bigint)")
	}()
	time.Sleep(2 * time.Second)
	stopped := time.Now()
	old.stop()
	if left := old.leftovers(); len(left) > 0 {
		t.Errorf("postgres processes of %s outlived its handover: %v", old.pod, left)
	}
	var next *instance
	testutil.Eventually(t, time.Minute, func() error {
		if next = c.readWrite(); next == nil || next == old {
			return errors.New("the read-write Service does not route to a new primary yet")
		}
		return nil
	})
	next.waitRole(agentapi.RolePrimary, 2, time.Minute)
	time.Sleep(2 * time.Second)
	attempts := w.Stop()

	check := next.checkAcked(attempts)
	gap := testutil.Unavailability(attempts, stopped, time.Now())
	t.Logf("graceful stop of %s: %d of %d attempts acknowledged, writes unavailable for %s, %s promoted",
		old.pod, check.Acked, check.Attempted, gap.Duration().Round(time.Millisecond), next.pod)
	if len(check.Lost) > 0 {
		t.Errorf("%d acknowledged rows lost in a graceful handover: %v", len(check.Lost), check.Lost)
	}
	if !c.hasEvent(dbv1.ReasonFailoverCompleted) {
		t.Error("no FailoverCompleted event for the handover")
	}
}

// A partitioned old primary, its agent unreachable but postgres alive, is fenced out
// of the read-write Service: after the failover no write through the Service reaches
// it, and when its agent is back it stops, rewinds and rejoins as a replica.
func TestPartitionedOldPrimaryIsFencedOut(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	old := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE t (id bigserial PRIMARY KEY, via text)"); err != nil {
		t.Fatal(err)
	}
	// The agent freezes (as if its network were cut); postgres keeps running.
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.cmd.Process.Signal(syscall.SIGCONT) }()
	testutil.Eventually(t, time.Minute, func() error {
		if rw := c.readWrite(); rw == nil || rw == old {
			return errors.New("no new primary behind the read-write Service yet")
		}
		return nil
	})
	// For a while, every write through the Service lands on the new primary, while the
	// old postmaster is still up.
	for i := range 20 {
		rw := c.readWrite()
		if rw == old {
			t.Fatalf("write %d: the read-write Service routes to the partitioned old primary", i)
		}
		if rw != nil {
			_ = rw.exec("INSERT INTO t (via) VALUES ($1)", rw.pod)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if old.postmasterPid() == 0 {
		t.Fatal("the old postmaster is not running: the test did not partition anything")
	}
	if got := c.podRole(old); got != dbv1.RoleFenced {
		t.Errorf("the old primary's pod is labelled %q, want fenced", got)
	}
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	if n, err := old.count("t"); err != nil || n == 0 {
		t.Errorf("the rejoined old primary has %d rows (%v)", n, err)
	}
}

// A switchover to a named replica: the primary is demoted after its WAL reached the
// standbys, the target promoted, the old primary rejoins; every acknowledged write is
// there, and writes are unavailable only briefly.
func TestSwitchover(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	old, target := c.instances[0], c.instances[2]
	if err := c.writeThroughRW("CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	// A refused request: the target does not exist.
	c.annotate(dbv1.AnnotationSwitchoverTo, c.name+"-9")
	testutil.Eventually(t, 30*time.Second, func() error {
		if !c.hasEvent(dbv1.ReasonSwitchoverRefused) {
			return errors.New("no SwitchoverRefused event")
		}
		return nil
	})
	if rw := c.readWrite(); rw != old {
		t.Fatalf("a refused switchover moved the primary to %v", rw)
	}

	w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1, Interval: 5 * time.Millisecond,
		PerStatementInterval: 100 * time.Millisecond})
	time.Sleep(time.Second) // writes flow before the switchover
	asked := time.Now()
	c.annotate(dbv1.AnnotationSwitchoverTo, target.pod)
	testutil.Eventually(t, time.Minute, func() error {
		if rw := c.readWrite(); rw != target {
			return fmt.Errorf("the read-write Service routes to %v", rw)
		}
		return nil
	})
	time.Sleep(time.Second) // writes flow after it
	attempts := w.Stop()
	gap := testutil.Unavailability(attempts, asked, time.Now())
	target.waitRole(agentapi.RolePrimary, 2, 30*time.Second)
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	// Ready, and a standby: neither is a primary still getting ready (which the
	// operator gives its first seconds).
	for _, in := range []*instance{target, old} {
		if st, err := in.status(); err != nil || st.PromotingForMillis != 0 {
			t.Errorf("%s reports a promotion under way for %d ms (%v)", in.pod, st.PromotingForMillis, err)
		}
	}
	check := target.checkAcked(attempts)
	t.Logf("switchover: writes unavailable for %s at most; %d of %d writes acknowledged",
		gap.Duration().Round(10*time.Millisecond), check.Acked, check.Attempted)
	if len(check.Lost) > 0 {
		t.Errorf("%d acknowledged rows lost in a switchover: %v", len(check.Lost), check.Lost)
	}
	if !c.hasEvent(dbv1.ReasonSwitchedOver) {
		t.Error("no SwitchedOver event")
	}
	var pgc dbv1.PostgresCluster
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
		t.Fatal(err)
	}
	if _, ok := pgc.Annotations[dbv1.AnnotationSwitchoverTo]; ok {
		t.Error("the switchover request annotation was not removed")
	}
}

// annotate sets an annotation on the cluster, as kubectl annotate would.
func (c *cluster) annotate(key, value string) {
	c.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return err
		}
		metav1.SetMetaDataAnnotation(&pgc.ObjectMeta, key, value)
		return k8s.Update(context.Background(), &pgc)
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

// holder is who the primary Lease names now.
func (c *cluster) holder() string {
	var l coordinationv1.Lease
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: dbv1.NamesOf(c.name).PrimaryLease()}, &l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// The operator stopped in the middle of a failover (right after it moved the Lease)
// and started again: the cluster converges to one primary that takes writes through
// the read-write Service, and the others follow it.
func TestOperatorKilledMidFailoverConverges(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	old := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE t (id int)"); err != nil {
		t.Fatal(err)
	}
	// The table is on the standbys before the kill: in asynchronous mode a commit
	// acknowledged a moment before a kill -9 may be lost (docs/failover.md), and this
	// test is of the operator's restart, not of that.
	for _, in := range c.instances[1:] {
		testutil.Eventually(t, time.Minute, func() error {
			var exists bool
			err := in.query("SELECT to_regclass('t') IS NOT NULL", &exists)
			if err == nil && !exists {
				err = fmt.Errorf("%s has no table t yet", in.pod)
			}
			return err
		})
	}
	old.kill9()
	// Stop the operator the moment the Lease no longer names the old primary: it was
	// revoked (the standbys are being frozen) or already moved.
	deadline := time.Now().Add(time.Minute)
	for c.holder() == old.pod {
		if time.Now().After(deadline) {
			t.Fatal("the Lease never moved")
		}
		time.Sleep(time.Millisecond)
	}
	c.stopOperator()
	t.Logf("operator stopped with the Lease naming %q", c.holder())
	c.startOperator()
	var next string
	testutil.Eventually(t, time.Minute, func() error {
		if next = c.holder(); next == "" || next == old.pod {
			return fmt.Errorf("the Lease names %q", next)
		}
		rw := c.readWrite()
		if rw == nil || rw.pod != next {
			return fmt.Errorf("the read-write Service routes to %v, the Lease names %s", rw, next)
		}
		return c.writeThroughRW("INSERT INTO t VALUES (1)")
	})
	primaries := 0
	for _, in := range c.instances {
		if in == old {
			continue
		}
		if in.mustStatus().Role == agentapi.RolePrimary {
			primaries++
		}
	}
	if primaries != 1 {
		t.Errorf("%d primaries after the operator came back", primaries)
	}
	for _, in := range c.instances {
		if in != old && in.pod != next {
			in.waitRole(agentapi.RoleReplica, 2, time.Minute)
		}
	}
}

// The new primary dies right after a failover: the operator fails over again, to the
// last replica, and the cluster takes writes without losing an acknowledged one
// (synchronous mode); then both dead instances rejoin and catch up.
func TestNewPrimaryKilledRightAfterFailover(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3, func(p *dbv1.PostgresCluster) { p.Spec.PostgreSQL.SynchronousReplicas = 1 })
	startOperated(t, c)
	first := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE t (id int)"); err != nil {
		t.Fatal(err)
	}
	first.kill9()
	var second *instance
	testutil.Eventually(t, time.Minute, func() error {
		second = c.readWrite()
		if second == nil || second == first {
			return errors.New("no new primary yet")
		}
		return c.writeThroughRW("INSERT INTO t VALUES (1)")
	})
	second.kill9()
	var third *instance
	testutil.Eventually(t, 2*time.Minute, func() error {
		third = c.readWrite()
		if third == nil || third == first || third == second {
			return fmt.Errorf("the read-write Service routes to %v", third)
		}
		return nil
	})
	// The row acknowledged by the second primary is on the third.
	if n, err := third.count("t"); err != nil || n != 1 {
		t.Errorf("the third primary has %d rows (%v), want the acknowledged 1", n, err)
	}
	// Commits wait for a synchronous standby: both others are down until they rejoin.
	// An attempt that times out waiting may still commit (locally first, on the
	// standbys once they are back), so row 2 may be there more than once.
	first.start()
	second.start()
	testutil.Eventually(t, 2*time.Minute, func() error { return c.writeThroughRW("INSERT INTO t VALUES (2)") })
	if n := third.countWhere("t", "id = 2"); n == 0 {
		t.Fatalf("the acknowledged row 2 is not on the primary %s", third.pod)
	}
	want := third.rows("t")
	for _, in := range []*instance{first, second} {
		in.waitRole(agentapi.RoleReplica, 0, upTimeout)
		// An instance that could not be rewound is cloned again, possibly while the
		// commit of row 2 still waited for a synchronous standby: the clone's checkpoint
		// then records that transaction as running, and a hot standby shows its row
		// only once a later running-transactions record says it ended, which an idle
		// primary writes at its next checkpoint.
		if err := third.superExec("CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		in.waitRows("t", want, time.Minute)
	}
}

// A primary whose restarts keep failing before a postmaster runs (here its data
// directory cannot be read as one) is in a crash loop like one whose postmaster keeps
// dying: in asynchronous mode the operator fails over after three failed starts, not
// after spec.failover.startTimeout (set to ten minutes here, so that only the crash
// count can explain a failover); once the fault is gone the old primary rejoins.
func TestPrimaryWhoseStartsFailIsFailedOver(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3, func(p *dbv1.PostgresCluster) {
		p.Spec.Failover.StartTimeout = &metav1.Duration{Duration: 10 * time.Minute}
	})
	startOperated(t, c)
	old := c.instances[0]
	if err := c.writeThroughRW("CREATE TABLE t AS SELECT generate_series(1, 10) AS id"); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.instances[1:] {
		r.waitCount("t", 10, 30*time.Second)
	}

	version := filepath.Join(old.dir, "pgdata", "PG_VERSION")
	aside := filepath.Join(old.dir, "PG_VERSION.aside")
	if err := os.Rename(version, aside); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(old.postmasterPid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var next *instance
	testutil.Eventually(t, 2*time.Minute, func() error {
		next = c.readWrite()
		if next == nil || next == old {
			return fmt.Errorf("the read-write Service routes to %v", next)
		}
		return c.writeThroughRW("INSERT INTO t VALUES (11)")
	})
	if msg := c.eventMessage(dbv1.ReasonFailoverStarted); !strings.Contains(msg, "times within a minute") {
		t.Errorf("FailoverStarted event %q, want it to name the crash loop", msg)
	}

	if err := os.Rename(aside, version); err != nil {
		t.Fatal(err)
	}
	old.waitRole(agentapi.RoleReplica, 2, 2*time.Minute)
	old.waitCount("t", 11, 30*time.Second)
}

// eventMessage is the message of the cluster's latest event with reason, "" when none.
func (c *cluster) eventMessage(reason string) string {
	msg, last := "", time.Time{}
	for _, e := range c.events(reason) {
		if !e.LastTimestamp.Time.Before(last) {
			msg, last = e.Message, e.LastTimestamp.Time
		}
	}
	return msg
}

// Deleting the primary Lease loses the record of who may write, not the data: the
// operator rebuilds it from the agents' views, naming the primary they follow in the
// same term. The test deletes it while that primary is not instance 0 and instance 0's
// volume is empty, the case where a new cluster's Lease (instance 0, not bootstrapped)
// would have run initdb over the cluster and discarded every row. A writer runs
// throughout: no acknowledged row may be lost, and instance 0 must come back as a
// replica of the same database.
func TestDeletedLeaseIsRebuiltFromTheAgents(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	startOperated(t, c)
	first, primary := c.instances[0], c.instances[1]
	if err := c.writeThroughRW("CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	c.annotate(dbv1.AnnotationSwitchoverTo, primary.pod)
	testutil.Eventually(t, time.Minute, func() error {
		if rw := c.readWrite(); rw != primary {
			return fmt.Errorf("the read-write Service routes to %v", rw)
		}
		return nil
	})
	before := c.leaseRecord()
	want := primary.waitRole(agentapi.RolePrimary, 0, time.Minute)

	first.stop()
	entries, err := os.ReadDir(filepath.Join(first.dir, "pgdata"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(first.dir, "pgdata", e.Name())); err != nil {
			t.Fatal(err)
		}
	}

	w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1, Interval: 5 * time.Millisecond,
		PerStatementInterval: 100 * time.Millisecond})
	time.Sleep(time.Second)
	deleted := time.Now()
	if err := kube.CoordinationV1().Leases(c.namespace).Delete(context.Background(), dbv1.NamesOf(c.name).PrimaryLease(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	first.start()
	var after primarylease.Record
	testutil.Eventually(t, time.Minute, func() error {
		var err error
		if after, err = c.leaseRecordErr(); err != nil {
			return err
		}
		if after.Holder != primary.pod || after.Term != before.Term || !after.Bootstrapped {
			return fmt.Errorf("the recreated Lease names %q in term %d (bootstrapped %v); want %s in term %d, bootstrapped",
				after.Holder, after.Term, after.Bootstrapped, primary.pod, before.Term)
		}
		return nil
	})
	st := first.waitRole(agentapi.RoleReplica, 0, upTimeout)
	if st.SystemIdentifier != want.SystemIdentifier {
		t.Errorf("%s came back with system identifier %s, the primary's is %s: a new database", first.pod, st.SystemIdentifier, want.SystemIdentifier)
	}
	time.Sleep(2 * time.Second)
	attempts := w.Stop()

	check := primary.checkAcked(attempts)
	gap := testutil.Unavailability(attempts, deleted, time.Now())
	t.Logf("Lease deleted: %d of %d attempts acknowledged, longest write gap %s; %s rejoined with the primary's system identifier",
		check.Acked, check.Attempted, gap.Duration().Round(time.Millisecond), first.pod)
	if len(check.Lost) > 0 {
		t.Errorf("%d acknowledged rows lost after the Lease was deleted: %v", len(check.Lost), check.Lost)
	}
	if !c.hasEvent(dbv1.ReasonPrimaryLeaseRecreated) {
		t.Error("no PrimaryLeaseRecreated event")
	}
}

// leaseRecord is the primary Lease, parsed.
func (c *cluster) leaseRecord() primarylease.Record {
	c.t.Helper()
	r, err := c.leaseRecordErr()
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

func (c *cluster) leaseRecordErr() (primarylease.Record, error) {
	var l coordinationv1.Lease
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: dbv1.NamesOf(c.name).PrimaryLease()}, &l); err != nil {
		return primarylease.Record{}, err
	}
	return primarylease.Parse(&l), nil
}

// rwTarget is a writer's target: the instance the read-write Service routes to now.
func (c *cluster) rwTarget(context.Context) (*pgx.ConnConfig, error) {
	in := c.readWrite()
	if in == nil {
		return nil, errors.New("the read-write Service has no single ready endpoint")
	}
	return in.connConfig()
}

// checkAcked reads the writer's table "acked" on the instance and checks it against
// attempts; it fails the test when the rows cannot be read or no commit was
// acknowledged at all (a check of nothing).
func (in *instance) checkAcked(attempts []testutil.Attempt) testutil.RowCheck {
	t := in.c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	check, err := testutil.CheckRows(ctx, conn, "acked", attempts)
	if err != nil {
		t.Fatal(err)
	}
	if check.Acked == 0 {
		t.Fatal("the writer had no commit acknowledged")
	}
	return check
}
