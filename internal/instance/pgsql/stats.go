package pgsql

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// statsTimeout bounds the statistics' query batch, in postgres (statement_timeout) and
// in the agent: a scrape must never wait on a busy instance for long.
const statsTimeout = 3 * time.Second

// Stats fills st from one batch: databases, backends, locks, the oldest transactions,
// the checkpointer, WAL, and the standbys' lag in time.
func (d *DB) Stats(ctx context.Context, st *agentapi.Stats) error {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	major := serverMajor(conn.Conn().PgConn().ParameterStatus("server_version"))
	b := &pgx.Batch{}
	// The batch is one implicit transaction: the timeout ends with it.
	b.Queue(`SELECT set_config('statement_timeout', $1, true)`, strconv.Itoa(int(statsTimeout.Milliseconds())))
	b.Queue(`SELECT d.datname::text, pg_database_size(d.oid), age(d.datfrozenxid)::bigint, mxid_age(d.datminmxid)::bigint,
		coalesce(s.xact_commit, 0), coalesce(s.xact_rollback, 0), coalesce(s.blks_read, 0), coalesce(s.blks_hit, 0),
		coalesce(s.deadlocks, 0), coalesce(s.temp_files, 0), coalesce(s.temp_bytes, 0), coalesce(s.conflicts, 0),
		coalesce(s.tup_returned, 0), coalesce(s.tup_fetched, 0), coalesce(s.tup_inserted, 0), coalesce(s.tup_updated, 0),
		coalesce(s.tup_deleted, 0)
		FROM pg_database d LEFT JOIN pg_stat_database s ON s.datid = d.oid ORDER BY 1`).Query(func(rows pgx.Rows) (err error) {
		st.Databases, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.DatabaseStats, error) {
			var s agentapi.DatabaseStats
			err := r.Scan(&s.Name, &s.SizeBytes, &s.XIDAge, &s.MXIDAge, &s.XactCommit, &s.XactRollback, &s.BlocksRead, &s.BlocksHit,
				&s.Deadlocks, &s.TempFiles, &s.TempBytes, &s.Conflicts,
				&s.TuplesReturned, &s.TuplesFetched, &s.TuplesInserted, &s.TuplesUpdated, &s.TuplesDeleted)
			return s, err
		})
		return err
	})
	st.Backends = map[string]int{}
	b.Queue(`SELECT coalesce(state, 'unknown'), count(*)::int FROM pg_stat_activity
		WHERE backend_type = 'client backend' GROUP BY 1`).Query(func(rows pgx.Rows) error {
		var state string
		var n int
		_, err := pgx.ForEachRow(rows, []any{&state, &n}, func() error { st.Backends[state] = n; return nil })
		return err
	})
	b.Queue(`SELECT current_setting('max_connections')::int,
		(SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted)::int,
		coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
		coalesce(extract(epoch FROM max(clock_timestamp() - state_change)
			FILTER (WHERE state IN ('idle in transaction', 'idle in transaction (aborted)'))), 0)::float8
		FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).QueryRow(func(r pgx.Row) error {
		return r.Scan(&st.MaxConnections, &st.LocksWaiting, &st.OldestTransactionSeconds, &st.OldestIdleInTransactionSeconds)
	})
	cp := &agentapi.CheckpointerStats{}
	b.Queue(checkpointerQuery(major)).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(&cp.Timed, &cp.Requested, &cp.WriteMillis, &cp.SyncMillis, &cp.BuffersWritten,
			&cp.BuffersClean, &cp.MaxWrittenClean, &cp.BuffersAllocated); err != nil {
			return err
		}
		st.Checkpointer = cp
		return nil
	})
	w := &agentapi.WALStats{}
	b.Queue(`SELECT wal_records, wal_fpi, wal_bytes::float8, wal_buffers_full FROM pg_stat_wal`).QueryRow(func(r pgx.Row) error {
		if err := r.Scan(&w.Records, &w.FullPageImages, &w.Bytes, &w.BuffersFull); err != nil {
			return err
		}
		st.WAL = w
		return nil
	})
	b.Queue(`SELECT application_name, coalesce(extract(epoch FROM write_lag), 0)::float8,
		coalesce(extract(epoch FROM flush_lag), 0)::float8, coalesce(extract(epoch FROM replay_lag), 0)::float8
		FROM pg_stat_replication WHERE application_name <> $1 ORDER BY 1`, gate.GateName).Query(func(rows pgx.Rows) (err error) {
		st.ReplicaLags, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentapi.ReplicaLag, error) {
			var l agentapi.ReplicaLag
			err := r.Scan(&l.Name, &l.WriteSeconds, &l.FlushSeconds, &l.ReplaySeconds)
			return l, err
		})
		return err
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("database statistics: %w", err)
	}
	return nil
}

// checkpointerQuery reads the checkpointer's and background writer's counters:
// PostgreSQL 17 moved the checkpointer's into pg_stat_checkpointer.
func checkpointerQuery(major int) string {
	if major >= 17 {
		return `SELECT c.num_timed, c.num_requested, c.write_time, c.sync_time, c.buffers_written,
			b.buffers_clean, b.maxwritten_clean, b.buffers_alloc FROM pg_stat_checkpointer c, pg_stat_bgwriter b`
	}
	return `SELECT checkpoints_timed, checkpoints_req, checkpoint_write_time, checkpoint_sync_time, buffers_checkpoint,
		buffers_clean, maxwritten_clean, buffers_alloc FROM pg_stat_bgwriter`
}

// serverMajor is the major version in a server_version parameter ("15.10 (Debian
// 15.10-0+deb12u1)" is 15); 0 when it cannot be read.
func serverMajor(v string) int {
	head, _, _ := strings.Cut(v, ".")
	head, _, _ = strings.Cut(head, " ")
	n, _ := strconv.Atoi(head)
	return n
}
