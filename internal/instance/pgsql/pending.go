package pgsql

import (
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

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
		pending, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.PendingSetting, error) {
			var p agentapi.PendingSetting
			err := r.Scan(&p.Name, &p.Value, &p.Pending)
			return p, err
		})
		st.PendingRestart = slices.DeleteFunc(pending, func(p agentapi.PendingSetting) bool { return sameValue(p.Value, p.Pending) })
		return err
	})
}

// sameValue is whether a pending value is the one the postmaster runs with, written
// otherwise: PostgreSQL marks a setting removed from the file as waiting for a restart
// even when its default is what it runs with (shared_buffers "128MB", pending
// "131072kB"), and a restart for it would change nothing.
func sameValue(running, pending string) bool {
	if running == pending {
		return true
	}
	// Memory with units on both sides; a number without one parses as 0 bytes here.
	a, errA := tuning.ParseMemory(running, 0)
	b, errB := tuning.ParseMemory(pending, 0)
	return errA == nil && errB == nil && a > 0 && a == b
}
