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
}

// Next decides from the Lease's holder ("" while the role moves) and whether that
// holder accepts writes now. The pool never points at an instance the Lease does not
// name, and clients are held while no holder accepts writes: they wait rather than
// fail, up to PgBouncer's query_wait_timeout.
func Next(holder string, writable bool, s State) Step {
	switch {
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
	// Period is how often the Lease is read.
	Period time.Duration
	Log    logr.Logger

	mu    sync.Mutex
	state State
}

// Run follows the Lease until ctx ends.
func (f *Follower) Run(ctx context.Context) {
	tick := time.NewTicker(max(f.Period, 10*time.Millisecond))
	defer tick.Stop()
	for {
		f.Once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Once reads the Lease and takes the steps it calls for, until none is left or one
// fails (the next call tries again).
func (f *Follower) Once(ctx context.Context) {
	rec, err := f.Lease(ctx)
	if err != nil {
		f.Log.Info("Cannot read the primary Lease", "error", err.Error())
		return
	}
	for range 3 { // at most: pause, then point and resume
		s := f.State()
		// Next reads writable only while paused: a settled pool opens no session.
		writable := s.Paused && rec.Holder != "" && f.Writable(ctx, rec.Holder)
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
