package testutil

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// errNoCancel is what a connection opened by Connect gets when pgx tries to open a
// second connection to send a cancel request.
var errNoCancel = errors.New("testutil: cancel requests are never sent")

// Connect opens a connection with cfg (from pgx.ParseConfig) whose statements a
// context ends by closing the connection, never by asking PostgreSQL to cancel them.
//
// The difference matters for a fault test. A commit waiting for synchronous
// replication that receives a cancel request is acknowledged with a WARNING ("canceling
// wait for synchronous replication"), although no standby has it: a client that cancels
// on timeout turns its own timeouts into acknowledged commits that may be lost. A
// closed connection leaves the commit unacknowledged, as a client that gave up sees it.
//
// In pgx v5.7.2 the default context handler already only sets a deadline on the socket
// (pgconn.DeadlineContextWatcherHandler; Connect sets it explicitly so a change of
// default cannot slip in), but a statement that fails on that deadline makes pgconn
// close the connection with asyncClose, which first sends a cancel request on a new
// connection through cfg.DialFunc. So Connect also wraps DialFunc: once the connection
// is established, every further dial from it (which can only be a cancel request)
// fails, and asyncClose goes on to close the socket.
//
// Statements run with pgx.QueryExecModeExec: one round trip, no prepared statement.
// onNotice, if not nil, receives every notice and warning the server sends.
func Connect(ctx context.Context, cfg *pgx.ConnConfig, onNotice func(*pgconn.Notice)) (*pgx.Conn, error) {
	cfg = cfg.Copy()
	var connected atomic.Bool
	dial := cfg.DialFunc
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if connected.Load() {
			return nil, errNoCancel
		}
		return dial(ctx, network, addr)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	if onNotice != nil {
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { onNotice(n) }
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	// Fallback configurations (sslmode=prefer) dial more than once while connecting;
	// from here on nothing may.
	connected.Store(true)
	return conn, err
}

// ConnectCancelling is Connect for a client that behaves as most drivers do: when a
// statement's context ends, it sends PostgreSQL a cancel request (on a new connection,
// at once), and closes the connection only if no answer has come 2 s later. A commit
// waiting for synchronous replication that is cancelled so is acknowledged, with the
// WARNING "canceling wait for synchronous replication" (onNotice receives it), although
// no standby may have it: the chaos suite's cancelling writer counts those commits.
func ConnectCancelling(ctx context.Context, cfg *pgx.ConnConfig, onNotice func(*pgconn.Notice)) (*pgx.Conn, error) {
	cfg = cfg.Copy()
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 2 * time.Second}
	}
	if onNotice != nil {
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { onNotice(n) }
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return pgx.ConnectConfig(ctx, cfg)
}

// syncWarnings remembers the last notice of a connection that says a commit's wait for
// synchronous replication was cut short.
type syncWarnings struct {
	mu   sync.Mutex
	last string
}

func (s *syncWarnings) notice(n *pgconn.Notice) {
	if !IsSyncReplicationWarning(n) {
		return
	}
	s.mu.Lock()
	s.last = n.Message
	s.mu.Unlock()
}

// take returns the warning received since the last take, if any, and forgets it.
func (s *syncWarnings) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.last
	s.last = ""
	return w
}

// IsSyncReplicationWarning reports whether n is PostgreSQL's notice that a commit
// stopped waiting for synchronous replication: the commit is then acknowledged although
// it may not have reached any standby ("canceling wait for synchronous replication due
// to user request", "... due to administrator command").
func IsSyncReplicationWarning(n *pgconn.Notice) bool {
	return strings.Contains(strings.ToLower(n.Message+" "+n.Detail), "synchronous replication")
}
