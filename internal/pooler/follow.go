// Package pooler is the connection pooler's agent (docs/pooler.md): it runs beside
// PgBouncer, points its read-write pool at the holder of the primary Lease, and holds
// clients' queries (PAUSE) while the role moves, so that a planned move is a pause to
// them, not an error.
package pooler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// Step is what the follower does next.
type Step struct {
	// Pause holds new queries and closes the server connections once the queries in
	// flight end.
	Pause bool
	// Point moves the pool to this instance (its pod's name); "" leaves it.
	Point string
	// Resume lets held queries go on, to where the pool points.
	Resume bool
	// Why, for the log.
	Why string
}

// State is where the pool points and whether it is paused.
type State struct {
	Pointed string
	Paused  bool
	// Held: the primary's agent asked for a pause before it hands over (Follower.Hold),
	// and the Lease still names it in the same term. The pool stays paused even
	// though the primary would still accept writes for a moment: its lockout is about
	// to end every session on it.
	Held bool
}

// Next decides from the Lease's holder ("" while the role moves) and whether that
// holder accepts writes now. The pool never points at an instance the Lease does not
// name, and clients are held while no holder accepts writes: they wait rather than
// fail, up to PgBouncer's query_wait_timeout.
func Next(holder string, writable bool, s State) Step {
	switch {
	case s.Held:
		if !s.Paused {
			return Step{Pause: true, Why: fmt.Sprintf("%s hands over the primary role", holder)}
		}
	case holder == "":
		if !s.Paused {
			return Step{Pause: true, Why: "the primary Lease names no holder: the role is moving"}
		}
	case holder != s.Pointed:
		if !s.Paused {
			return Step{Pause: true, Why: fmt.Sprintf("the primary Lease names %s", holder)}
		}
		if writable {
			return Step{Point: holder, Resume: true, Why: fmt.Sprintf("%s accepts writes", holder)}
		}
	case s.Paused && writable:
		return Step{Resume: true, Why: fmt.Sprintf("%s accepts writes again", holder)}
	}
	return Step{}
}

// Pool is what the follower drives: PgBouncer, through its configuration file and its
// admin console.
type Pool interface {
	Pause(ctx context.Context) error
	// Point writes the configuration with the pool's server at pod and reloads it.
	Point(ctx context.Context, pod string) error
	Resume(ctx context.Context) error
}

// Follower keeps a Pool on the holder of the primary Lease.
type Follower struct {
	// Lease reads the primary Lease.
	Lease func(ctx context.Context) (primarylease.Record, error)
	// Writable says whether pod accepts writes now (a session as the lookup role finds
	// it out of recovery).
	Writable func(ctx context.Context, pod string) bool
	Pool     Pool
	// Period is how often the Lease is read; Changed, when set, receives when it
	// changed.
	Period  time.Duration
	Changed <-chan struct{}
	Log     logr.Logger

	// turn serialises Once (the Lease's changes, the period and Hold all take steps),
	// waited for under the caller's context: a pause asked for must not wait behind a
	// step stuck on PgBouncer for longer than its asker does.
	turn  chan struct{}
	mu    sync.Mutex
	state State
	hold  hold
}

// hold is a pause asked for by the primary's agent: it lasts while the Lease names
// holder in term, until at most until.
type hold struct {
	holder string
	term   int32
	until  time.Time
}

// Hold pauses the pool now, and keeps it paused while the Lease names holder in term,
// for at most d: the primary's agent asks for it before its handover (docs/pooler.md).
// A handover that is abandoned leaves the pool held until d passes. It returns once
// the pool is paused (the transactions in flight ended), or with the reason it is not.
func (f *Follower) Hold(ctx context.Context, holder string, term int32, d time.Duration) error {
	f.mu.Lock()
	f.hold = hold{holder: holder, term: term, until: time.Now().Add(d)}
	f.mu.Unlock()
	f.Once(ctx)
	if !f.State().Paused {
		return fmt.Errorf("the pool is not paused yet")
	}
	return nil
}

// Run follows the Lease until ctx ends: at once when Changed receives (the Lease
// changed), every Period otherwise, and every waitPeriod while the pool waits for a
// holder that accepts writes.
func (f *Follower) Run(ctx context.Context) {
	for {
		f.Once(ctx)
		wait := max(f.Period, 10*time.Millisecond)
		if f.State().Paused {
			wait = min(wait, waitPeriod)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.Changed:
		case <-time.After(wait):
		}
	}
}

// waitPeriod is how often a paused pool asks whether the holder accepts writes: the
// clients' queries wait meanwhile.
const waitPeriod = 50 * time.Millisecond

// Once reads the Lease and takes the steps it calls for, until none is left or one
// fails (the next call tries again).
func (f *Follower) Once(ctx context.Context) {
	if !f.takeTurn(ctx) {
		return
	}
	defer func() { <-f.turn }()
	rec, err := f.Lease(ctx)
	if err != nil {
		f.Log.Info("Cannot read the primary Lease", "error", err.Error())
		return
	}
	for range 3 { // at most: pause, then point and resume
		f.mu.Lock()
		h := f.hold
		f.state.Held = h.holder != "" && h.holder == rec.Holder && h.term == rec.Term && time.Now().Before(h.until)
		f.mu.Unlock()
		s := f.State()
		// Next reads writable only while paused and not held: a settled pool opens no
		// session, nor does one held on a primary that is locking its clients out.
		writable := s.Paused && !s.Held && rec.Holder != "" && f.Writable(ctx, rec.Holder)
		step := Next(rec.Holder, writable, s)
		if step == (Step{}) {
			return
		}
		if err := f.take(ctx, step); err != nil {
			f.Log.Info("Could not follow the primary Lease yet", "step", step.Why, "error", err.Error())
			return
		}
	}
}

// takeTurn waits for Once's turn until ctx ends; false when it ended first.
func (f *Follower) takeTurn(ctx context.Context) bool {
	f.mu.Lock()
	if f.turn == nil {
		f.turn = make(chan struct{}, 1)
	}
	turn := f.turn
	f.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// State is where the pool points and whether it is paused, as last done.
func (f *Follower) State() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

func (f *Follower) set(change func(*State)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.state)
}

func (f *Follower) take(ctx context.Context, step Step) error {
	if step.Pause {
		start := time.Now()
		if err := f.Pool.Pause(ctx); err != nil {
			return err
		}
		f.set(func(s *State) { s.Paused = true })
		f.Log.Info("Paused the pool", "reason", step.Why, "took", time.Since(start).Round(time.Millisecond).String())
	}
	if step.Point != "" {
		if err := f.Pool.Point(ctx, step.Point); err != nil {
			return err
		}
		f.set(func(s *State) { s.Pointed = step.Point })
		f.Log.Info("Pointed the pool at the primary", "primary", step.Point)
	}
	if step.Resume {
		if err := f.Pool.Resume(ctx); err != nil {
			return err
		}
		f.set(func(s *State) { s.Paused = false })
		f.Log.Info("Resumed the pool", "reason", step.Why)
	}
	return nil
}
