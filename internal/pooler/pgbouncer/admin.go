package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Admin is a session on PgBouncer's admin console (the pseudo-database "pgbouncer"),
// which speaks the simple query protocol only.
type Admin struct {
	conn *pgx.Conn
}

// Dial opens an admin session through the Unix socket in socketDir.
func Dial(ctx context.Context, socketDir string, port int, user, password string) (*Admin, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database = socketDir, uint16(port), user, password, "pgbouncer"
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.StatementCacheCapacity, cfg.DescriptionCacheCapacity = 0, 0
	cfg.TLSConfig = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PgBouncer's admin console: %w", err)
	}
	return &Admin{conn: conn}, nil
}

// Close ends the session.
func (a *Admin) Close(ctx context.Context) error { return a.conn.Close(ctx) }

// Pause makes PgBouncer let every transaction in flight finish, close its server
// connections and hold new queries until Resume. It returns once no server connection
// is left, or with ctx's error (PgBouncer then goes on pausing). A PgBouncer paused
// already is no error: whoever asks wants it paused.
func (a *Admin) Pause(ctx context.Context) error {
	return ignoring(a.command(ctx, "PAUSE"), "already suspended/paused")
}

// Resume lets held queries go on, on server connections opened anew. A PgBouncer that
// is not paused (restarted, say) is no error.
func (a *Admin) Resume(ctx context.Context) error {
	return ignoring(a.command(ctx, "RESUME"), "pooler is not paused/suspended")
}

// ignoring is err, or nil when PgBouncer's message is state's (its admin console
// answers a PAUSE of a paused pooler, or a RESUME of a running one, with an error).
func ignoring(err error, state string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.Contains(pgErr.Message, state) {
		return nil
	}
	return err
}

// Reload reads the configuration file again (a new server address, say).
func (a *Admin) Reload(ctx context.Context) error { return a.command(ctx, "RELOAD") }

func (a *Admin) command(ctx context.Context, cmd string) error {
	if _, err := a.conn.Exec(ctx, cmd); err != nil {
		return fmt.Errorf("PgBouncer %s: %w", cmd, err)
	}
	return nil
}

// Pool is a row of SHOW POOLS: one database and user's pool.
type Pool struct {
	Database, User string
	// ClientsActive are linked to a server connection or idle; ClientsWaiting wait for
	// one (all of them while paused).
	ClientsActive, ClientsWaiting int64
	// ServersActive are linked to a client; ServersIdle are ready for one.
	ServersActive, ServersIdle int64
	// MaxWaitMicros is how long the oldest waiting client has waited.
	MaxWaitMicros int64
	// ServersUsed were idle longer than server_check_delay and wait for
	// server_check_query; ServersTested run server_reset_query or server_check_query;
	// ServersLogin are logging in.
	ServersUsed, ServersTested, ServersLogin int64
	// Mode is the pool's pool_mode.
	Mode Mode
}

// Pools reads SHOW POOLS.
func (a *Admin) Pools(ctx context.Context) ([]Pool, error) {
	rows, err := a.show(ctx, "SHOW POOLS")
	if err != nil {
		return nil, err
	}
	return parsePools(rows), nil
}

// parsePools reads SHOW POOLS's rows by column name: a column a newer PgBouncer adds is
// ignored, one an older lacks is 0.
func parsePools(rows []map[string]string) []Pool {
	var pools []Pool
	for _, r := range rows {
		pools = append(pools, Pool{
			Database: r["database"], User: r["user"],
			ClientsActive: atoi(r["cl_active"]), ClientsWaiting: atoi(r["cl_waiting"]),
			ServersActive: atoi(r["sv_active"]), ServersIdle: atoi(r["sv_idle"]),
			MaxWaitMicros: atoi(r["maxwait"])*1_000_000 + atoi(r["maxwait_us"]),
			ServersUsed:   atoi(r["sv_used"]), ServersTested: atoi(r["sv_tested"]), ServersLogin: atoi(r["sv_login"]),
			Mode: Mode(r["pool_mode"]),
		})
	}
	return pools
}

// DatabaseStats is a row of SHOW STATS: one database's totals since PgBouncer started
// (the pseudo-database "pgbouncer", the admin console, has one too).
type DatabaseStats struct {
	Database string
	// Transactions and Queries are the ones PgBouncer pooled (total_xact_count,
	// total_query_count).
	Transactions, Queries int64
	// ReceivedBytes came from clients, SentBytes went to them (total_received,
	// total_sent).
	ReceivedBytes, SentBytes int64
	// TransactionMicros and QueryMicros are the time transactions and queries took
	// (total_xact_time, total_query_time), counted from when the client sent the query,
	// so a wait for a server connection is in both; WaitMicros is the time clients
	// waited for a server connection (total_wait_time).
	TransactionMicros, QueryMicros, WaitMicros int64
}

// Stats reads SHOW STATS.
func (a *Admin) Stats(ctx context.Context) ([]DatabaseStats, error) {
	rows, err := a.show(ctx, "SHOW STATS")
	if err != nil {
		return nil, err
	}
	return parseStats(rows), nil
}

// parseStats reads SHOW STATS's rows by column name (later versions than 1.18 add
// columns, ignored here).
func parseStats(rows []map[string]string) []DatabaseStats {
	var stats []DatabaseStats
	for _, r := range rows {
		stats = append(stats, DatabaseStats{
			Database:     r["database"],
			Transactions: atoi(r["total_xact_count"]), Queries: atoi(r["total_query_count"]),
			ReceivedBytes: atoi(r["total_received"]), SentBytes: atoi(r["total_sent"]),
			TransactionMicros: atoi(r["total_xact_time"]), QueryMicros: atoi(r["total_query_time"]),
			WaitMicros: atoi(r["total_wait_time"]),
		})
	}
	return stats
}

// Lists is SHOW LISTS: how many of each of PgBouncer's objects it holds.
type Lists struct {
	Databases, Users, Pools int64
	// UsedClients are the clients connected (LoginClients of them logging in);
	// FreeClients the client objects allocated and unused. The same for servers.
	FreeClients, UsedClients, LoginClients int64
	FreeServers, UsedServers               int64
}

// Lists reads SHOW LISTS.
func (a *Admin) Lists(ctx context.Context) (Lists, error) {
	rows, err := a.show(ctx, "SHOW LISTS")
	if err != nil {
		return Lists{}, err
	}
	return parseLists(rows), nil
}

// parseLists reads SHOW LISTS's rows, one per list (column list) with its count
// (column items); a list PgBouncer does not report is 0, one it adds is ignored.
func parseLists(rows []map[string]string) Lists {
	var l Lists
	fields := map[string]*int64{
		"databases": &l.Databases, "users": &l.Users, "pools": &l.Pools,
		"free_clients": &l.FreeClients, "used_clients": &l.UsedClients, "login_clients": &l.LoginClients,
		"free_servers": &l.FreeServers, "used_servers": &l.UsedServers,
	}
	for _, r := range rows {
		if f, ok := fields[r["list"]]; ok {
			*f = atoi(r["items"])
		}
	}
	return l
}

// show runs a SHOW command and returns its rows by column name, as text.
func (a *Admin) show(ctx context.Context, cmd string) ([]map[string]string, error) {
	rows, err := a.conn.Query(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("PgBouncer %s: %w", cmd, err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	var out []map[string]string
	for rows.Next() {
		raw := rows.RawValues()
		row := make(map[string]string, len(fields))
		for i, f := range fields {
			if raw[i] != nil {
				row[f.Name] = string(raw[i])
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("PgBouncer %s: %w", cmd, err)
	}
	return out, nil
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
