// Package gate is the commit gate: the synchronous standby without data that every
// primary's agent runs over the local socket. PostgreSQL acknowledges a commit only once
// the gate confirmed its WAL, and the gate confirms only while the primary's Lease
// confirmation is valid (docs/failover.md, "The commit gate").
package gate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// GateName is the commit gate's application_name: the first synchronous standby of
// every primary. It has an underscore, so no pod (a DNS label) can be named like it.
const GateName = "pgpilot_gate"

// gateStatusEvery is how often the gate reports its position even when nothing
// changed: often enough that a confirmation withheld and then given again reaches
// postgres quickly, and that the walsender never times the gate out.
const gateStatusEvery = 100 * time.Millisecond

// Gate is the commit gate (docs/failover.md): a physical replication client of the
// local postgres that holds no data. postgres acknowledges a commit only once the gate
// has confirmed its WAL, and the gate confirms WAL only while allowed() says the
// primary may write, checking it before every reply. Stopping acknowledgements thus
// needs no signal to postgres and survives any pause of the processes.
type Gate struct {
	// Connect opens a replication connection to the local postgres.
	Connect func(ctx context.Context) (*pgconn.PgConn, error)
	// Allowed reports whether commits may be acknowledged now.
	Allowed func() bool
	// Limit, when set, is the furthest WAL position the gate may confirm now (the loss
	// budget, lossbudget.go).
	Limit func() pglogrepl.LSN
	Log   logr.Logger

	// draining makes the gate report WAL as written, but not flushed: a clean shutdown
	// waits for every standby to have written everything, while commits (which wait for
	// the flush) stay unacknowledged.
	draining  atomic.Bool
	connected atomic.Bool
	confirmed atomic.Uint64
	// pid is the backend pid of the gate's connection, its walsender's; 0 between
	// connections.
	pid atomic.Uint32
	// reporting is held while a report is built and sent, so that Drain knows the
	// last position any report confirmed.
	reporting sync.Mutex
}

// Connected reports whether the gate streams from postgres now.
func (g *Gate) Connected() bool { return g.connected.Load() }

// PID is the backend pid of the gate's walsender, 0 while it has no connection: any
// other walsender named GateName is not the gate (TerminateGateImpostors).
func (g *Gate) PID() uint32 { return g.pid.Load() }

// Confirmed is the last WAL position the gate confirmed.
func (g *Gate) Confirmed() uint64 { return g.confirmed.Load() }

// Drain switches to reporting WAL written but not flushed, for a clean shutdown. It
// returns the last position the gate confirmed as flushed, and whether it streams: once
// Allowed says no (the caller makes sure of that first), no commit after that position
// is ever acknowledged while the gate stays connected.
func (g *Gate) Drain() (confirmed pglogrepl.LSN, connected bool) {
	g.reporting.Lock()
	defer g.reporting.Unlock()
	g.draining.Store(true)
	return pglogrepl.LSN(g.confirmed.Load()), g.connected.Load()
}

// Run streams until ctx ends, connecting again when the stream breaks (after 10 ms,
// doubling up to gateRetryLongest): while the gate is away, commits wait, so a new
// primary's first commits wait for its first connection.
func (g *Gate) Run(ctx context.Context) {
	defer g.connected.Store(false)
	lastErr := ""
	down, attempts := time.Now(), 0
	retry := gateRetryFirst
	for ctx.Err() == nil {
		attempts++
		err := g.session(ctx, func() {
			g.Log.Info("The commit gate streams", "after", time.Since(down).Round(time.Millisecond).String(), "attempts", attempts)
			lastErr, attempts, retry = "", 0, gateRetryFirst
		})
		g.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if attempts == 0 {
			down = time.Now()
		}
		if msg := err.Error(); msg != lastErr {
			g.Log.Info("The commit gate lost its stream; connecting again", "error", msg)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
		retry = min(2*retry, gateRetryLongest)
	}
}

// The commit gate's waits between connection attempts.
const (
	gateRetryFirst   = 10 * time.Millisecond
	gateRetryLongest = 100 * time.Millisecond
)

// session streams once; streaming is called once the stream started.
func (g *Gate) session(ctx context.Context, streaming func()) error {
	conn, err := g.Connect(ctx)
	if err != nil {
		return err
	}
	g.pid.Store(conn.PID())
	defer func() {
		g.pid.Store(0)
		conn.Close(context.Background())
	}()
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	if err := startPhysical(ctx, conn, sys.XLogPos, sys.Timeline); err != nil {
		return fmt.Errorf("START_REPLICATION: %w", err)
	}
	g.connected.Store(true)
	streaming()
	g.reporting.Lock()
	// What this connection reports as flushed until Allowed says yes: no more than the
	// gate confirmed before. A connection made while commits may not be acknowledged
	// (a walsender that timed the gate out while a frozen primary thawed) must not
	// release the commits that wait for it.
	before := min(sys.XLogPos, pglogrepl.LSN(g.confirmed.Load()))
	start := before
	if g.Allowed() && !g.draining.Load() {
		// Commits that waited for the gate to connect, before sys.XLogPos (and within
		// the loss budget), may go.
		start = sys.XLogPos
		if g.Limit != nil {
			start = max(min(start, g.Limit()), before)
		}
		g.confirmed.Store(uint64(start))
	}
	s := gateStream{g: g, conn: conn, received: sys.XLogPos, flushed: start}
	g.reporting.Unlock()
	return s.run(ctx)
}

// startPhysical starts streaming without a slot (pglogrepl.StartReplication always
// names one).
func startPhysical(ctx context.Context, conn *pgconn.PgConn, from pglogrepl.LSN, timeline int32) error {
	conn.Frontend().SendQuery(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION PHYSICAL %s TIMELINE %d", from, timeline)})
	if err := conn.Frontend().Flush(); err != nil {
		return err
	}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.NoticeResponse:
		default:
			return fmt.Errorf("unexpected %T", msg)
		}
	}
}

