package agent

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// termLease is a LeaseSource whose view is set by the test; only View and RenewalSeen
// (which Status reads) are used here.
type termLease struct {
	LeaseSource
	view LeaseView
}

func (l *termLease) View() LeaseView { return l.view }

func (l *termLease) RenewalSeen() (time.Time, time.Time, bool) {
	return time.Time{}, time.Time{}, false
}

// A crash loop counts the crashes of the Lease's current term only: an instance that
// crash-looped as the primary and is named primary again in a later term (after a
// failover away and back) starts with none, or it would be failed over at once.
func TestRecentCrashesCountTheCurrentTermOnly(t *testing.T) {
	lease := &termLease{view: LeaseView{Known: true, Holder: "db-0", Term: 4}}
	a := New(Config{PodName: "db-0", PGData: t.TempDir(), BinDir: t.TempDir()}, clusterconfig.Config{}, pgconf.Credentials{}, lease, logr.Discard())
	for range 3 {
		a.crashed()
	}
	if got := a.Status(context.Background()).RecentCrashes; got != 3 {
		t.Fatalf("RecentCrashes in the crashes' term = %d, want 3", got)
	}
	lease.view = LeaseView{Known: true, Holder: "", Term: 5, Handover: &primarylease.Handover{From: "db-0"}}
	a.crashed()
	lease.view = LeaseView{Known: true, Holder: "db-0", Term: 6}
	st := a.Status(context.Background())
	if st.RecentCrashes != 0 || st.FirstRecentCrashMillisAgo != 0 {
		t.Errorf("RecentCrashes in a later term = %d (first %d ms ago), want 0", st.RecentCrashes, st.FirstRecentCrashMillisAgo)
	}
	a.crashed()
	if got := a.Status(context.Background()).RecentCrashes; got != 1 {
		t.Errorf("RecentCrashes after a crash in the new term = %d, want 1", got)
	}
}
