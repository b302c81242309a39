package failover

import (
	"strings"
	"testing"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

func TestUpgradeReport(t *testing.T) {
	on := func(i Instance, version int) Instance { i.Status.PostgresVersion = version; return i }
	upgrading := func(i Instance, phase string) Instance {
		i.Status.Upgrade = &agentapi.Upgrade{From: "15", To: "17", Phase: phase, Message: "said", Since: time.Now()}
		return i
	}
	expected := []string{"db-0", "db-1", "db-2"}
	tests := []struct {
		name      string
		instances []Instance
		reason    string // "" for no report
		message   string
	}{
		{"no upgrade", []Instance{on(primary("db-0"), 150010)}, "", ""},
		{"holder does not answer", []Instance{upgrading(dead("db-0"), agentapi.UpgradeUpgrading)}, "", ""},
		{"checking", []Instance{upgrading(primary("db-0"), agentapi.UpgradeChecking)}, dbv1.ReasonUpgradeChecking, "said"},
		{"failed", []Instance{upgrading(primary("db-0"), agentapi.UpgradeFailed)}, dbv1.ReasonUpgradeFailed, "said"},
		{"completed, standbys cloning", []Instance{upgrading(on(primary("db-0"), 170006), agentapi.UpgradeCompleted),
			on(standby("db-1", "0/1", false), 170006), on(standby("db-2", "0/1", false), 150010)}, dbv1.ReasonUpgradeReplicasCloning, "waiting for db-2"},
		{"completed everywhere", []Instance{upgrading(on(primary("db-0"), 170006), agentapi.UpgradeCompleted),
			on(standby("db-1", "0/1", false), 170006), on(standby("db-2", "0/1", false), 170006)}, dbv1.ReasonUpgradeCompleted, "said"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.instances {
				tc.instances[i].Status.Ready = tc.instances[i].Reachable
			}
			got := UpgradeReport("db-0", tc.instances, expected)
			switch {
			case tc.reason == "" && got != nil:
				t.Errorf("report %+v, want none", got)
			case tc.reason == "":
			case got == nil || got.Reason != tc.reason || !strings.Contains(got.Message, tc.message) || got.From != "15" || got.To != "17":
				t.Errorf("report %+v, want %s with %q", got, tc.reason, tc.message)
			}
		})
	}
}

func TestWithoutDurations(t *testing.T) {
	a := "the primary db-0's agent does not answer and has not renewed the Lease for 10.2s; no failover: no replica is running"
	b := "the primary db-0's agent does not answer and has not renewed the Lease for 14.4s; no failover: no replica is running"
	if withoutDurations(a) != withoutDurations(b) {
		t.Errorf("%q and %q differ only in a duration", a, b)
	}
	for _, other := range []string{
		"the primary db-1's agent does not answer and has not renewed the Lease for 10.2s; no failover: no replica is running",
		"the primary db-0 has no pod; no failover: no replica is running",
	} {
		if withoutDurations(a) == withoutDurations(other) {
			t.Errorf("%q taken for %q", other, a)
		}
	}
	if got := withoutDurations("for 1m30s, after 250ms, at 3s"); got != "for …, after …, at …" {
		t.Errorf("withoutDurations: %q", got)
	}
}
