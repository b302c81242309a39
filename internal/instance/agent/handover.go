package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// startGate starts the commit gate of a primary, once.
func (a *Agent) startGate() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gate != nil {
		return
	}
	// Not Run's context: on SIGTERM the gate must outlive Run until postgres stopped.
	ctx, cancel := context.WithCancel(context.Background())
	// With a loss budget nothing is confirmed before the first read of the standbys'
	// positions (keepLossLimit).
	if a.cluster.LossBudget != nil {
		a.lossLimit.Store(0)
	} else {
		a.lossLimit.Store(uint64(unlimited))
	}
	g := &gate.Gate{Connect: a.db.ReplicationConn, Allowed: a.allowed, Limit: a.gateLimit, Log: a.log.WithName("gate")}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	a.gate = g
	a.gateStop = func() { cancel(); <-done }
}

// stopGate stops the commit gate, after postgres stopped (while postgres runs, a
// disconnected gate would let FIRST k+1 fall back to the standbys alone).
func (a *Agent) stopGate() {
	a.mu.Lock()
	stop := a.gateStop
	a.gate, a.gateStop = nil, nil
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// stopPostgres stops postgres in mode, then its gate.
func (a *Agent) stopPostgres(mode postgres.StopMode) {
	p := a.process()
	if p == nil {
		a.stopGate()
		return
	}
	if sig := p.Stop(a.cfg.ShutdownTimeout, mode); sig != 0 {
		a.log.Info("Postgres did not stop in time: escalated", "signal", sig.String(), "timeout", a.cfg.ShutdownTimeout.String())
	}
	a.db.Reset()
	a.stopGate()
	a.setState(nil, agentapi.RoleStopped, "")
	a.log.Info("Postgres stopped")
}

// fence stops acknowledging commits at once, kills postgres, and keeps it
// down while the Lease stays in term (I2 in docs/failover.md).
func (a *Agent) fence(term int32) {
	a.fencedNow.Store(true)
	a.mu.Lock()
	a.fenced, a.fencedTerm = true, term
	a.mu.Unlock()
	a.stopPostgres(postgres.StopKill)
	a.mu.Lock()
	a.role = agentapi.RoleFenced
	a.mu.Unlock()
}

// markFrozen makes a standby refuse failsafe confirmations from now on, until the Lease
// names a holder in a later term than it names now.
func (a *Agent) markFrozen() {
	term := a.lease.View().Term
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.frozen || term > a.frozenTerm {
		a.frozen, a.frozenTerm = true, term
	}
}

// freeze stops a running standby's WAL receiver and waits until it is gone: its
// position is final until the Lease names a primary again (I3).
func (a *Agent) freeze(ctx context.Context) error {
	a.markFrozen()
	a.mu.Lock()
	running := a.proc != nil && a.role == agentapi.RoleReplica
	upstream := a.upstream
	a.mu.Unlock()
	if !running || upstream == "" {
		return nil
	}
	if err := a.writeConfig(a.confInput(pgconf.AsStandby, "")); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		stopped, err := a.db.ReceiverStopped(ctx)
		if err == nil && stopped {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the WAL receiver did not stop: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	a.setState(a.process(), agentapi.RoleReplica, "")
	a.log.Info("Frozen: stopped receiving WAL until the Lease names a primary", "from", upstream)
	return nil
}

// handover stops a primary the way I4 says (docs/failover.md). The gate stops
// acknowledging first: every commit ever acknowledged is then at or before the gate's
// last confirmed position A. With immediate, once a standby has flushed A, postgres is
// killed (StopKill): nothing it could still write was acknowledged, and with its walsenders
// gone every standby's position is final, so the operator can promote the most
// advanced one at once. Only when no standby gets A within handoverCatchUp is postgres
// stopped fast instead, which sends every standby still connected all its WAL (the
// handover is then clean once the control file records the shutdown checkpoint, and the
// rest of that stop need not delay the release). stopped is closed once postgres has
// exited. The instance stays down in the Lease's current term; a stopped former
// primary rejoins by a rewind when it wrote WAL the new primary does not have.
//
// A switchover stops fast (immediate false): the standbys then all end at the same
// final position, so the target it names is as advanced as any other; after an
// immediate stop one standby may hold a few more (unacknowledged) records than the
// target, and could then not follow it. The operator promotes the most advanced
// standby after a SIGTERM's handover.
func (a *Agent) handover(ctx context.Context, immediate bool) (h agentapi.Handover, stopped <-chan struct{}) {
	term := a.lease.View().Term
	a.handingOver.Store(true)
	a.mu.Lock()
	a.fenced, a.fencedTerm = true, term
	gate := a.gate
	a.mu.Unlock()
	h = agentapi.Handover{Term: term}
	start := time.Now()
	// Commits that skip the gate (synchronous_commit local or off in a session) end
	// with the client sessions: after this, nothing more is acknowledged at all.
	a.lockOut(ctx, "handing over")
	var acked pglogrepl.LSN
	streaming := false
	if gate != nil {
		acked, streaming = gate.Drain()
	}
	if streaming && immediate {
		// Every commit acknowledged without the gate (synchronous_commit local or off)
		// was made by a client session: once none is left, such commits are all before
		// the end of WAL as it is then. Without that certainty postgres stops fast
		// below, which sends standbys all its WAL.
		if final, ok := a.endOfClientWAL(ctx, acked); ok {
			tl, has := a.standbyHas(ctx, final)
			// Looked at again just before the kill: a session whose authentication
			// began before the lockout's reload may have started since.
			if again, still := a.endOfClientWAL(ctx, acked); has && still && again == final {
				a.stopPostgres(postgres.StopKill)
				h.Clean, h.FinalLSN, h.Timeline = true, final.String(), tl
				a.handedOver(h, "a standby had every acknowledged commit: killed postgres", start)
				done := make(chan struct{})
				close(done)
				return h, done
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.stopPostgres(postgres.StopFast)
		a.mu.Lock()
		a.role = agentapi.RoleFenced
		a.mu.Unlock()
	}()
	for {
		exited := false
		select {
		case <-done:
			exited = true
		case <-time.After(shutdownPoll):
		}
		if cd, err := a.pg.ControlData(ctx); err == nil && cd.ShutDown() {
			h.Clean, h.FinalLSN, h.Timeline = true, cd.Checkpoint, cd.Timeline
			break
		}
		if exited || ctx.Err() != nil {
			break
		}
	}
	a.handedOver(h, "stopped postgres fast: it wrote its shutdown checkpoint", start)
	return h, done
}

// stopKept stops postgres because the Lease keeps this instance down (why): cleanly
// (stopCleanly), keeping the Lease: a primary is still the primary, and starts as one
// when the Lease lets it. Its final position is in its status (Handover).
func (a *Agent) stopKept(ctx context.Context, why string) {
	a.log.Info("Stopping postgres: the primary Lease keeps this instance down", "reason", why)
	a.stopCleanly(ctx)
	a.mu.Lock()
	a.role = agentapi.RoleStopped
	a.mu.Unlock()
}

// stopCleanly stops postgres fast, keeping the Lease. A primary stops the way a
// switchover does: its commit gate drains first, so that nothing more is acknowledged
// and the gate's walsender can end the shutdown (a gate that merely withholds keeps
// it waiting: a single-instance primary took three quarters of the shutdown timeout to
// stop, then an immediate shutdown), and every connected standby receives its WAL up
// to the shutdown checkpoint. The instance is not fenced afterwards: what starts it
// again is the caller's or the Lease's business.
func (a *Agent) stopCleanly(ctx context.Context) {
	a.mu.Lock()
	primary := a.role == agentapi.RolePrimary
	a.mu.Unlock()
	if !primary {
		a.stopPostgres(postgres.StopFast)
		return
	}
	_, stopped := a.handover(ctx, false)
	<-stopped
	a.mu.Lock()
	a.fenced = false
	a.mu.Unlock()
	a.handingOver.Store(false)
}

// handedOver records a handover's outcome.
func (a *Agent) handedOver(h agentapi.Handover, how string, start time.Time) {
	a.mu.Lock()
	a.lastHandover, a.role = &h, agentapi.RoleFenced
	a.mu.Unlock()
	a.fencedNow.Store(true)
	a.log.Info("Handed over: stopped acknowledging commits, "+how, "clean", h.Clean,
		"finalLSN", h.FinalLSN, "timeline", h.Timeline, "took", time.Since(start).Round(time.Millisecond).String())
}

// endOfClientWAL ends every client session (the lockout keeps new ones out) and returns
// the end of WAL once a look finds none left, or acked when that is further; false when
// sessions were still found after endClientPasses looks, or postgres could not be asked.
func (a *Agent) endOfClientWAL(ctx context.Context, acked pglogrepl.LSN) (pglogrepl.LSN, bool) {
	for range endClientPasses {
		n, err := a.db.EndClientSessions(ctx)
		if err != nil {
			a.log.Error(err, "Handing over: ending client sessions")
			return 0, false
		}
		if n > 0 {
			continue
		}
		end, err := a.db.WALInsertLSN(ctx)
		if err != nil {
			a.log.Error(err, "Handing over: reading the end of WAL")
			return 0, false
		}
		return max(end, acked), true
	}
	a.log.Info("Handing over: client sessions were still found after ending them; stopping postgres fast", "looks", endClientPasses)
	return 0, false
}

// endClientPasses bounds endOfClientWAL's looks.
const endClientPasses = 10

// standbyHas waits, within handoverCatchUp, until a standby has flushed lsn; it returns
// the primary's timeline.
func (a *Agent) standbyHas(ctx context.Context, lsn pglogrepl.LSN) (int64, bool) {
	cctx, cancel := context.WithTimeout(ctx, handoverCatchUp)
	defer cancel()
	for {
		flushed, tl, err := a.db.StandbyFlushed(cctx)
		if err == nil && flushed >= lsn {
			return tl, true
		}
		select {
		case <-cctx.Done():
			a.log.Info("No standby has every acknowledged commit yet: stopping postgres fast, which sends them its WAL",
				"acknowledged", lsn.String(), "standbysFlushed", flushed.String(), "error", errOrNil(err))
			return 0, false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// handoverCatchUp bounds the wait for a standby to flush every acknowledged commit
// before an immediate stop.
const handoverCatchUp = 3 * time.Second

// shutdownPoll is how often a handover reads the control file while postgres stops.
const shutdownPoll = 50 * time.Millisecond

// release gives the Lease up after a handover, with its final position, retrying while
// ctx lasts.
func (a *Agent) release(ctx context.Context, h agentapi.Handover, reason string) error {
	change := primarylease.Release(a.cfg.PodName, h.Term, primarylease.Handover{Reason: reason, Clean: h.Clean, FinalLSN: h.FinalLSN, Timeline: h.Timeline})
	for {
		err := a.lease.Apply(ctx, change)
		if err == nil || errors.Is(err, primarylease.ErrNotHolder) {
			return err
		}
		a.log.Info("Cannot release the primary Lease yet; retrying", "error", err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("releasing the primary Lease: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// demote is a switchover's handover: on success the Lease names no holder and records
// the final position; if the Lease cannot be released the primary resumes.
//
// A clean release is answered at once (answered(nil)), before postgres has exited: it
// wrote its shutdown checkpoint and cannot write any more, and the Lease records its
// final position, so the operator may move the Lease to the standby that has it, as
// after a primary's SIGTERM. What is left of postgres's stop (its walsenders ending,
// its archiver's last round) took up to 3.5 s on the loaded node (make chaos,
// operator-rollout) and held every switchover's writes that long. The Run loop still
// waits for it before anything else.
func (a *Agent) demote(ctx context.Context, answered func(error)) error {
	a.checkpointBeforeStop(ctx)
	a.pausePoolers(ctx, a.lease.View().Term)
	h, stopped := a.handover(ctx, false)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := a.release(rctx, h, "switchover")
	if err == nil && h.Clean {
		answered(nil)
	}
	<-stopped
	a.handingOver.Store(false)
	if err != nil {
		a.mu.Lock()
		a.fenced = false
		a.mu.Unlock()
		a.fencedNow.Store(false)
		a.wake()
		return fmt.Errorf("demoted, but %w; resuming as primary", err)
	}
	return nil
}

// checkpointBeforeStop runs a checkpoint while the primary still serves, so that the
// shutdown checkpoint of the handover that follows has little to write: writes are
// unavailable only for the fast stop itself. It is bounded and best effort.
func (a *Agent) checkpointBeforeStop(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, preStopCheckpointTimeout)
	defer cancel()
	start := time.Now()
	if err := a.db.Checkpoint(cctx); err != nil {
		a.log.Info("The checkpoint before the handover did not finish; handing over anyway", "error", err.Error())
		return
	}
	a.log.Info("Checkpointed before the handover", "took", time.Since(start).Round(time.Millisecond).String())
}

// preStopCheckpointTimeout bounds checkpointBeforeStop.
const preStopCheckpointTimeout = 10 * time.Second

// releaseTimeout bounds the release of the Lease after a handover.
const releaseTimeout = 5 * time.Second

// shutdown runs when the agent is told to stop (SIGTERM): a primary that holds the
// Lease hands over and releases it; anything else stops fast.
func (a *Agent) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	view := a.lease.View()
	a.mu.Lock()
	alone := len(a.peers()) == 0
	a.mu.Unlock()
	if view.Holder != a.cfg.PodName || alone || view.KeepsDown(a.cfg.PodName) != "" {
		// A standby, a primary with nobody to hand over to, or one the Lease keeps
		// down (hibernating, fenced): it keeps the Lease and starts again as the
		// primary.
		a.handingOver.Store(true)
		a.stopCleanly(ctx)
		return
	}
	a.checkpointBeforeStop(ctx)
	a.pausePoolers(ctx, view.Term)
	h, stopped := a.handover(ctx, true)
	defer func() { <-stopped }()
	// The stop may have used the whole shutdown timeout; the release gets its own few
	// seconds (the kubelet's grace period is longer than the stop's bound).
	rctx, rcancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer rcancel()
	if err := a.release(rctx, h, "the primary was asked to stop (SIGTERM)"); err != nil {
		a.log.Error(err, "Could not release the primary Lease; the operator fails over when it expires")
		return
	}
	a.log.Info("Released the primary Lease", "term", h.Term, "finalLSN", h.FinalLSN)
}
