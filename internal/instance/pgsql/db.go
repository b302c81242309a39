// Package pgsql is what the agent asks its own PostgreSQL server in SQL, over the unix
// socket as the superuser: the status and the archiver's, replication slots, roles and
// databases, statistics and custom queries, durability overrides and client sessions,
// promotion and checkpoints. It decides nothing: when to ask, and what an answer means
// for the instance, is the agent's.
package pgsql

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// The application_name of the agent's own sessions: its pool's, and the custom
// queries' (customstats.go).
const (
	agentApplicationName   = "pgpilot-agent"
	metricsApplicationName = "pgpilot-metrics"
)

// DB talks to the local postgres over its unix socket as the superuser (peer auth).
type DB struct {
	SocketDir string
	Port      int
	User      string

	// receivedTLI is the last timeline a standby's WAL receiver was seen on: once the
	// receiver stops (a freeze), the only other source, the last restartpoint's
	// timeline, can lag behind the WAL the standby holds.
	receivedTLI atomic.Int64

	mu   sync.Mutex
	pool *pgxpool.Pool
}

// connect takes a session from the pool: the agent asks postgres something several
// times a second (the operator's and the kubelet's status calls, the synchronous rule,
// slots), and a new session costs a fork and catalog loading, which on a busy node
// delayed a promotion by a second. A session idle for over a second is pinged before
// use; Reset drops them all when postgres stops.
func (d *DB) connect(ctx context.Context) (*pgxpool.Conn, error) {
	pool, err := d.getPool()
	if err != nil {
		return nil, err
	}
	return pool.Acquire(ctx)
}

func (d *DB) getPool() (*pgxpool.Pool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		return d.pool, nil
	}
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cc := cfg.ConnConfig
	cc.Host, cc.Port, cc.User, cc.Database = d.SocketDir, uint16(d.Port), d.User, "postgres"
	cc.RuntimeParams["application_name"] = agentApplicationName
	// The agent's own writes (bootstrap, passwords) must not wait for synchronous
	// standbys: on a new cluster those cannot connect before the replication role exists.
	cc.RuntimeParams["synchronous_commit"] = "local"
	cfg.MinConns, cfg.MaxConns = 0, 6
	cfg.MaxConnIdleTime = time.Minute
	cfg.HealthCheckPeriod = 10 * time.Second
	if d.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		return nil, err
	}
	return d.pool, nil
}

// Reset closes every pooled session: postgres stopped, or is about to.
func (d *DB) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		d.pool.Reset()
	}
}

// ReplicationConn opens a physical replication connection over the unix socket as
// the commit gate (peer authentication, `local replication` in pg_hba.conf).
func (d *DB) ReplicationConn(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database = d.SocketDir, uint16(d.Port), d.User, ""
	cfg.RuntimeParams["replication"] = "true"
	cfg.RuntimeParams["application_name"] = gate.GateName
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pgconn.ConnectConfig(cctx, cfg)
}

// Ping returns nil when postgres accepts a connection and answers.
func (d *DB) Ping(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return conn.Ping(ctx)
}

// Streaming reports whether this standby's WAL receiver streams from its primary.
func (d *DB) Streaming(ctx context.Context) (bool, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'`).Scan(&n)
	return n > 0, err
}

// InRecovery reports whether postgres runs as a standby.
func (d *DB) InRecovery(ctx context.Context) (bool, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var r bool
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r)
	return r, err
}

