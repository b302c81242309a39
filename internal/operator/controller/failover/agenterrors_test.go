package failover

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// An agent's error is recorded once its instance has been not ready with an error for
// the grace, under its first wording while only durations change; it goes when the
// instance is ready, and stays while the agent does not answer and its pod exists.
func TestNextAgentErrors(t *testing.T) {
	now := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	failing := func(name, err string) Instance {
		return Instance{Name: name, Pod: &corev1.Pod{}, Reachable: true, Status: agentapi.Status{Role: agentapi.RoleStopped, Error: err}}
	}
	bad := `postgres exited while starting: FATAL:  invalid value for parameter "work_mem": "lots"`

	// First seen: not yet recorded.
	next, seen := NextAgentErrors(nil, nil, []Instance{failing("db-0", bad)}, now)
	if len(next) != 0 || !seen["db-0"].Equal(now) {
		t.Fatalf("first seen: recorded %v, seen %v; want nothing recorded, seen now", next, seen)
	}
	// Past the grace: recorded, since it was first seen.
	later := now.Add(AgentErrorGrace)
	next, seen = NextAgentErrors(next, seen, []Instance{failing("db-0", bad)}, later)
	want := report.AgentErrors{"db-0": {Message: bad, Since: now}}
	if diff := cmp.Diff(want, next); diff != "" {
		t.Fatalf("past the grace (-want +got):\n%s", diff)
	}
	// The same error but for a duration keeps the first wording.
	retry := func(d string) string { return "cloning from db-1: retrying in " + d }
	prev := report.AgentErrors{"db-0": {Message: retry("2s"), Since: now}}
	if got, _ := NextAgentErrors(prev, seen, []Instance{failing("db-0", retry("4s"))}, later); got["db-0"].Message != retry("2s") {
		t.Errorf("a new duration rewrote the error: %q", got["db-0"].Message)
	}
	// Unreachable with a pod: kept; without: gone.
	gone := Instance{Name: "db-0"}
	away := Instance{Name: "db-0", Pod: &corev1.Pod{}}
	if got, _ := NextAgentErrors(want, seen, []Instance{away}, later); got["db-0"].Message != bad {
		t.Errorf("an agent that does not answer lost its last error: %v", got)
	}
	if got, _ := NextAgentErrors(want, seen, []Instance{gone}, later); len(got) != 0 {
		t.Errorf("an instance without a pod kept its error: %v", got)
	}
	// Ready: gone, and seen anew next time.
	readyNow := failing("db-0", "")
	readyNow.Status.Ready = true
	next, seen = NextAgentErrors(want, seen, []Instance{readyNow}, later)
	if len(next) != 0 || len(seen) != 0 {
		t.Errorf("ready: recorded %v, seen %v; want neither", next, seen)
	}
}
