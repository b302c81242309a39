package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// A primary that may not acknowledge commits locks its clients out (I1 in
// docs/failover.md). The commit gate alone withholds only the commits that wait for it:
// a session, role or database with synchronous_commit local or off, and a client that
// cancels a commit waiting for the gate, get their commits acknowledged without it. So
// from the moment allowed() says no, the agent
//
//  1. renders pg_hba.conf with no line for clients (only its own local sessions and
//     the standbys' replication stay) and has postgres reload it, so no new client
//     session can start;
//  2. terminates every client backend but its own. A backend terminated while it waits
//     for the gate closes its connection without acknowledging the commit (a cancel
//     would acknowledge it: PostgreSQL's rule for synchronous replication).
//
// Step 2 runs again every lockoutEvery while the lockout lasts, for a session that
// began its authentication before the reload. When allowed() says yes again (the Lease
// confirmed after an API server outage), pg_hba.conf is rendered as before and clients
// connect again: postgres never restarted.
//
// What still can be acknowledged past T is bounded: a session that set
// synchronous_commit local or off itself commits without the gate until it is
// terminated, at most lockoutEvery after the confirmation expired, well before the
// operator's T + margin; docs/failover.md says what that means for each mode.

// lockoutEvery is how often the guard looks at the confirmation, and sweeps client
// backends while they are locked out.
const lockoutEvery = 50 * time.Millisecond

// guardPrimary locks a running primary's clients out while it may not acknowledge
// commits, and lets them in again when it may, until ctx ends. It does nothing else:
// what it does must not wait behind anything slower (keepPrimary does the rest).
// Whichever writes pg_hba.conf last, this loop or a (re)start's WriteConfig, the next
// tick makes it agree with allowed().
func (a *Agent) guardPrimary(ctx context.Context) {
	every(ctx, lockoutEvery, func() {
		a.mu.Lock()
		running, role := a.proc != nil, a.role
		a.mu.Unlock()
		switch {
		case !running:
			// A stopped postgres gets its pg_hba.conf from its next start (confInput).
		case (role == agentapi.RolePrimary || a.promoting.Load()) && !a.allowed():
			a.lockOut(ctx, "the primary Lease is not confirmed")
		case role == agentapi.RolePrimary || role == agentapi.RoleReplica:
			a.letIn(ctx)
		}
	})
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// keepPrimary keeps, on a running primary, synchronous_commit pinned (durability.go, and package pgsql) and
// the loss budget's limit current (lossbudget.go), every lockoutEvery until ctx ends.
// Each pass has a deadline, so a statement that waits (a lock held by a client's open
// transaction) delays the next pass, never the lockout.
func (a *Agent) keepPrimary(ctx context.Context) {
	lastErr := "" // logged once, not every tick
	every(ctx, lockoutEvery, func() {
		a.mu.Lock()
		primary := a.proc != nil && a.role == agentapi.RolePrimary
		cluster := a.cluster
		a.mu.Unlock()
		if !primary {
			return
		}
		pass, cancel := context.WithTimeout(ctx, keepPrimaryTimeout)
		a.keepLossLimit(pass, cluster)
		err := a.keepDurability(pass, cluster)
		cancel()
		if msg := errOrNil(err); msg != lastErr {
			if err != nil {
				a.log.Error(err, "Keeping synchronous_commit waiting for the commit gate")
			}
			lastErr = msg
		}
	})
}

// keepPrimaryTimeout bounds one pass of keepPrimary.
const keepPrimaryTimeout = time.Second

// lockOut makes sure no client can commit on this instance: pg_hba.conf has no line for
// them (reloaded when the lockout begins) and every client backend is terminated, again
// at every tick while the lockout lasts (a session that began its authentication before
// the reload).
func (a *Agent) lockOut(ctx context.Context, why string) {
	start := time.Now()
	began, err := a.writeHBA(ctx, true)
	if err != nil {
		a.log.Error(err, "Locking clients out: pg_hba.conf")
	}
	n, err := a.db.TerminateClients(ctx, nil)
	if err != nil && began {
		a.log.Error(err, "Locking clients out: terminating client sessions")
	}
	switch {
	case began:
		a.log.Info("Locked clients out: no client may commit while this instance may not acknowledge commits",
			"reason", why, "terminated", n, "took", time.Since(start).Round(time.Millisecond).String())
	case n > 0:
		a.log.Info("Terminated client sessions that began while clients were being locked out", "terminated", n)
	}
}

// letIn ends a lockout, when there is one: the instance may acknowledge commits (a
// primary whose Lease is confirmed), or has none to acknowledge (a replica). Clients
// count as let in (ClientsLetIn, and so /readyz) once the postmaster loaded the file,
// which confirmHBA finds out beside this loop: it takes new sessions, which on a busy
// node take long, and the lockout must not wait behind them.
func (a *Agent) letIn(ctx context.Context) {
	changed, err := a.writeHBA(ctx, false)
	if err != nil {
		a.log.Error(err, "Letting clients in again: pg_hba.conf")
		return
	}
	if changed {
		a.log.Info("Clients may connect again: the primary Lease is confirmed")
	}
	gen, pending := a.pg.HBALetInPending()
	if !pending || !a.confirmingHBA.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer a.confirmingHBA.Store(false)
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, confirmHBATimeout)
		defer cancel()
		if err := a.db.ReloadInForce(cctx); err != nil {
			a.log.Info("Could not confirm that postgres loaded pg_hba.conf; trying again", "error", err.Error())
			return
		}
		a.pg.HBALoaded(gen)
		a.log.Info("Clients are let in: postgres loaded pg_hba.conf", "took", time.Since(start).Round(time.Millisecond).String())
	}()
}

// confirmHBATimeout bounds one confirmation that postgres loaded pg_hba.conf.
const confirmHBATimeout = 10 * time.Second

// writeHBA renders pg_hba.conf with clients locked out or not, when it says otherwise
// now, and has postgres reload it. It reports whether it changed the file; a failed
// reload leaves the file to be written and reloaded again at the next call.
func (a *Agent) writeHBA(ctx context.Context, lockedOut bool) (bool, error) {
	a.mu.Lock()
	in := pgconf.ConfInput{Cluster: a.cluster, ReplicationUser: a.creds.Replication.Username, LockedOut: lockedOut}
	a.mu.Unlock()
	changed, err := a.pg.WriteHBA(in)
	if err != nil || !changed {
		return changed, err
	}
	if err := a.db.Reload(ctx); err != nil {
		a.pg.ForgetHBA()
		return true, fmt.Errorf("reloading postgres: %w", err)
	}
	return true, nil
}
