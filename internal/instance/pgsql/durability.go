package pgsql

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
)

// DurabilityOverride is a synchronous_commit setting of a database, a role, or a role in
// a database (pg_db_role_setting) that lets commits skip the gate.
type DurabilityOverride struct {
	// Database and pgconf.Role are "" for "every database" and "every role" (ALTER ROLE ALL).
	Database, Role string
	// Value is the setting's value as stored.
	Value string
}

// String says where the override is, in the words of the statement that set it.
func (o DurabilityOverride) String() string {
	return o.statement("SET synchronous_commit = " + o.Value)
}

// statement is the ALTER statement that applies action to where o is.
func (o DurabilityOverride) statement(action string) string {
	role := "ALL"
	if o.Role != "" {
		role = pgx.Identifier{o.Role}.Sanitize()
	}
	switch {
	case o.Role == "" && o.Database != "":
		return "ALTER DATABASE " + pgx.Identifier{o.Database}.Sanitize() + " " + action
	case o.Database != "":
		return "ALTER ROLE " + role + " IN DATABASE " + pgx.Identifier{o.Database}.Sanitize() + " " + action
	}
	return "ALTER ROLE " + role + " " + action
}

// unsafeSynchronousCommit reports whether a synchronous_commit value lets a commit be
// acknowledged before the commit gate confirmed it: local and off (and off's boolean
// spellings). on, remote_write and remote_apply all wait for the gate.
func unsafeSynchronousCommit(value string) bool {
	switch strings.ToLower(strings.Trim(strings.TrimSpace(value), `'"`)) {
	case "local", "off", "false", "no", "0":
		return true
	}
	return false
}

// DurabilityGaps are what keepDurability acts on: the synchronous_commit overrides of
// pg_db_role_setting that let commits skip the gate, and the login roles and databases
// not pinned yet.
type DurabilityGaps struct {
	Unsafe   []DurabilityOverride
	Unpinned []DurabilityOverride // pgconf.Role and Database set, Value empty
}

// DurabilityGaps reads the synchronous_commit settings of databases and roles, and the
// pairs of a login role and a database that accepts connections with none of their
// own, in one round trip.
func (d *DB) DurabilityGaps(ctx context.Context) (DurabilityGaps, error) {
	var g DurabilityGaps
	conn, err := d.connect(ctx)
	if err != nil {
		return g, err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `SELECT coalesce(db.datname, ''), coalesce(r.rolname, ''), split_part(c, '=', 2)
		FROM pg_db_role_setting s
		LEFT JOIN pg_database db ON db.oid = s.setdatabase
		LEFT JOIN pg_roles r ON r.oid = s.setrole,
		unnest(s.setconfig) c
		WHERE lower(split_part(c, '=', 1)) = 'synchronous_commit'
		UNION ALL
		SELECT db.datname, r.rolname, NULL FROM pg_roles r CROSS JOIN pg_database db
		WHERE r.rolcanlogin AND db.datallowconn AND NOT EXISTS (
			SELECT FROM pg_db_role_setting s, unnest(s.setconfig) c
			WHERE s.setrole = r.oid AND s.setdatabase = db.oid AND lower(split_part(c, '=', 1)) = 'synchronous_commit')
		ORDER BY 1, 2`)
	if err != nil {
		return g, err
	}
	var database, role string
	var value *string
	_, err = pgx.ForEachRow(rows, []any{&database, &role, &value}, func() error {
		switch o := (DurabilityOverride{Database: database, Role: role}); {
		case value == nil:
			g.Unpinned = append(g.Unpinned, o)
		case unsafeSynchronousCommit(*value):
			o.Value = *value
			g.Unsafe = append(g.Unsafe, o)
		}
		return nil
	})
	return g, err
}

// ResetDurabilityOverride replaces o: a role's setting in a database by the pin, any
// other by nothing (RESET); then it terminates the client sessions that may have started
// with it (those of its database, or of its role), and returns how many.
func (d *DB) ResetDurabilityOverride(ctx context.Context, o DurabilityOverride, pin string) (int, error) {
	action := "RESET synchronous_commit"
	if o.Database != "" && o.Role != "" {
		action = pinAction(pin)
	}
	if err := d.exec(ctx, o.statement(action)); err != nil {
		return 0, err
	}
	changed, err := d.now(ctx)
	if err != nil {
		return 0, err
	}
	// A backend reads its settings before it shows in pg_stat_activity: one that read
	// the override just before the change may show up a moment after the first look.
	// Only backends forked before the change can hold it; they are looked for again
	// for resetSweep.
	only := &sessionsOf{Database: o.Database, Role: o.Role, StartedBy: changed}
	total := 0
	for deadline := time.Now().Add(resetSweep); ; {
		n, err := d.TerminateClients(ctx, only)
		total += n
		if err != nil || time.Now().After(deadline) {
			return total, err
		}
		time.Sleep(resetSweepEvery)
	}
}

