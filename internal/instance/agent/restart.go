package agent

import (
	"context"
	"fmt"

	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// restart restarts postgres in place, so that it takes the settings that wait for a
// restart (docs/operations.md, "Changing settings"). A streaming standby starts again
// as a standby of the same primary. The primary of a single-instance cluster starts
// again as the primary: there is nobody to hand over to, so writes stop while it
// restarts. A primary with standbys is refused: the operator moves its role by a
// switchover, and it comes back as a standby with a new postmaster.
func (a *Agent) restart(ctx context.Context) error {
	view := a.lease.View()
	a.mu.Lock()
	role, upstream, frozen, alone := a.role, a.upstream, a.frozen, len(a.peers()) == 0
	a.mu.Unlock()
	switch {
	case role == agentapi.RoleReplica && (frozen || upstream == ""):
		return fmt.Errorf("%w: this standby is frozen (a failover or switchover is under way); it is restarted once it follows a primary again", agentapi.ErrConflict)
	case role == agentapi.RoleReplica:
		a.log.Info("Restarting the standby to apply the settings that need a restart", "primary", upstream)
		a.stopPostgres(postgres.StopFast)
		return a.runStandby(ctx, upstream)
	case role == agentapi.RolePrimary && !alone:
		return fmt.Errorf("%w: this is the primary of a cluster with standbys; it is never restarted under its clients: the operator hands its role to a restarted standby by a switchover first", agentapi.ErrConflict)
	case role == agentapi.RolePrimary && view.Holder != a.cfg.PodName:
		return fmt.Errorf("%w: the primary Lease names %q, not this instance", agentapi.ErrConflict, view.Holder)
	case role == agentapi.RolePrimary:
		a.log.Info("Restarting the only instance in place to apply the settings that need a restart: writes stop until it is back")
		// The gate drains while postgres stops: no commit is acknowledged that the stop
		// could cut short.
		a.stopCleanly(ctx)
		return a.startInstance(ctx, Decision{Act: StartPrimary, Reason: "restarted to apply settings"}, view)
	}
	return fmt.Errorf("%w: postgres is %s, not a running standby or primary", agentapi.ErrConflict, role)
}

// Restart implements agentapi.Instance: carried out by the Run loop.
func (a *Agent) Restart(ctx context.Context) error { return a.do(ctx, "restart") }
