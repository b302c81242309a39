package agent

import (
	"context"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Stats implements agentapi.StatsInstance: one batch of queries over a pooled session,
// in one round trip; the API's cache makes it at most once per few seconds. An instance
// whose postgres does not run reports nothing but why.
func (a *Agent) Stats(ctx context.Context) agentapi.Stats {
	start := time.Now()
	a.mu.Lock()
	running, role := a.proc != nil, a.role
	a.mu.Unlock()
	var st agentapi.Stats
	if !running || (role != agentapi.RolePrimary && role != agentapi.RoleReplica) {
		st.Error = "postgres is not running in a role"
	} else if err := a.db.Stats(ctx, &st); err != nil {
		st.Error = err.Error()
	}
	a.customStats(ctx, &st, role == agentapi.RolePrimary && running)
	st.Duration = time.Since(start)
	return st
}