// Observe fills the database's part of st (role, timeline, positions, slots,
// replicas, settings waiting for a restart) and arch's counters from pg_stat_archiver, in one round trip: on a busy
// node every round trip waits for two processes to be scheduled, and the operator
// reads every instance before it moves the Lease. asPrimary is what the caller
// believes the role is; when postgres says otherwise, the role's own queries run again.
func (d *DB) Observe(ctx context.Context, st *agentapi.Status, arch *agentapi.ArchiverStatus, asPrimary bool) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	var inRecovery, answered bool
	b.Queue(`SELECT pg_is_in_recovery(), current_setting('server_version_num')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
		current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
			- coalesce(current_setting('reserved_connections', true)::int, 0),
		coalesce(o.age, 0), coalesce(o.datname, '')
		FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT datname::text, age(datfrozenxid)::bigint AS age
			FROM pg_database ORDER BY 2 DESC LIMIT 1) o ON true`).
		QueryRow(func(r pgx.Row) error {
			err := r.Scan(&inRecovery, &st.PostgresVersion, &st.Connections, &st.ConnectionLimit, &st.OldestXIDAge, &st.OldestXIDDatabase)
			answered = err == nil
			return err
		})
	b.Queue(`SELECT slot_name::text, active,
		coalesce(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END, restart_lsn), 0)::bigint,
		restart_lsn IS NULL
		FROM pg_replication_slots ORDER BY slot_name`).Query(func(rows pgx.Rows) (err error) {
		st.Slots, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.SlotStatus, error) {
			var s agentapi.SlotStatus
			err := r.Scan(&s.Name, &s.Active, &s.RetainedBytes, &s.Released)
			return s, err
		})
		return err
	})
	b.Queue(`SELECT archived_count, coalesce(last_archived_wal, ''), last_archived_time,
		failed_count, coalesce(last_failed_wal, ''), last_failed_time FROM pg_stat_archiver`).
		QueryRow(func(r pgx.Row) error {
			return r.Scan(&arch.ArchivedCount, &arch.LastArchivedWAL, &arch.LastArchivedAt, &arch.FailedCount, &arch.LastFailedWAL, &arch.LastFailedAt)
		})
	queuePending(b, st)
	// Last: on a standby the primary's queries fail, and end the batch.
	if asPrimary {
		d.queuePrimary(b, st)
	} else {
		d.queueStandby(b, st)
	}
	err = conn.SendBatch(ctx, b).Close()
	if !answered || inRecovery == !asPrimary {
		return err
	}
	// The role changed since the caller looked; the first three answered before it.
	b = &pgx.Batch{}
	if inRecovery {
		d.queueStandby(b, st)
	} else {
		d.queuePrimary(b, st)
	}
	return conn.SendBatch(ctx, b).Close()
}

// queuePrimary queues a primary's part of Observe: its position and its standbys.
func (d *DB) queuePrimary(b *pgx.Batch, st *agentapi.Status) {
	b.Queue(`SELECT pg_current_wal_lsn()::text, pg_walfile_name(pg_current_wal_lsn()),
		(SELECT timeline_id FROM pg_control_checkpoint())::bigint`).QueryRow(func(r pgx.Row) error {
		var walfile string
		if err := r.Scan(&st.WriteLSN, &walfile, &st.CheckpointTimeline); err != nil {
			return err
		}
		st.Timeline, _ = strconv.ParseInt(walfile[:8], 16, 64)
		st.Position = st.WriteLSN
		return nil
	})
	b.Queue(`SELECT application_name, state, sync_state,
		coalesce(sent_lsn::text, ''), coalesce(flush_lsn::text, ''), coalesce(replay_lsn::text, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn), 0)::bigint
		FROM pg_stat_replication WHERE application_name <> $1 ORDER BY application_name`, gate.GateName).
		Query(func(rows pgx.Rows) (err error) {
			st.Replicas, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.ReplicaStatus, error) {
				var rs agentapi.ReplicaStatus
				err := r.Scan(&rs.Name, &rs.State, &rs.SyncState, &rs.SentLSN, &rs.FlushLSN, &rs.ReplayLSN, &rs.LagBytes)
				return rs, err
			})
			return err
		})
}

// queueStandby queues a standby's part of Observe. A standby's timeline is the one its
// received WAL is on: the WAL receiver's while it runs; once it stopped, the latest of
// the last one seen and the last restartpoint's.
func (d *DB) queueStandby(b *pgx.Batch, st *agentapi.Status) {
	b.Queue(`SELECT coalesce(pg_last_wal_receive_lsn()::text, ''), coalesce(pg_last_wal_replay_lsn()::text, ''),
		coalesce(pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()), 0)::bigint,
		coalesce((SELECT received_tli FROM pg_stat_wal_receiver WHERE received_tli > 0), 0)::bigint,
		(SELECT timeline_id FROM pg_control_checkpoint())::bigint,
		coalesce(greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text, '')`).
		QueryRow(func(r pgx.Row) error {
			var received, checkpoint int64
			if err := r.Scan(&st.ReceivedLSN, &st.ReplayedLSN, &st.LagBytes, &received, &checkpoint, &st.Position); err != nil {
				return err
			}
			if received > d.receivedTLI.Load() {
				d.receivedTLI.Store(received)
			}
			st.Timeline = max(received, checkpoint, d.receivedTLI.Load())
			return nil
		})
}

