//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// Day-2 operations that move the primary, on the README's example cluster: a node drain
// evicts the primary (the Eviction API call kubectl drain makes), and a scale-down
// removes the instance that is the primary. Each costs one handover and no
// acknowledged row.
func TestDrainAndScaleDown(t *testing.T) {
	d := newDB(t, 3)
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, time.Minute)
	w := d.newTable()
	w.insert(100)

	old := d.cluster().Status.CurrentPrimary
	other := d.otherThan(old)
	t.Logf("evicting the primary %s as kubectl drain does", old)
	now := ""
	gap := w.continuously(func() {
		if err := evict(d.ns, old, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		// One instance at a time: while the primary's pod is going, the budget refuses
		// the eviction of another.
		if err := evictOnce(d.ns, other); !apierrors.IsTooManyRequests(err) {
			t.Errorf("evicting %s while %s is evicted: %v, want 429 Too Many Requests from the disruption budget", other, old, err)
		}
		now = d.waitNewPrimary(old, time.Minute)
		w.untilWritable(time.Now(), time.Minute)
	})
	t.Logf("drain: %s took over from %s; writes through -rw unavailable for %s (longest gap between acknowledged inserts)",
		now, old, gap.Round(10*time.Millisecond))
	d.waitReplica(old, 3, 5*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	w.insert(10)
	w.check()

	// The primary on the highest ordinal, then a scale-down to one instance: it must
	// move to instance 0 once, not fail over, and not pass through instance 1.
	last := d.name + "-2"
	if d.cluster().Status.CurrentPrimary != last {
		d.switchover(last)
		d.waitStreaming(2, 2*time.Minute)
	}
	primaries := d.watchPrimaries()
	t.Logf("scaling down to one instance with %s as the primary", last)
	gap = w.continuously(func() {
		d.update(func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 1 })
		d.waitNewPrimary(last, 2*time.Minute)
		w.untilWritable(time.Now(), time.Minute)
	})
	testutil.Eventually(t, 5*time.Minute, func() error {
		var sts appsv1.StatefulSet
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &sts); err != nil {
			return err
		}
		pods := d.pods()
		pgc := d.cluster()
		if *sts.Spec.Replicas != 1 || len(pods) != 1 || pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.CurrentPrimary != d.name+"-0" {
			return fmt.Errorf("StatefulSet replicas %d, %d pods, phase %s, primary %q", *sts.Spec.Replicas, len(pods), pgc.Status.Phase, pgc.Status.CurrentPrimary)
		}
		return nil
	})
	seen := primaries()
	t.Logf("scale-down: primaries seen %v; writes through -rw unavailable for %s (longest gap between acknowledged inserts)",
		seen, gap.Round(10*time.Millisecond))
	if want := []string{last, d.name + "-0"}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("primaries during the scale-down %v, want %v: one switchover to an instance that stays", seen, want)
	}
	if !d.hasEvent(dbv1.ReasonSwitchingOverForScaleDown) {
		t.Errorf("no %s event", dbv1.ReasonSwitchingOverForScaleDown)
	}
	if d.hasEvent(dbv1.ReasonFailoverStarted) {
		t.Errorf("a failover started during the drain or the scale-down")
	}
	w.insert(10)
	if check := d.checkRows("t", w.attempts); len(check.Lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost: ids %v", len(check.Lost), check.Acked, check.Lost)
	}
}