// resetSweep is how long ResetDurabilityOverride keeps looking for sessions that may
// have started with the override, every resetSweepEvery.
const (
	resetSweep      = 300 * time.Millisecond
	resetSweepEvery = 20 * time.Millisecond
)

// Pin sets synchronous_commit to pin for o's role in o's database.
func (d *DB) Pin(ctx context.Context, o DurabilityOverride, pin string) error {
	return d.exec(ctx, o.statement(pinAction(pin)))
}

// pinAction is the SET of a pin; pin is one of the safe values (pinValue).
func pinAction(pin string) string {
	return "SET synchronous_commit = '" + pin + "'"
}

// sessionsOf narrows TerminateClients to a database's sessions, a role's, or both.
type sessionsOf struct {
	Database, Role string
	// StartedBy, when set, keeps only the backends started (forked) by then.
	StartedBy time.Time
}

// TerminateClients terminates client backends, every one when only is nil, except the
// agent's own sessions over the local socket, and returns how many it terminated. A
// terminated backend that waits for synchronous replication closes its connection
// without acknowledging the commit.
func (d *DB) TerminateClients(ctx context.Context, only *sessionsOf) (int, error) {
	_, n, err := d.terminateClients(ctx, only, 0)
	return n, err
}

// EndClientSessions terminates every client backend but the agent's own and waits, up
// to terminateWait each, for them to exit. It returns how many there were: 0 means none
// was left when it looked.
func (d *DB) EndClientSessions(ctx context.Context) (int, error) {
	found, _, err := d.terminateClients(ctx, nil, terminateWait)
	return found, err
}

// terminateClients terminates the client backends only names (all when nil) but the
// agent's own, waiting up to wait for each to exit (not at all when 0). It returns how
// many it found, and how many it terminated (exited within wait, when waiting).
func (d *DB) terminateClients(ctx context.Context, only *sessionsOf, wait time.Duration) (found, ended int, err error) {
	if only == nil {
		only = &sessionsOf{}
	}
	conn, err := d.connect(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	// OFFSET 0 keeps the subquery whole: pg_terminate_backend runs only on the rows its
	// conditions chose.
	err = conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pg_terminate_backend(pid, $6)) FROM (
		SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
		AND NOT (client_addr IS NULL AND client_port = -1 AND usename = ANY($1) AND application_name = ANY($2))
		AND ($3 = '' OR datname = $3) AND ($4 = '' OR usename = $4)
		AND ($5::timestamptz IS NULL OR backend_start <= $5)
		OFFSET 0) s`,
		[]string{d.User, pgconf.MonitorUser}, []string{agentApplicationName, metricsApplicationName}, only.Database, only.Role,
		startedBy(only.StartedBy), wait.Milliseconds()).Scan(&found, &ended)
	return found, ended, err
}

// terminateWait is how long EndClientSessions waits for one backend to exit.
const terminateWait = 500 * time.Millisecond

// WALInsertLSN is the end of WAL as written so far, flushed or not: a commit
// acknowledged with synchronous_commit off is before it.
func (d *DB) WALInsertLSN(ctx context.Context) (pglogrepl.LSN, error) {
	s, err := d.text(ctx, "SELECT pg_current_wal_insert_lsn()::text")
	if err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

// now is the server's clock.
func (d *DB) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	conn, err := d.connect(ctx)
	if err != nil {
		return t, err
	}
	defer conn.Release()
	err = conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
	return t, err
}

// startedBy is StartedBy as a query argument: NULL when unset.
func startedBy(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// exec runs one statement in a pooled session.
func (d *DB) exec(ctx context.Context, sql string) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, sql)
	return err
}

// ReplayLSN is a standby's last replayed WAL position (the end of the last record
// replayed).
func (d *DB) ReplayLSN(ctx context.Context) (pglogrepl.LSN, error) {
	s, err := d.text(ctx, "SELECT coalesce(pg_last_wal_replay_lsn()::text, '0/0')")
	if err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}
