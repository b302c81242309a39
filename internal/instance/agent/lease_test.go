package agent

import (
	"testing"

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
