package failover

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// Each signal is recorded past its high mark, kept as first recorded down to its low
// mark, and removed under it; an instance that does not answer keeps its record.
func TestNextHealth(t *testing.T) {
	now := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	const gib = int64(1) << 30
	primary := func(conns, limit int, xid int64) Instance {
		return Instance{Name: "db-0", Pod: &corev1.Pod{}, Reachable: true, Status: agentapi.Status{Role: agentapi.RolePrimary,
			Connections: conns, ConnectionLimit: limit, OldestXIDAge: xid, OldestXIDDatabase: "app"}}
	}
	volume := func(name string, usedPct int64, fullIn time.Duration) Instance {
		return Instance{Name: name, Pod: &corev1.Pod{}, Reachable: true, Status: agentapi.Status{Role: agentapi.RoleReplica,
			VolumeBytes: 10 * gib, VolumeFreeBytes: 10 * gib * (100 - usedPct) / 100, VolumeFullInSeconds: int64(fullIn.Seconds())}}
	}
	keys := func(h report.Health) []string {
		var out []string
		for k := range h {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	cases := []struct {
		name      string
		prev      report.Health
		instances []Instance
		want      []string
	}{
		{"all well", nil, []Instance{primary(10, 97, 1e6), volume("db-1", 50, 0)}, nil},
		{"connections past 90%", nil, []Instance{primary(88, 97, 0)}, []string{report.HealthConnections}},
		{"connections at 85% after 90%: kept", report.Health{report.HealthConnections: {Message: "first"}}, []Instance{primary(83, 97, 0)}, []string{report.HealthConnections}},
		{"connections at 85% without a record: none", nil, []Instance{primary(83, 97, 0)}, nil},
		{"connections under 80%: gone", report.Health{report.HealthConnections: {Message: "first"}}, []Instance{primary(70, 97, 0)}, nil},
		{"wraparound risk", nil, []Instance{primary(1, 97, 600_000_000)}, []string{report.HealthWraparound}},
		{"a volume 92% used", nil, []Instance{primary(1, 97, 0), volume("db-1", 92, 0)}, []string{report.HealthVolume + "db-1"}},
		{"a volume that fills within hours", nil, []Instance{volume("db-2", 40, 3*time.Hour)}, []string{report.HealthVolume + "db-2"}},
		{"a volume that fills in a week", nil, []Instance{volume("db-2", 40, 7*24*time.Hour)}, nil},
		{"the primary away: its records kept", report.Health{report.HealthConnections: {Message: "first"}, report.HealthVolume + "db-1": {Message: "v"}},
			[]Instance{{Name: "db-0", Pod: &corev1.Pod{}}, volume("db-1", 92, 0)}, []string{report.HealthConnections, report.HealthVolume + "db-1"}},
		{"the primary's pod gone: its records gone", report.Health{report.HealthConnections: {Message: "first"}},
			[]Instance{{Name: "db-0"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := NextHealth(tc.prev, "db-0", tc.instances, false, now)
			if k := keys(got); !slices.Equal(k, tc.want) {
				t.Errorf("recorded %v, want %v", k, tc.want)
			}
			if old, ok := tc.prev[report.HealthConnections]; ok {
				if p, ok := got[report.HealthConnections]; ok && p.Message != old.Message {
					t.Errorf("a kept record was rewritten: %q", p.Message)
				}
			}
		})
	}
	// While the Lease names no primary, the primary's signals stay as recorded.
	kept := report.Health{report.HealthConnections: {Message: "first"}, report.HealthWraparound: {Message: "old"}}
	if got := NextHealth(kept, "", []Instance{primary(1, 97, 0)}, false, now); len(got) != 2 || got[report.HealthConnections].Message != "first" {
		t.Errorf("no holder: %v, want both records kept", got)
	}
	got := NextHealth(nil, "db-0", []Instance{primary(95, 97, 0), volume("db-1", 95, 2*time.Hour)}, true, now)
	if msg := got[report.HealthConnections].Message; !strings.HasPrefix(msg, "the primary db-0 has 95 client sessions of the 97 it admits (97%)") {
		t.Errorf("connections: %q", msg)
	}
	if msg := got[report.HealthVolume+"db-1"].Message; !strings.Contains(msg, "95% used (512 MiB free) and fills in about 2h0m0s") || !strings.Contains(msg, "autoGrow grows the volumes") {
		t.Errorf("volume: %q", msg)
	}
	events := HealthEvents(report.Health{report.HealthWraparound: {Message: "old"}}, got)
	var reasons []string
	for _, e := range events {
		reasons = append(reasons, e.Type+"/"+e.Reason)
	}
	want := []string{"Warning/" + dbv1.ReasonConnectionsSaturated, "Warning/" + dbv1.ReasonVolumeFillingUp, "Normal/" + dbv1.ReasonTransactionIDsFrozen}
	if !slices.Equal(reasons, want) {
		t.Errorf("events %v, want %v", reasons, want)
	}
}
