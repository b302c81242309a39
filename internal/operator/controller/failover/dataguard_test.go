package failover

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

func TestDataGuardRecordAndEvents(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	refusing := standby("db-0", "", false)
	refusing.Status.Refusal = "refusing to rewind onto db-1: it holds another database"
	keeping := standby("db-1", "", false)
	keeping.Status.SetAside = []agentapi.SetAside{{Name: "pgdata.set-aside-20261124T100000Z", Reason: "pg_rewind failed", At: at, Bytes: 3 << 20}}
	gone := standby("db-2", "", false)
	gone.Reachable = false
	gone.Pod = &corev1.Pod{}

	prev := &report.DataGuard{SetAside: map[string][]string{
		"db-1": {"pgdata.set-aside-20261101T000000Z: older (1 MiB, superseded, removed when the volume needs the space)"},
		"db-2": {"pgdata.set-aside-20261102T000000Z: kept (1 MiB, kept until a newer clone is verified)"},
	}}
	next := NextDataGuard(prev, []Instance{refusing, keeping, gone})
	want := report.DataGuard{
		Refusals: map[string]string{"db-0": "refusing to rewind onto db-1: it holds another database"},
		SetAside: map[string][]string{
			"db-1": {"pgdata.set-aside-20261124T100000Z: pg_rewind failed (3 MiB, kept until a newer clone is verified)"},
			// db-2 does not answer: what it last reported stands.
			"db-2": {"pgdata.set-aside-20261102T000000Z: kept (1 MiB, kept until a newer clone is verified)"},
		},
	}
	if diff := cmp.Diff(want, next); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	var reasons []string
	for _, e := range DataGuardEvents(prev, next, []string{"db-0", "db-1"}) {
		reasons = append(reasons, e.Reason+" "+e.Type)
	}
	wantReasons := []string{
		dbv1.ReasonDataRefused + " Warning",
		dbv1.ReasonDataSetAside + " Warning",
		dbv1.ReasonSetAsideRemoved + " Normal",
	}
	if diff := cmp.Diff(wantReasons, reasons); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// Nothing changed: no event.
	if ev := DataGuardEvents(&next, next, []string{"db-0", "db-1"}); len(ev) != 0 {
		t.Errorf("events without a change: %+v", ev)
	}
}
