package failover

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// durabilitySeen is, per instance, what the operator last turned into an event of the
// agents' synchronous_commit guard (internal/instance/agent/durability.go).
type durabilitySeen struct {
	resets int
	kept   string
}

// DurabilityEvents are the events for what the answering agents' synchronous_commit
// guard did since seen: an override reset (Warning: an application set a database's or
// role's synchronous_commit to local or off, which would have let its commits skip the
// commit gate), and the overrides allowUnsafeDurability keeps, when they change. next
// replaces seen.
func DurabilityEvents(seen map[string]durabilitySeen, instances []Instance) (events []DataGuardEvent, next map[string]durabilitySeen) {
	next = map[string]durabilitySeen{}
	for _, i := range instances {
		was := seen[i.Name]
		if !i.Reachable {
			if _, ok := seen[i.Name]; ok && i.Pod != nil {
				next[i.Name] = was
			}
			continue
		}
		now := durabilitySeen{resets: i.Status.DurabilityResets, kept: strings.Join(i.Status.DurabilityOverridesKept, "; ")}
		next[i.Name] = now
		// An agent that restarted counts from 0 again.
		if now.resets > was.resets || (now.resets > 0 && now.resets < was.resets) {
			events = append(events, DataGuardEvent{corev1.EventTypeWarning, dbv1.ReasonDurabilityOverrideReset,
				fmt.Sprintf("%s %s", i.Name, i.Status.LastDurabilityReset)})
		}
		if now.kept != "" && now.kept != was.kept {
			events = append(events, DataGuardEvent{corev1.EventTypeWarning, dbv1.ReasonDurabilityOverrideKept,
				fmt.Sprintf("%s keeps, as spec.postgresql.allowUnsafeDurability allows, settings whose commits skip the commit gate "+
					"(a failover can lose them, and a primary cut off from the cluster acknowledge them after a replica took over): %s", i.Name, now.kept)})
		}
	}
	return events, next
}

// reportDurability makes events of what the agents' synchronous_commit guard did.
func (c *cycle) reportDurability() {
	c.r.mu.Lock()
	events, next := DurabilityEvents(c.mem.durability, c.instances)
	c.mem.durability = next
	c.r.mu.Unlock()
	for _, e := range events {
		c.r.recorder.Event(c.cluster, e.Type, e.Reason, e.Message)
	}
}