// StandbyFlushed is the highest WAL position a standby of this primary reported
// flushed (0 when none streams; the commit gate is not a standby), and the primary's
// timeline.
func (d *DB) StandbyFlushed(ctx context.Context) (pglogrepl.LSN, int64, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	var flushed, walfile string
	if err := conn.QueryRow(ctx, `SELECT coalesce((SELECT flush_lsn::text FROM pg_stat_replication
		WHERE application_name <> $1 AND flush_lsn IS NOT NULL ORDER BY flush_lsn DESC LIMIT 1), '0/0'),
		pg_walfile_name(pg_current_wal_lsn())`, gate.GateName).Scan(&flushed, &walfile); err != nil {
		return 0, 0, err
	}
	lsn, err := pglogrepl.ParseLSN(flushed)
	if err != nil {
		return 0, 0, err
	}
	tl, err := strconv.ParseInt(walfile[:8], 16, 64)
	return lsn, tl, err
}

// FlushLSN is a primary's WAL flush position.
func (d *DB) FlushLSN(ctx context.Context) (string, error) {
	return d.text(ctx, "SELECT pg_current_wal_flush_lsn()::text")
}

// Setting is a setting's value as a new session sees it.
func (d *DB) Setting(ctx context.Context, name string) (string, error) {
	return d.text(ctx, "SELECT current_setting($1)", name)
}

func (d *DB) text(ctx context.Context, query string, args ...any) (string, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Release()
	var v string
	err = conn.QueryRow(ctx, query, args...).Scan(&v)
	return v, err
}

// StreamingStandbys are the standbys streaming from this primary, caught up
// (pg_stat_replication state streaming), by application_name; the gate is not one.
func (d *DB) StreamingStandbys(ctx context.Context) (map[string]bool, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `SELECT application_name FROM pg_stat_replication WHERE state = 'streaming' AND application_name <> $1`, gate.GateName)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out, err
}

// GateImpostor is a walsender that took the commit gate's name.
type GateImpostor struct {
	PID uint32
	// Client is its address, or "local socket".
	Client, User string
}

// TerminateGateImpostors terminates every walsender named gate.GateName but the gate's own
// (its backend pid gate; 0 while the gate has no connection), and returns them.
// synchronous_standby_names counts a standby by its application_name, which any
// replication client chooses: one holding the replication certificate could connect
// over TCP as the gate and acknowledge commits the gate withholds. The agent's gate
// comes over the local socket as the superuser (pg_hba.conf admits no other
// replication there), so such a session is never terminated, not even a previous
// connection of the gate's that has not ended yet.
func (d *DB) TerminateGateImpostors(ctx context.Context, gatePID uint32) ([]GateImpostor, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	// Materialized: pg_terminate_backend must see only the walsenders chosen, never a
	// row of pg_stat_activity before the view's join filters it out.
	rows, err := conn.Query(ctx, `WITH impostor AS MATERIALIZED (
			SELECT pid, coalesce(host(client_addr), 'local socket') AS client, usename::text AS usename
			FROM pg_stat_replication
			WHERE application_name = $1 AND pid <> $2 AND (client_addr IS NOT NULL OR usename <> current_user))
		SELECT pid, client, usename FROM impostor WHERE pg_terminate_backend(pid)`, gate.GateName, int64(gatePID))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (GateImpostor, error) {
		var g GateImpostor
		err := row.Scan(&g.PID, &g.Client, &g.User)
		return g, err
	})
}

