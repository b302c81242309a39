package testutil

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Target returns the settings (from pgx.ParseConfig) of the endpoint to write to. It is
// called for every new connection, so it may look the endpoint up each time.
type Target func(ctx context.Context) (*pgx.ConnConfig, error)

// The writers of a Writer, as Attempt.Writer names them.
const (
	// WriterPersistent keeps one connection, and opens a new one after any error.
	WriterPersistent = "persistent"
	// WriterPerStatement opens a connection for every statement, as a short-lived
	// client does.
	WriterPerStatement = "per-statement"
	// WriterLocal is a persistent connection that runs SET synchronous_commit = local
	// once connected (WriterOptions.LocalSession): its commits do not wait for a
	// synchronous standby, which any client may ask for.
	WriterLocal = "local-session"
	// WriterCancelling is a persistent connection that, when an attempt times out,
	// sends PostgreSQL a cancel request as most drivers do (WriterOptions.Cancelling):
	// a commit cancelled while it waits for synchronous replication is acknowledged
	// with a WARNING.
	WriterCancelling = "cancelling"
	// WriterBulk is a persistent connection that commits WriterOptions.BulkRows rows
	// in one INSERT ... SELECT each time (WriterOptions.BulkTable).
	WriterBulk = "bulk"
)

// Attempt is one insert of a Writer: one row, one autocommit statement.
type Attempt struct {
	// Writer is WriterPersistent or WriterPerStatement.
	Writer string
	// ID is the row's id, unique among every Writer that shares the table and FirstID.
	// A bulk attempt's rows all carry it, in BulkTable's column txn.
	ID int64
	// Rows is how many rows the attempt commits: 1, or BulkRows for WriterBulk.
	Rows int
	// Start is when the attempt began (before connecting, for a new connection), End
	// when its answer (or error) arrived.
	Start, End time.Time
	// Connected is when a new connection the attempt opened was ready for its insert
	// (zero when it reused one or did not connect): reports tell a slow connection from
	// a slow commit.
	Connected time.Time
	// Err is nil when the commit was acknowledged.
	Err error
	// SyncWarning is set when the commit was acknowledged with PostgreSQL's WARNING that
	// its wait for synchronous replication was cut short: acknowledged, but not
	// necessarily on any standby. Reports count these apart.
	SyncWarning string
}

// Acked reports whether the server acknowledged the commit.
func (a Attempt) Acked() bool { return a.Err == nil }

// WriterOptions configures a Writer.
type WriterOptions struct {
	// Table is the table written to; it needs a bigint column id. Default "acked".
	Table string
	// FirstID is the first id written; the ids that follow grow by one. Give each
	// Writer on the same table its own range.
	FirstID int64
	// Timeout bounds each attempt, connecting included. When it passes the connection
	// is closed, never cancelled (see Connect). Default 3 s.
	Timeout time.Duration
	// Interval is the least time from the start of one attempt of the persistent writer
	// to the start of its next; 0 writes as fast as possible.
	Interval time.Duration
	// PerStatementInterval is the same for the per-statement writer; default Interval.
	// A new connection costs the server a process and an authentication: on a small
	// machine a fast per-statement writer starves the very processes under test.
	PerStatementInterval time.Duration

	// LocalSession adds the writer WriterLocal, at Interval.
	LocalSession bool
	// Cancelling adds the writer WriterCancelling, at Interval, whose attempts time out
	// after CancelTimeout (default 1 s): then a cancel request is sent, and the
	// connection closed 2 s later if the answer has not come.
	Cancelling    bool
	CancelTimeout time.Duration
	// BulkRows > 0 adds the writer WriterBulk: each attempt inserts BulkRows rows
	// (txn, n) into BulkTable (default "bulk"), txn being the attempt's ID, in one
	// statement, bounded by BulkTimeout (default 30 s), at most every BulkInterval.
	BulkRows     int
	BulkTable    string
	BulkTimeout  time.Duration
	BulkInterval time.Duration
}

// Writer inserts rows through two writers at once, one with a persistent connection
// and one with a connection per statement, and records every attempt. Options add
// writers that loosen durability as clients may (LocalSession, Cancelling) and one
// that commits large transactions (BulkRows). Faults hit
// both kinds of clients differently: a persistent connection sees a broken socket, a
// new one sees where the endpoint points now.
type Writer struct {
	target Target
	opts   WriterOptions
	next   atomic.Int64
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu       sync.Mutex
	attempts []Attempt
	// inFlight is when each writer's current attempt started (absent between attempts).
	inFlight map[string]time.Time
}

