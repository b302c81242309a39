package testutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func acked(endMs int) Attempt { return Attempt{Start: at(endMs - 1), End: at(endMs)} }

func failed(endMs int) Attempt {
	return Attempt{Start: at(endMs - 1), End: at(endMs), Err: errors.New("no")}
}

func TestUnavailability(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attempts []Attempt
		from, to int
		want     Gap
	}{
		{"no write at all: the whole window", nil, 0, 5000, Gap{at(0), at(5000)}},
		{"the longest of several gaps", []Attempt{acked(100), acked(200), failed(300), acked(2200), acked(2300)}, 0, 3000,
			Gap{at(200), at(2200)}},
		{"failures do not end a gap", []Attempt{acked(100), failed(1000), failed(2000)}, 0, 2500, Gap{at(100), at(2500)}},
		{"writes before the fault do not count", []Attempt{acked(10), acked(20), acked(1500)}, 1000, 2000,
			Gap{at(1000), at(1500)}},
		{"writes after recovery do not count", []Attempt{acked(1100), acked(9000)}, 1000, 2000, Gap{at(1100), at(2000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Unavailability(tc.attempts, at(tc.from), at(tc.to))); diff != "" {
				t.Error(diff)
			}
		})
	}
}

func TestCompareRows(t *testing.T) {
	attempts := []Attempt{
		{ID: 1, End: at(1)},
		{ID: 2, End: at(2)},
		{ID: 3, End: at(3), SyncWarning: "canceling wait for synchronous replication due to user request"},
		{ID: 4, End: at(4), SyncWarning: "canceling wait for synchronous replication due to user request"},
		{ID: 5, End: at(5), Err: errors.New("timeout")},
		{ID: 6, End: at(6), Err: errors.New("timeout")},
	}
	got := CompareRows(map[int64]bool{1: true, 4: true, 5: true}, attempts)
	want := RowCheck{Attempted: 6, Acked: 4, SyncWarned: 2, Lost: []int64{2, 3}, LostSyncWarned: 1, UnackedPresent: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
}

// A bulk transaction is lost when acknowledged and not wholly there, torn when partly
// there, acknowledged or not; attempts of one row are CompareRows's.
func TestCompareBulk(t *testing.T) {
	attempts := []Attempt{
		{ID: 1, Rows: 1, End: at(1)},
		{ID: 10, Rows: 100, End: at(2)},
		{ID: 11, Rows: 100, End: at(3)},
		{ID: 12, Rows: 100, End: at(4)},
		{ID: 13, Rows: 100, End: at(5), Err: errors.New("timeout")},
		{ID: 14, Rows: 100, End: at(6), Err: errors.New("timeout")},
	}
	got := CompareBulk(map[int64]int{1: 1, 10: 100, 12: 40, 13: 100, 14: 3}, attempts)
	want := BulkCheck{Attempted: 5, Acked: 3, Lost: []int64{11, 12}, LostRows: 160, Torn: []int64{12, 14}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	if c := CompareRows(map[int64]bool{1: true}, attempts); c.Attempted != 1 || len(c.Lost) != 0 {
		t.Errorf("CompareRows counted bulk attempts: %+v", c)
	}
}

func TestTwoWritable(t *testing.T) {
	ok := func(instance string, endMs int) ProbeResult {
		return ProbeResult{Instance: instance, Start: at(endMs - 5), End: at(endMs)}
	}
	bad := func(instance string, endMs int) ProbeResult {
		r := ok(instance, endMs)
		r.Err = errors.New("read-only")
		return r
	}
	results := []ProbeResult{
		ok("a", 10), bad("b", 20), ok("a", 110), // one writable instance
		ok("a", 205), ok("b", 290), ok("c", 299), // three in one bucket
		ok("a", 399), ok("b", 400), // adjacent buckets: not a moment
		ok("b", 510), bad("a", 520), ok("b", 590),
		ok("c", 710), ok("a", 750),
	}
	want := []Moment{{At: at(200), Instances: []string{"a", "b", "c"}}, {At: at(700), Instances: []string{"a", "c"}}}
	if diff := cmp.Diff(want, TwoWritable(results, 100*time.Millisecond)); diff != "" {
		t.Error(diff)
	}
}

// fakeServer is just enough of a PostgreSQL server for a pgx client: trust
// authentication, and every extended-protocol statement answered by answer, which may
// return nil to never answer (as a commit waiting for synchronous replication).
type fakeServer struct {
	ln     net.Listener
	answer func(n int) []pgproto3.BackendMessage

	mu       sync.Mutex
	cancels  int // cancel requests received
	closed   int // client connections that ended
	executed int
}

func newFakeServer(t *testing.T, answer func(n int) []pgproto3.BackendMessage) *fakeServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{ln: ln, answer: answer}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *fakeServer) config(t *testing.T) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://u@%s/db?sslmode=disable", s.ln.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (s *fakeServer) count(f *int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *f
}