// continuously inserts rows through -rw, one at a time with no pause, over one
// connection that it opens again when it breaks (as an application's pool would),
// from its first acknowledged insert (fn starts only then), while fn runs, and until
// one of its inserts started after fn returned is acknowledged
// (at most a minute more); it returns the longest time between two acknowledged
// inserts: how long writes were unavailable. Every insert is recorded like any other
// attempt.
func (w *writes) continuously(fn func()) time.Duration {
	stop := make(chan time.Time, 1)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan []testutil.Attempt)
	first := w.next + 1_000_000*int64(len(w.attempts)+1)
	go func() {
		var attempts []testutil.Attempt
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				_ = conn.Close(context.Background())
			}
		}()
		var stopAt time.Time
		for id := first; ; id++ {
			if stopAt.IsZero() {
				select {
				case stopAt = <-stop:
				default:
				}
			}
			if n := len(attempts); !stopAt.IsZero() && (n > 0 && attempts[n-1].Acked() && attempts[n-1].Start.After(stopAt) ||
				time.Since(stopAt) > time.Minute) {
				done <- attempts
				return
			}
			a := testutil.Attempt{ID: id, Start: time.Now()}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if conn == nil {
				conn, a.Err = w.d.conn(ctx, "rw")
			}
			if a.Err == nil {
				_, a.Err = conn.Exec(ctx, "INSERT INTO t (id) VALUES ($1)", a.ID)
			}
			cancel()
			a.End = time.Now()
			attempts = append(attempts, a)
			if a.Acked() {
				once.Do(func() { close(started) })
			}
			if a.Err != nil {
				if conn != nil {
					_ = conn.Close(context.Background())
					conn = nil
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	// The gaps are measured from the writer's first acknowledged insert, before fn.
	testutil.Eventually(w.d.t, 30*time.Second, func() error {
		select {
		case <-started:
			return nil
		default:
			return fmt.Errorf("no insert of the writer acknowledged yet")
		}
	})
	fn()
	stop <- time.Now()
	attempts := <-done
	w.attempts = append(w.attempts, attempts...)
	var longest time.Duration
	var last time.Time
	for _, a := range attempts {
		if !a.Acked() {
			continue
		}
		if !last.IsZero() && a.End.Sub(last) > longest {
			longest = a.End.Sub(last)
		}
		last = a.End
	}
	return longest
}

// evict asks the Eviction API to evict pod, retrying while a disruption budget refuses
// (429), every 5 s, as kubectl drain does.
func evict(ns, pod string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := evictOnce(ns, pod)
		if !apierrors.IsTooManyRequests(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Second)
	}
}

func evictOnce(ns, pod string) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}
	return k8s.SubResource("eviction").Create(context.Background(), p, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod},
	})
}

// switchover moves the primary to target through the annotation and waits for it.
func (d *db) switchover(target string) {
	d.t.Helper()
	d.update(func(c *dbv1.PostgresCluster) {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[dbv1.AnnotationSwitchoverTo] = target
	})
	testutil.Eventually(d.t, 2*time.Minute, func() error {
		pgc := d.cluster()
		if _, pending := pgc.Annotations[dbv1.AnnotationSwitchoverTo]; pending || pgc.Status.CurrentPrimary != target {
			return fmt.Errorf("primary %s, annotations %v", pgc.Status.CurrentPrimary, pgc.Annotations)
		}
		return nil
	})
}

