package agent

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// queuePending queues Observe's question for the settings that wait for a restart:
// PostgreSQL classifies them itself (pg_settings.context postmaster), and marks those
// whose value in postgresql.conf differs from the running postmaster's once it has
// reloaded it. The pending value is the last line for the setting in the files
// (pg_file_settings), or the built-in default when no line sets it any more (with its
// unit, so that it reads as a value of the setting: 16384 pages of shared_buffers are
// 131072kB).
//
// The recovery targets are left out: a primary restored from a backup to a target ran
// with them, and the agent removes them from the file once recovery ended, but they
// are read during recovery only, so a restart would change nothing.
func queuePending(b *pgx.Batch, st *agentapi.Status) {
	b.Queue(`SELECT s.name, current_setting(s.name), coalesce(f.setting, CASE s.unit
			WHEN '8kB' THEN (s.boot_val::bigint * 8)::text || 'kB'
			ELSE s.boot_val || coalesce(s.unit, '') END, '')
		FROM pg_settings s
		LEFT JOIN LATERAL (SELECT setting FROM pg_file_settings f WHERE f.name = s.name ORDER BY seqno DESC LIMIT 1) f ON true
		WHERE s.pending_restart AND s.name NOT LIKE 'recovery\_target%' ORDER BY s.name`).Query(func(rows pgx.Rows) (err error) {
		st.PendingRestart, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.PendingSetting, error) {
			var p agentapi.PendingSetting
			err := r.Scan(&p.Name, &p.Value, &p.Pending)
			return p, err
		})
		return err
	})
}
