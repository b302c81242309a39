package failover

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// What a standby replica records of the renewals its informer delivers is what I2's
// wait counts from once it leads: the first read is not a renewal seen happen, a new
// renewal time is, and the same one delivered again (a resync, another field changed)
// does not move when it was seen.
func TestSawLeaseRecordsRenewals(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	r := NewReconciler(nil, nil, nil, clk, nil)
	key := types.NamespacedName{Namespace: "db", Name: "my-db"}
	lease := primarylease.New("db", "my-db-primary", "my-db", "my-db-0", t0.Add(-300*time.Millisecond))
	renewed := func(l *coordinationv1.Lease, at time.Time) *coordinationv1.Lease {
		l = l.DeepCopy()
		l.Spec.RenewTime = &metav1.MicroTime{Time: at}
		return l
	}
	check := func(step string, seen time.Time, observed bool) {
		t.Helper()
		r.mu.Lock()
		m := r.memory[key]
		r.mu.Unlock()
		if m == nil {
			t.Fatalf("%s: nothing recorded for %s", step, key)
		}
		if !m.renewSeen.Equal(seen) || m.renewObserved != observed {
			t.Errorf("%s: seen at %s (observed %v), want %s (observed %v)", step,
				m.renewSeen.Format(time.StampMilli), m.renewObserved, seen.Format(time.StampMilli), observed)
		}
	}

	r.sawLease(lease)
	check("first read", t0, false)

	t1 := t0.Add(time.Second)
	clk.SetTime(t1)
	lease = renewed(lease, t1.Add(-100*time.Millisecond))
	r.sawLease(lease)
	check("a renewal", t1, true)

	clk.SetTime(t1.Add(2 * time.Second))
	again := lease.DeepCopy()
	again.Annotations = map[string]string{"example": "changed"}
	r.sawLease(again)
	check("the same renewal delivered again", t1, true)

	// A Lease of no cluster, or not a Lease, records nothing.
	r.sawLease(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "other"}})
	r.sawLease("not a lease")
	r.mu.Lock()
	n := len(r.memory)
	r.mu.Unlock()
	if n != 1 {
		t.Errorf("%d clusters remembered, want only %s", n, key)
	}
}

// A controller that just started (or took over) bounds the holder's last renewal by
// the earliest sight of it among the agents that answered; a sight of another renewal,
// an agent that did not answer, or one that never saw the renewal change, says nothing.
func TestAgentsSawRenewal(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	renewTime := t0.Add(-7 * time.Second) // the holder's clock: never compared with ours
	saw := func(name string, reachable bool, renewed time.Time, agoMillis int64) Instance {
		in := Instance{Name: name, Reachable: reachable}
		if !renewed.IsZero() {
			in.Status.RenewalSeen = &agentapi.RenewalSeen{RenewTime: renewed, AgoMillis: agoMillis}
		}
		return in
	}
	cases := []struct {
		name      string
		instances []Instance
		want      time.Time
	}{
		{"the earliest of two sights", []Instance{saw("db-1", true, renewTime, 3500), saw("db-2", true, renewTime, 1200)}, t0.Add(-3500 * time.Millisecond)},
		{"an agent that did not answer", []Instance{saw("db-1", false, renewTime, 3500), saw("db-2", true, renewTime, 1200)}, t0.Add(-1200 * time.Millisecond)},
		{"a sight of another renewal", []Instance{saw("db-1", true, renewTime.Add(time.Second), 3500)}, time.Time{}},
		{"no sight", []Instance{saw("db-1", true, time.Time{}, 0)}, time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			at, ok := EarliestSighting(renewTime, tc.instances, t0)
			if ok != !tc.want.IsZero() || !at.Equal(tc.want) {
				t.Errorf("EarliestSighting = %s (ok %v), want %s", at, ok, tc.want)
			}
		})
	}

	// In the cycle: the controller's own first read (not a renewal seen happen) gives
	// way to an earlier sight, and the result counts as a renewal seen happen; a later
	// sight changes nothing.
	clk := clocktesting.NewFakePassiveClock(t0)
	r := NewReconciler(nil, nil, nil, clk, nil)
	c := &cycle{r: r, mem: r.remember(types.NamespacedName{Namespace: "db", Name: "my-db"})}
	c.noteRenewal(primarylease.Record{Holder: "db-0", RenewTime: renewTime})
	c.agentsSawRenewal([]Instance{saw("db-1", true, renewTime, 400)})
	if !c.mem.renewSeen.Equal(t0.Add(-400*time.Millisecond)) || !c.mem.renewObserved {
		t.Errorf("after a sight 400 ms old: seen at %s (observed %v), want %s (observed)", c.mem.renewSeen, c.mem.renewObserved, t0.Add(-400*time.Millisecond))
	}
	clk.SetTime(t0.Add(time.Second))
	c.agentsSawRenewal([]Instance{saw("db-2", true, renewTime, 100)})
	if !c.mem.renewSeen.Equal(t0.Add(-400 * time.Millisecond)) {
		t.Errorf("a later sight moved the renewal to %s", c.mem.renewSeen)
	}
}