// watchPrimaries records every primary status.currentPrimary names, polled every
// 100 ms, until the returned function is called; it returns them in order, without
// repeats or the empty moments in between.
func (d *db) watchPrimaries() func() []string {
	var (
		mu   sync.Mutex
		seen []string
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var pgc dbv1.PostgresCluster
			if k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc) == nil {
				mu.Lock()
				if p := pgc.Status.CurrentPrimary; p != "" && (len(seen) == 0 || seen[len(seen)-1] != p) {
					seen = append(seen, p)
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() []string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// hasEvent is whether the cluster has an event of reason.
func (d *db) hasEvent(reason string) bool { return len(d.events(reason)) > 0 }

// events are the cluster's events of reason.
func (d *db) events(reason string) []corev1.Event {
	d.t.Helper()
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(d.ns)); err != nil {
		d.t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.Name == d.name {
			out = append(out, e)
		}
	}
	return out
}

// Fencing and hibernation on the README's example cluster: a fenced standby stops and
// stays stopped (its pod recreated too) and rejoins when unfenced; a fenced primary hands
// over first; a stopped cluster keeps its data, volumes and primary, and resumes on them
// with every acknowledged row.
func TestFencingAndHibernation(t *testing.T) {
	d := newDB(t, 3)
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, time.Minute)
	w := d.newTable()
	w.insert(50)
	primary := d.cluster().Status.CurrentPrimary
	standby := d.otherThan(primary)

	t.Logf("fencing the standby %s", standby)
	d.fence(standby)
	d.waitFenced(standby, 2*time.Minute)
	d.waitStreaming(1, time.Minute)
	w.insert(10)
	old := d.pod(standby).UID
	if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: standby}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*time.Minute, func() error {
		p, err := d.getPod(standby)
		if err != nil {
			return err
		}
		if p.UID == old || p.Status.PodIP == "" {
			return fmt.Errorf("%s not recreated yet", standby)
		}
		return nil
	})
	d.waitFenced(standby, 2*time.Minute) // its new pod's postgres stays down too
	t.Logf("unfencing %s", standby)
	d.fence("")
	d.waitReplica(standby, 3, 3*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	w.check()

	t.Logf("fencing the primary %s", primary)
	var now string
	gap := w.continuously(func() {
		d.fence(primary)
		now = d.waitNewPrimary(primary, 2*time.Minute)
		w.untilWritable(time.Now(), time.Minute)
	})
	d.waitFenced(primary, 2*time.Minute)
	t.Logf("the fenced primary %s handed over to %s; writes through -rw unavailable for %s", primary, now, gap.Round(10*time.Millisecond))
	if d.hasEvent(dbv1.ReasonFailoverStarted) {
		t.Error("fencing the primary started a failover, not a switchover")
	}
	d.fence("")
	d.waitReplica(primary, 3, 3*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	w.insert(10)
	w.check()

	holder := d.cluster().Status.CurrentPrimary
	t.Logf("stopping the cluster (spec.stopped); %s is the primary", holder)
	stopAt := time.Now()
	d.update(func(c *dbv1.PostgresCluster) { c.Spec.Stopped = true })
	testutil.Eventually(t, 3*time.Minute, func() error {
		pgc := d.cluster()
		c := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionHibernated)
		if pgc.Status.Phase != dbv1.PhaseStopped || c == nil || c.Status != metav1.ConditionTrue || len(d.pods()) != 0 {
			return fmt.Errorf("phase %s, Hibernated %+v, %d pods", pgc.Status.Phase, c, len(d.pods()))
		}
		return nil
	})
	t.Logf("stopped in %s: %s", time.Since(stopAt).Round(100*time.Millisecond), dbv1.FindCondition(d.cluster().Status.Conditions, dbv1.ConditionHibernated).Message)
	var claims corev1.PersistentVolumeClaimList
	if err := k8s.List(context.Background(), &claims, client.InNamespace(d.ns)); err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 3 {
		t.Errorf("%d volume claims while stopped, want the 3 instances'", len(claims.Items))
	}
	if lease := d.lease(); primarylease.Parse(&lease).Holder != holder {
		t.Errorf("while stopped the primary Lease names %q, want %s", primarylease.Parse(&lease).Holder, holder)
	}

	t.Log("resuming the cluster")
	resumeAt := time.Now()
	d.update(func(c *dbv1.PostgresCluster) { c.Spec.Stopped = false })
	pgc := d.waitHealthy(3, 5*time.Minute)
	t.Logf("resumed in %s", time.Since(resumeAt).Round(100*time.Millisecond))
	if pgc.Status.CurrentPrimary != holder {
		t.Errorf("resumed with %s as the primary, want %s, the primary before the stop", pgc.Status.CurrentPrimary, holder)
	}
	if d.hasEvent(dbv1.ReasonFailoverStarted) {
		t.Error("a failover started while stopping or resuming")
	}
	d.waitStreaming(2, 2*time.Minute)
	testutil.Eventually(t, time.Minute, func() error {
		c := dbv1.FindCondition(d.cluster().Status.Conditions, dbv1.ConditionHibernated)
		if c == nil || c.Reason != dbv1.ReasonResumed {
			return fmt.Errorf("Hibernated %+v", c)
		}
		return nil
	})
	w.insert(10)
	w.check()
}

// fence sets the cluster's fenced instances ("" unfences every one).
func (d *db) fence(pods string) {
	d.t.Helper()
	d.update(func(c *dbv1.PostgresCluster) {
		if pods == "" {
			delete(c.Annotations, dbv1.AnnotationFencedInstances)
			return
		}
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[dbv1.AnnotationFencedInstances] = pods
	})
}

// waitFenced waits until pod is labelled fenced and its agent reports postgres stopped.
func (d *db) waitFenced(pod string, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		p, err := d.getPod(pod)
		if err != nil {
			return err
		}
		if role := p.Labels[dbv1.LabelRole]; role != dbv1.RoleFenced {
			return fmt.Errorf("%s is labelled %q", pod, role)
		}
		st, err := d.agentStatus(pod)
		if err != nil {
			return err
		}
		if st.Running {
			return fmt.Errorf("%s's postgres runs (%s)", pod, st.Role)
		}
		return nil
	})
}

// lease is the cluster's primary Lease.
func (d *db) lease() coordinationv1.Lease {
	d.t.Helper()
	var l coordinationv1.Lease
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).PrimaryLease()}, &l); err != nil {
		d.t.Fatal(err)
	}
	return l
}