// ReceiverStopped reports whether this standby's WAL receiver is gone (after a freeze).
func (d *DB) ReceiverStopped(ctx context.Context) (bool, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver WHERE pid IS NOT NULL`).Scan(&n)
	return n == 0, err
}

// Bootstrap creates, on a new cluster's first primary, the replication role (with the
// functions pg_rewind needs), the application owner and database. It creates only what
// is missing, so it can run again after an interruption.
func (d *DB) Bootstrap(ctx context.Context, b clusterconfig.Bootstrap, cs pgconf.Credentials) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	exists := func(query, name string) (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, "SELECT EXISTS ("+query+")", name).Scan(&ok)
		return ok, err
	}
	repl := pgx.Identifier{cs.Replication.Username}.Sanitize()
	owner := pgx.Identifier{b.Owner}.Sanitize()
	steps := []struct {
		check, name string
		stmts       []string
	}{
		{"SELECT 1 FROM pg_roles WHERE rolname = $1", cs.Replication.Username, []string{
			"CREATE ROLE " + repl + " WITH REPLICATION LOGIN",
			"GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO " + repl,
			"GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO " + repl,
			"GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO " + repl,
			"GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO " + repl,
		}},
		{"SELECT 1 FROM pg_roles WHERE rolname = $1", b.Owner, []string{"CREATE ROLE " + owner + " WITH LOGIN"}},
		{"SELECT 1 FROM pg_database WHERE datname = $1", b.Database, []string{
			"CREATE DATABASE " + pgx.Identifier{b.Database}.Sanitize() + " OWNER " + owner,
		}},
	}
	for _, step := range steps {
		ok, err := exists(step.check, step.name)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		// A role and its grants in one transaction; CREATE DATABASE cannot be in one.
		if len(step.stmts) > 1 {
			if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(step.stmts, "; ")+"; COMMIT"); err != nil {
				return fmt.Errorf("bootstrapping %s: %w", step.name, err)
			}
			continue
		}
		if _, err := conn.Exec(ctx, step.stmts[0]); err != nil {
			return fmt.Errorf("bootstrapping %s: %w", step.name, err)
		}
	}
	return nil
}

// SyncPasswords sets each role's password to the one in its Secret, where it differs,
// as a SCRAM verifier. Roles that do not exist are skipped (the app owner may have been
// renamed by a user).
func (d *DB) SyncPasswords(ctx context.Context, cs pgconf.Credentials) (changed []string, err error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	// The statements that set a password hold its verifier: they run in a session of
	// their own that logs no statement, opened at the first.
	var quiet *pgx.Conn
	defer func() {
		if quiet != nil {
			quiet.Close(context.WithoutCancel(ctx))
		}
	}()
	for _, c := range []pgconf.Credential{cs.Superuser, cs.Replication, cs.App} {
		var current *string
		err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", c.Username).Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return changed, err
		}
		if current != nil && pgconf.ScramMatches(*current, c.Password) {
			continue
		}
		verifier, err := pgconf.ScramVerifier(c.Password, rand.Reader)
		if err != nil {
			return changed, err
		}
		if quiet == nil {
			if quiet, err = d.quietConn(ctx, ""); err != nil {
				return changed, err
			}
		}
		if _, err := quiet.Exec(ctx, alterPassword(c.Username, &verifier)); err != nil {
			return changed, fmt.Errorf("setting the password of %s: %w", c.Username, err)
		}
		changed = append(changed, c.Username)
	}
	return changed, nil
}

// SlotChanges is what EnsureSlots did, and the slots it left idle.
type SlotChanges struct {
	Created, Dropped, Released []string
	// Idle are pgpilot's slots that hold WAL for nobody streaming now, with their
	// restart positions: one that moved since the last call was streamed from since.
	Idle map[string]string
}

// EnsureSlots creates the physical slots in want and drops pgpilot's slots that are not
// in want and not in use, so WAL never piles up for an instance that is gone. The idle
// slots in release are made again without WAL reserved: they keep nothing until their
// instance streams again (from where it asks, if the WAL is still there). On a standby
// (advance) the unused slots are moved to the replay position, so they hold back no
// more WAL than the standby replayed since the last call.
func (d *DB) EnsureSlots(ctx context.Context, want []string, advance bool, release []string) (ch SlotChanges, err error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return ch, err
	}
	defer conn.Release()
	have := map[string]bool{}
	reserved := map[string]bool{}
	restart := map[string]string{}
	var lost []string
	rows, err := conn.Query(ctx, `SELECT slot_name::text, active, coalesce(wal_status, ''), coalesce(restart_lsn::text, '')
		FROM pg_replication_slots WHERE slot_name LIKE 'pgpilot\_%'`)
	if err != nil {
		return ch, err
	}
	for rows.Next() {
		var name, walStatus, lsn string
		var active bool
		if err := rows.Scan(&name, &active, &walStatus, &lsn); err != nil {
			return ch, err
		}
		have[name], reserved[name], restart[name] = active, lsn != "", lsn
		if walStatus == "lost" && !active {
			lost = append(lost, name)
		}
	}
	if err := rows.Err(); err != nil {
		return ch, err
	}
	// A slot invalidated by max_slot_wal_keep_size keeps nothing and can never be
	// streamed from: it is dropped, and made again below, so its instance, when it
	// returns, is told its WAL is gone and is cloned again.
	for _, s := range lost {
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s); err != nil {
			return ch, fmt.Errorf("dropping the invalidated slot %s: %w", s, err)
		}
		delete(have, s)
		ch.Dropped = append(ch.Dropped, s)
	}
	for _, s := range release {
		if active, ok := have[s]; !ok || active || !reserved[s] {
			continue
		}
		// Only while it is still idle: a walsender that took it since is left alone
		// (pg_drop_replication_slot would fail on it anyway).
		var dropped bool
		if err := conn.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) > 0
			FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, s).Scan(&dropped); err != nil {
			return ch, fmt.Errorf("releasing slot %s: %w", s, err)
		}
		if !dropped {
			continue
		}
		if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, false)", s); err != nil {
			delete(have, s) // made again below, reserved: better than none
			continue
		}
		reserved[s] = false
		ch.Released = append(ch.Released, s)
	}
	wanted := map[string]bool{}
	for _, s := range want {
		wanted[s] = true
		if _, ok := have[s]; !ok {
			if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", s); err != nil {
				return ch, fmt.Errorf("creating slot %s: %w", s, err)
			}
			have[s], reserved[s] = false, true
			ch.Created = append(ch.Created, s)
		}
	}
	for s, active := range have {
		switch {
		case !wanted[s] && !active:
			if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s); err != nil {
				return ch, fmt.Errorf("dropping slot %s: %w", s, err)
			}
			ch.Dropped = append(ch.Dropped, s)
		case !active && reserved[s]:
			if ch.Idle == nil {
				ch.Idle = map[string]string{}
			}
			ch.Idle[s] = restart[s]
		}
	}
	if advance {
		if _, err := conn.Exec(ctx, `SELECT pg_replication_slot_advance(slot_name, pg_last_wal_replay_lsn())
			FROM pg_replication_slots WHERE slot_name LIKE 'pgpilot\_%' AND slot_type = 'physical' AND NOT active
			AND restart_lsn < pg_last_wal_replay_lsn()`); err != nil {
			return ch, fmt.Errorf("advancing the slots: %w", err)
		}
	}
	return ch, nil
}

// Promote ends recovery and waits for it. pg_promote's own wait looks every 100 ms;
// this one every 10 ms, on the same session.
func (d *DB) Promote(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var signalled bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(false)").Scan(&signalled); err != nil {
		return err
	}
	if !signalled {
		return fmt.Errorf("pg_promote could not signal the startup process")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var inRecovery bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
			return fmt.Errorf("waiting for the promotion: %w", err)
		}
		if !inRecovery {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the promotion did not finish within a minute: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// CheckpointTimeline is the timeline of the last checkpoint (or restartpoint).
func (d *DB) CheckpointTimeline(ctx context.Context) (int64, error) {
	s, err := d.text(ctx, "SELECT timeline_id::text FROM pg_control_checkpoint()")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// CurrentTimeline is a primary's timeline: the one its WAL is written on.
func (d *DB) CurrentTimeline(ctx context.Context) (int64, error) {
	s, err := d.text(ctx, "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 16, 64)
}

// Checkpoint runs CHECKPOINT.
func (d *DB) Checkpoint(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, "CHECKPOINT")
	return err
}

// Reload makes postgres re-read its configuration.
func (d *DB) Reload(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

// reloadPoll is how often ReloadInForce looks whether the postmaster has reloaded.
const reloadPoll = 20 * time.Millisecond

// ReloadInForce has postgres reload its configuration files, like Reload, and returns
// once the postmaster has loaded them: pg_reload_conf only signals it, and a session
// that starts before it handled the signal is authenticated by the old pg_hba.conf.
//
// A new session reports, as pg_conf_load_time, the postmaster's last reload. Once one
// reports a reload after the request, the postmaster has at least begun it, and it
// forks the next session only after it finished (it reloads and forks in one thread):
// so one more session started and the reload is in force for every later one.
func (d *DB) ReloadInForce(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	var asked time.Time
	err = conn.QueryRow(ctx, "SELECT statement_timestamp() FROM pg_reload_conf()").Scan(&asked)
	conn.Release()
	if err != nil {
		return err
	}
	for {
		var loaded bool
		if err := d.fresh(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT pg_conf_load_time() >= $1", asked).Scan(&loaded)
		}); err != nil {
			return err
		}
		if loaded {
			return d.fresh(ctx, func(*pgx.Conn) error { return nil })
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres did not reload its configuration: %w", ctx.Err())
		case <-time.After(reloadPoll):
		}
	}
}

// fresh runs f on a new session of its own, not the pool's.
func (d *DB) fresh(ctx context.Context, f func(*pgx.Conn) error) error {
	pool, err := d.getPool()
	if err != nil {
		return err
	}
	c, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	return f(c)
}
