package failover

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// AgentErrorGrace is how long an agent may report an error while its instance is not
// ready before the error is recorded: a start, a clone or a switchover passes through
// errors (the primary not up yet) that end within it.
const AgentErrorGrace = 15 * time.Second

// NextAgentErrors is the record after this observation at now, and when each instance
// that is not ready was first seen reporting an error (seen, carried from one
// observation to the next). An agent that answers, not ready, with an error is
// recorded once it has reported one for AgentErrorGrace, under the message first
// recorded while it stays the same but for durations; one that answers ready or
// without an error is removed; one that does not answer keeps its entry while its pod
// exists (its last word is the best there is of why it does not run).
func NextAgentErrors(prev report.AgentErrors, seen map[string]time.Time, instances []Instance, now time.Time) (report.AgentErrors, map[string]time.Time) {
	next, nextSeen := report.AgentErrors{}, map[string]time.Time{}
	for _, i := range instances {
		old, had := prev[i.Name]
		st := i.Status
		switch {
		case !i.Reachable:
			if had && i.Pod != nil {
				next[i.Name] = old
			}
			if s, ok := seen[i.Name]; ok {
				nextSeen[i.Name] = s
			}
		case st.Ready || st.Error == "":
		default:
			since, ok := seen[i.Name]
			if !ok {
				since = now
			}
			nextSeen[i.Name] = since
			switch {
			case had && withoutDurations(old.Message) == withoutDurations(st.Error):
				next[i.Name] = old
			case now.Sub(since) >= AgentErrorGrace:
				next[i.Name] = report.AgentError{Message: st.Error, Since: since.UTC().Round(0)}
			}
		}
	}
	return next, nextSeen
}

// recordAgentErrors records the errors of the agents whose instance is not ready in
// the report, for the status controller to say why they do not run (it also makes the
// events).
func (c *cycle) recordAgentErrors(ctx context.Context) error {
	prev := c.reported.AgentErrors
	c.r.mu.Lock()
	next, seen := NextAgentErrors(prev, c.mem.agentErrorSeen, c.instances, time.Now())
	c.mem.agentErrorSeen = seen
	c.r.mu.Unlock()
	if maps.Equal(prev, next) {
		return nil
	}
	if err := c.record(ctx, report.KeyAgentErrors, next); err != nil {
		return fmt.Errorf("recording the agents' errors: %w", err)
	}
	c.reported.AgentErrors = next
	return nil
}