type gateStream struct {
	g        *Gate
	conn     *pgconn.PgConn
	received pglogrepl.LSN
	// flushed is what was last reported as flushed.
	flushed pglogrepl.LSN
	written pglogrepl.LSN
	sentAt  time.Time
}

// run receives and replies until the stream or ctx ends. Each wait for a message ends at
// the next periodic report, by a read deadline on the socket rather than a context: a
// receive with a context that can end starts and stops a goroutine to watch it, and
// every commit costs at least one receive, so the gate would pay that on the path of
// every commit (docs/failover.md, "What the gate costs").
func (s *gateStream) run(ctx context.Context) error {
	var deadline time.Time
	for {
		if err := s.report(ctx, false); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if next := s.sentAt.Add(gateStatusEvery); !next.Equal(deadline) {
			deadline = next
			if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
				return err
			}
		}
		// context.Background, exactly: pgconn watches any other context.
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handle(ctx, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			// The switch to the next timeline waits for its replies by ctx alone.
			deadline = time.Time{}
			if err := s.conn.Conn().SetReadDeadline(deadline); err != nil {
				return err
			}
			if err := s.nextTimeline(ctx); err != nil {
				return err
			}
		}
	}
}

// nextTimeline follows a timeline switch on the same connection. The gate of a standby
// being promoted connects before the promotion (a new connection costs a process and
// an authentication, half a second on a busy node, while commits wait for the gate):
// at the promotion its walsender ends the old timeline, and the gate asks for the new
// one from where it begins. A server that shuts down ends the stream instead.
func (s *gateStream) nextTimeline(ctx context.Context) error {
	next, err := pglogrepl.SendStandbyCopyDone(ctx, s.conn)
	if err != nil {
		return fmt.Errorf("ending the stream: %w", err)
	}
	if next == nil || next.Timeline == 0 {
		return errors.New("the server ended the stream (shutdown)")
	}
	if err := startPhysical(ctx, s.conn, next.LSN, next.Timeline); err != nil {
		return fmt.Errorf("START_REPLICATION on timeline %d: %w", next.Timeline, err)
	}
	s.g.reporting.Lock()
	// The new timeline starts at next.LSN, which may be before what was received on the
	// old one (its invalid tail is discarded).
	s.received, s.flushed, s.written = next.LSN, next.LSN, next.LSN
	s.g.reporting.Unlock()
	s.g.Log.Info("The commit gate follows the new timeline", "timeline", next.Timeline, "from", next.LSN.String())
	return nil
}

func (s *gateStream) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		if end := x.WALStart + pglogrepl.LSN(len(x.WALData)); end > s.received {
			s.received = end
		}
		return s.report(ctx, false)
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		return s.report(ctx, k.ReplyRequested)
	}
	return nil
}

// report sends the gate's position when it changed, when asked, and every
// gateStatusEvery. The flush position advances only while commits may be acknowledged:
// Allowed is read right before the message is built.
func (s *gateStream) report(_ context.Context, asked bool) error {
	s.g.reporting.Lock()
	defer s.g.reporting.Unlock()
	flushed, written := s.flushed, s.received
	if s.g.Allowed() {
		flushed = s.received
		if s.g.Limit != nil {
			// Never back: what was confirmed stays confirmed.
			flushed = max(min(flushed, s.g.Limit()), s.flushed)
		}
	}
	reportedFlush := flushed
	if s.g.draining.Load() {
		// A walsender ends its shutdown once the position its client replicated
		// reaches the end of WAL, and that position is the flush position unless the
		// flush is reported invalid (0), when it is the write position
		// (WalSndDone). So the drain reports the flush as 0: the gate's walsender can
		// finish, and no commit waiting for the gate is acknowledged.
		reportedFlush = 0
	} else {
		written = flushed
	}
	if !asked && flushed == s.flushed && written == s.written && time.Since(s.sentAt) < gateStatusEvery {
		return nil
	}
	err := sendStatus(s.conn, written, reportedFlush)
	if err != nil {
		return err
	}
	s.flushed, s.written, s.sentAt = flushed, written, time.Now()
	s.g.confirmed.Store(uint64(flushed))
	return nil
}

// sendStatus sends a standby status update with these write and flush (and apply)
// positions. pglogrepl's SendStandbyStatusUpdate cannot send a flush position of 0: it
// replaces it with the write position.
func sendStatus(conn *pgconn.PgConn, written, flushed pglogrepl.LSN) error {
	const pgEpochMicros = 946684800 * 1000000 // 2000-01-01 in microseconds since 1970
	data := make([]byte, 0, 34)
	data = append(data, pglogrepl.StandbyStatusUpdateByteID)
	data = binary.BigEndian.AppendUint64(data, uint64(written))
	data = binary.BigEndian.AppendUint64(data, uint64(flushed))
	data = binary.BigEndian.AppendUint64(data, uint64(flushed))
	data = binary.BigEndian.AppendUint64(data, uint64(time.Now().UnixMicro()-pgEpochMicros))
	data = append(data, 0) // no reply requested
	buf, err := (&pgproto3.CopyData{Data: data}).Encode(nil)
	if err != nil {
		return err
	}
	return conn.Frontend().SendUnbufferedEncodedCopyData(buf)
}

// Draining reports whether the gate reports WAL as written but not flushed, for a clean
// shutdown.
func (g *Gate) Draining() bool { return g.draining.Load() }