// StartWriter starts the two writers; Stop ends them.
func StartWriter(target Target, opts WriterOptions) *Writer {
	if opts.Table == "" {
		opts.Table = "acked"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Second
	}
	if opts.PerStatementInterval == 0 {
		opts.PerStatementInterval = opts.Interval
	}
	if opts.CancelTimeout == 0 {
		opts.CancelTimeout = time.Second
	}
	if opts.BulkTable == "" {
		opts.BulkTable = "bulk"
	}
	if opts.BulkTimeout == 0 {
		opts.BulkTimeout = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer{target: target, opts: opts, cancel: cancel, inFlight: map[string]time.Time{}}
	w.next.Store(opts.FirstID)
	insert := w.insertSQL()
	loops := []loop{{name: WriterPersistent, interval: opts.Interval, timeout: opts.Timeout, sql: insert}}
	if opts.LocalSession {
		loops = append(loops, loop{name: WriterLocal, interval: opts.Interval, timeout: opts.Timeout, sql: insert,
			setup: "SET synchronous_commit = local"})
	}
	if opts.Cancelling {
		loops = append(loops, loop{name: WriterCancelling, interval: opts.Interval, timeout: opts.CancelTimeout, sql: insert,
			cancel: true})
	}
	if opts.BulkRows > 0 {
		loops = append(loops, loop{name: WriterBulk, interval: opts.BulkInterval, timeout: opts.BulkTimeout, rows: opts.BulkRows,
			sql: "INSERT INTO " + pgx.Identifier{opts.BulkTable}.Sanitize() +
				fmt.Sprintf(" (txn, n) SELECT $1, g FROM generate_series(1, %d) g", opts.BulkRows)})
	}
	w.done.Add(len(loops) + 1)
	for _, l := range loops {
		go w.persistent(ctx, l)
	}
	go w.perStatement(ctx)
	return w
}

// loop is one writer with a persistent connection.
type loop struct {
	name              string
	interval, timeout time.Duration
	// sql is the insert, with the attempt's ID as $1; rows how many rows it writes.
	sql  string
	rows int
	// setup runs on every new connection before its first insert.
	setup string
	// cancel: a timed-out attempt sends a cancel request (ConnectCancelling).
	cancel bool
}

// InFlight returns when the current attempt of writer (WriterBulk, ...) started, and
// false when it is between attempts.
func (w *Writer) InFlight(writer string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.inFlight[writer]
	return t, ok
}

func (w *Writer) begin(a Attempt) {
	w.mu.Lock()
	w.inFlight[a.Writer] = a.Start
	w.mu.Unlock()
}

// Stop ends both writers, waits for their last attempts, and returns every attempt.
// An attempt still waiting when Stop is called ends unacknowledged.
func (w *Writer) Stop() []Attempt {
	w.cancel()
	w.done.Wait()
	return w.Attempts()
}

// Attempts returns the attempts recorded so far, in the order they ended.
func (w *Writer) Attempts() []Attempt {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Attempt(nil), w.attempts...)
}

// NextID is the id the next attempt will write: a later Writer on the same table
// starts from it.
func (w *Writer) NextID() int64 { return w.next.Load() }

func (w *Writer) record(a Attempt) {
	w.mu.Lock()
	w.attempts = append(w.attempts, a)
	delete(w.inFlight, a.Writer)
	w.mu.Unlock()
}

func (w *Writer) insertSQL() string {
	return "INSERT INTO " + pgx.Identifier{w.opts.Table}.Sanitize() + " (id) VALUES ($1)"
}

// pace waits until interval has passed since start, or ctx ends; false when it ended.
func pace(ctx context.Context, start time.Time, interval time.Duration) bool {
	wait := time.Until(start.Add(interval))
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (w *Writer) persistent(ctx context.Context, l loop) {
	defer w.done.Done()
	var (
		conn  *pgx.Conn
		warns = &syncWarnings{}
	)
	defer func() {
		if conn != nil {
			closeQuietly(conn)
		}
	}()
	rows := max(l.rows, 1)
	for ctx.Err() == nil {
		a := Attempt{Writer: l.name, ID: w.next.Add(1) - 1, Rows: rows, Start: time.Now()}
		w.begin(a)
		// Connecting is bounded by Timeout at least: the cancelling writer's shorter
		// timeout is the commit's.
		actx, cancel := context.WithTimeout(ctx, max(w.opts.Timeout, l.timeout))
		if conn == nil {
			warns = &syncWarnings{}
			if conn, a.Err = w.open(actx, warns, l.cancel); a.Err == nil {
				a.Connected = time.Now()
				if l.setup != "" {
					_, a.Err = conn.Exec(actx, l.setup)
				}
			}
		}
		if a.Err == nil {
			ictx, icancel := context.WithTimeout(actx, l.timeout)
			warns.take()
			_, a.Err = conn.Exec(ictx, l.sql, a.ID)
			a.SyncWarning = warns.take()
			icancel()
		}
		cancel()
		a.End = time.Now()
		if a.Err != nil && conn != nil {
			closeQuietly(conn)
			conn = nil
		}
		w.record(a)
		if !pace(ctx, a.Start, l.interval) {
			return
		}
	}
}

func (w *Writer) perStatement(ctx context.Context) {
	defer w.done.Done()
	for ctx.Err() == nil {
		a := Attempt{Writer: WriterPerStatement, ID: w.next.Add(1) - 1, Rows: 1, Start: time.Now()}
		w.begin(a)
		actx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
		warns := &syncWarnings{}
		conn, err := w.open(actx, warns, false)
		if err == nil {
			a.Connected = time.Now()
			_, err = conn.Exec(actx, w.insertSQL(), a.ID)
			a.SyncWarning = warns.take()
			// The commit's answer is in: closing is not part of the attempt.
			a.End = time.Now()
			closeQuietly(conn)
		} else {
			a.End = time.Now()
		}
		cancel()
		a.Err = err
		w.record(a)
		if !pace(ctx, a.Start, w.opts.PerStatementInterval) {
			return
		}
	}
}

// open connects to the target; cancelling, with ConnectCancelling, else with Connect.
func (w *Writer) open(ctx context.Context, warns *syncWarnings, cancelling bool) (*pgx.Conn, error) {
	cfg, err := w.target(ctx)
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	if cancelling {
		return ConnectCancelling(ctx, cfg, warns.notice)
	}
	return Connect(ctx, cfg, warns.notice)
}

// closeQuietly closes conn, giving the server at most a second to take the goodbye.
func closeQuietly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
