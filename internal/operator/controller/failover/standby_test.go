package failover

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

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