func (s *fakeServer) serve(c net.Conn) {
	defer c.Close()
	b := pgproto3.NewBackend(c, c)
	m, err := b.ReceiveStartupMessage()
	if err != nil {
		return
	}
	if _, ok := m.(*pgproto3.CancelRequest); ok {
		s.mu.Lock()
		s.cancels++
		s.mu.Unlock()
		return
	}
	b.Send(&pgproto3.AuthenticationOk{})
	b.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: 7})
	b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if b.Flush() != nil {
		return
	}
	defer func() {
		s.mu.Lock()
		s.closed++
		s.mu.Unlock()
	}()
	for {
		m, err := b.Receive()
		if err != nil {
			return
		}
		switch m.(type) {
		case *pgproto3.Terminate:
			// A polite goodbye; wait for the socket to close like a backend would.
			_, _ = io.Copy(io.Discard, c)
			return
		case *pgproto3.Sync:
			s.mu.Lock()
			n := s.executed
			s.executed++
			s.mu.Unlock()
			msgs := s.answer(n)
			if msgs == nil {
				// Never answer, as a backend waiting for a standby does; it only notices
				// the client is gone when it reads again.
				_, _ = io.Copy(io.Discard, c)
				return
			}
			for _, msg := range msgs {
				b.Send(msg)
			}
			b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if b.Flush() != nil {
				return
			}
		}
	}
}

func inserted(notices ...pgproto3.BackendMessage) []pgproto3.BackendMessage {
	return append([]pgproto3.BackendMessage{&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.NoData{}},
		append(notices, &pgproto3.CommandComplete{CommandTag: []byte("INSERT 0 1")})...)
}

// pgx itself cancels a statement whose context ends (asyncClose sends a cancel request);
// Connect's connections never do, and are closed.
func TestConnectNeverSendsACancelRequest(t *testing.T) {
	hang := func(int) []pgproto3.BackendMessage { return nil }
	for _, tc := range []struct {
		name        string
		connect     func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error)
		wantCancels int
	}{
		{"pgx.ConnectConfig", pgx.ConnectConfig, 1},
		{"Connect", func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) { return Connect(ctx, cfg, nil) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeServer(t, hang)
			conn, err := tc.connect(context.Background(), s.config(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if _, err := conn.Exec(ctx, "INSERT INTO t (id) VALUES ($1)", 1); err == nil {
				t.Fatal("the statement succeeded; the fake server never answers")
			}
			Eventually(t, 5*time.Second, func() error {
				if s.count(&s.closed) != 1 {
					return errors.New("the connection is still open")
				}
				return nil
			})
			// asyncClose sends its cancel request before it closes the socket.
			if got := s.count(&s.cancels); got != tc.wantCancels {
				t.Errorf("%d cancel requests, want %d", got, tc.wantCancels)
			}
		})
	}
}

// A commit acknowledged with the synchronous-replication WARNING counts as acknowledged,
// and is marked; a commit that hangs past the timeout is not acknowledged.
func TestWriterRecordsEveryAttempt(t *testing.T) {
	warning := &pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000",
		Message: "canceling wait for synchronous replication due to user request",
		Detail:  "The transaction has already committed locally, but might not have been replicated to the standby."}
	s := newFakeServer(t, func(n int) []pgproto3.BackendMessage {
		switch {
		case n == 3:
			return nil
		case n%5 == 1:
			return inserted(warning)
		}
		return inserted()
	})
	cfg := s.config(t)
	w := StartWriter(func(context.Context) (*pgx.ConnConfig, error) { return cfg, nil },
		// Long enough that no attempt but the unanswered one times out on a loaded machine.
		WriterOptions{FirstID: 100, Timeout: 2 * time.Second, Interval: 5 * time.Millisecond})
	Eventually(t, 10*time.Second, func() error {
		as := w.Attempts()
		if len(as) < 40 || !slices.ContainsFunc(as, func(a Attempt) bool { return !a.Acked() }) {
			return fmt.Errorf("%d attempts so far, none failed", len(as))
		}
		return nil
	})
	attempts := w.Stop()
	writers := map[string]int{}
	ids := map[int64]bool{}
	var timedOut, warned int
	for _, a := range attempts {
		writers[a.Writer]++
		if ids[a.ID] {
			t.Errorf("id %d written twice", a.ID)
		}
		ids[a.ID] = true
		if !a.End.After(a.Start) && !a.End.Equal(a.Start) {
			t.Errorf("attempt %d ends before it starts", a.ID)
		}
		switch {
		case a.SyncWarning != "" && a.Acked():
			warned++
		case !a.Acked() && a.End.Sub(a.Start) >= 2*time.Second:
			timedOut++
		}
	}
	if writers[WriterPersistent] == 0 || writers[WriterPerStatement] == 0 {
		t.Errorf("attempts per writer: %v", writers)
	}
	if timedOut != 1 {
		t.Errorf("%d attempts timed out, want 1", timedOut)
	}
	if warned == 0 {
		t.Error("no attempt was acknowledged with the synchronous-replication warning")
	}
	if got := s.count(&s.cancels); got != 0 {
		t.Errorf("%d cancel requests sent", got)
	}
	if first := slices.MinFunc(attempts, func(a, b Attempt) int { return int(a.ID - b.ID) }).ID; first != 100 {
		t.Errorf("first id %d, want 100", first)
	}
	c := CompareRows(ids, attempts)
	if c.SyncWarned != warned || len(c.Lost) != 0 {
		t.Errorf("%+v", c)
	}
}
