package agent

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A read that answers late with an older Lease must not undo a newer view.
func TestLeaseViewIgnoresOlderReads(t *testing.T) {
	lease := func(version, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: version},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)},
		}
	}
	f := NewLeaseFollower(nil, "ns", "db-primary", logr.Discard())
	f.set(lease("10", "db-0"))
	f.set(lease("12", "db-1"))
	f.set(lease("11", "db-0"))
	if got := f.View().Holder; got != "db-1" {
		t.Errorf("holder after a stale read = %q, want db-1", got)
	}
	f.set(lease("13", "db-2"))
	if got := f.View().Holder; got != "db-2" {
		t.Errorf("holder after a newer read = %q, want db-2", got)
	}
	f.set(lease("not-a-number", "db-0"))
	if got := f.View().Holder; got != "db-0" {
		t.Errorf("an unversioned read is taken as newest; holder = %q", got)
	}
}

// The follower says when it first read each renewal, once it has seen one happen: the
// first read after a start says nothing about when the renewal was made, a new
// renewTime does, and reading the same one again (a revocation keeps it) or a stale
// read does not move it.
func TestLeaseFollowerRenewalSeen(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	lease := func(version string, renewed time.Time, holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: version},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: renewed}},
		}
	}
	f := NewLeaseFollower(nil, "ns", "db-primary", logr.Discard())
	f.set(lease("10", t0, "db-0"))
	if _, _, ok := f.RenewalSeen(); ok {
		t.Fatal("the first read counts as a renewal seen happen")
	}
	before := time.Now()
	f.set(lease("11", t0.Add(time.Second), "db-0"))
	renewTime, seen, ok := f.RenewalSeen()
	if !ok || !renewTime.Equal(t0.Add(time.Second)) || seen.Before(before) {
		t.Fatalf("after a renewal: %s first read at %s (ok %v), want %s read after %s", renewTime, seen, ok, t0.Add(time.Second), before)
	}
	f.set(lease("12", t0.Add(time.Second), "")) // revoked: the same renewTime
	f.set(lease("9", t0.Add(3*time.Second), "db-0"))
	if r, s, ok := f.RenewalSeen(); !ok || !r.Equal(renewTime) || !s.Equal(seen) {
		t.Errorf("after the same renewal and a stale read: %s at %s (ok %v), want %s at %s", r, s, ok, renewTime, seen)
	}
}
