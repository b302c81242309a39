package failover

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestDurabilityEvents(t *testing.T) {
	reset := func(n int, last string) Instance {
		i := standby("db-0", "", false)
		i.Status.DurabilityResets, i.Status.LastDurabilityReset = n, last
		return i
	}
	kept := standby("db-1", "", false)
	kept.Status.DurabilityOverridesKept = []string{`ALTER DATABASE "app" SET synchronous_commit = local`}
	away := standby("db-2", "", false)
	away.Reachable, away.Pod = false, &corev1.Pod{}

	reasons := func(events []DataGuardEvent) string {
		var r []string
		for _, e := range events {
			r = append(r, e.Type+" "+e.Reason)
		}
		return strings.Join(r, ", ")
	}
	seen := map[string]durabilitySeen{"db-2": {resets: 4}}
	for _, step := range []struct {
		name      string
		instances []Instance
		want      string
	}{
		{"nothing reset", []Instance{reset(0, ""), away}, ""},
		{"a reset and a kept override", []Instance{reset(1, `reset "ALTER DATABASE app"`), kept, away},
			"Warning " + dbv1.ReasonDurabilityOverrideReset + ", Warning " + dbv1.ReasonDurabilityOverrideKept},
		{"the same again", []Instance{reset(1, `reset "ALTER DATABASE app"`), kept, away}, ""},
		{"another reset", []Instance{reset(2, `reset "ALTER ROLE app"`), kept, away}, "Warning " + dbv1.ReasonDurabilityOverrideReset},
		{"the agent restarted and reset one", []Instance{reset(1, `reset "ALTER ROLE app"`), kept}, "Warning " + dbv1.ReasonDurabilityOverrideReset},
	} {
		events, next := DurabilityEvents(seen, step.instances)
		if got := reasons(events); got != step.want {
			t.Errorf("%s: events %q, want %q", step.name, got, step.want)
		}
		seen = next
	}
	if _, ok := seen["db-2"]; ok {
		t.Errorf("an instance no longer listed is still remembered")
	}
}
