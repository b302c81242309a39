package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/pgpilot/pgpilot/internal/agentapi"
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

// guardPrimary keeps a running primary's commits behind the gate until ctx ends: it
// locks its clients out while it may not acknowledge commits, keeps synchronous_commit
// pinned (durability.go) and the loss budget's limit current (lossbudget.go).
func (a *Agent) guardPrimary(ctx context.Context) {
	t := time.NewTicker(lockoutEvery)
	defer t.Stop()
	lastErr := "" // logged once, not every tick
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		primary := a.proc != nil && a.role == agentapi.RolePrimary
		a.mu.Unlock()
		if primary {
			a.keepLossLimit(ctx)
			err := a.keepDurability(ctx)
			if msg := errOrNil(err); msg != lastErr {
				if err != nil {
					a.log.Error(err, "Keeping synchronous_commit waiting for the commit gate")
				}
				lastErr = msg
			}
		}
		switch {
		case primary && !a.allowed():
			a.lockOut(ctx, "the primary Lease is not confirmed")
		case primary && a.lockedOut.Load():
			a.letIn(ctx)
		case !primary:
			// A stopped postgres writes its pg_hba.conf again at the next start.
			a.lockedOut.Store(false)
		}
	}
}

// lockOut makes sure no client can commit on this instance: pg_hba.conf has no line for
// them (reloaded once, when the lockout begins) and every client backend is terminated.
func (a *Agent) lockOut(ctx context.Context, why string) {
	if !a.lockedOut.Swap(true) {
		start := time.Now()
		if err := a.writeHBA(ctx); err != nil {
			a.log.Error(err, "Locking clients out: pg_hba.conf")
		}
		n, err := a.db.TerminateClients(ctx, nil)
		if err != nil {
			a.log.Error(err, "Locking clients out: terminating client sessions")
		}
		a.log.Info("Locked clients out: no client may commit while this instance may not acknowledge commits",
			"reason", why, "terminated", n, "took", time.Since(start).Round(time.Millisecond).String())
		return
	}
	if n, err := a.db.TerminateClients(ctx, nil); err == nil && n > 0 {
		a.log.Info("Terminated client sessions that began while clients were being locked out", "terminated", n)
	}
}

// letIn ends a lockout: the primary may acknowledge commits again.
func (a *Agent) letIn(ctx context.Context) {
	a.lockedOut.Store(false)
	if err := a.writeHBA(ctx); err != nil {
		a.lockedOut.Store(true) // tried again at the next tick
		a.log.Error(err, "Letting clients in again: pg_hba.conf")
		return
	}
	a.log.Info("Clients may connect again: the primary Lease is confirmed")
}

// writeHBA renders pg_hba.conf for the current lockout state and has postgres reload it.
func (a *Agent) writeHBA(ctx context.Context) error {
	in := ConfInput{Cluster: a.cluster, ReplicationUser: a.creds.Replication.Username, LockedOut: a.lockedOut.Load()}
	if err := writeFileAtomic(filepath.Join(a.cfg.PGData, "pg_hba.conf"), []byte(in.HBA()), 0o600); err != nil {
		return err
	}
	return a.db.Reload(ctx)
}

// LockedOutHBAConf renders pg_hba.conf for a primary that locked its clients out: the
// agent's own local sessions (the superuser and the custom queries' role by peer, the
// commit gate) and the standbys' replication connections stay; every other connection is
// refused, with that reason in the client's error.
func LockedOutHBAConf(replicationUser string) string {
	return fmt.Sprintf(`# Written by the pgpilot agent: this primary may not acknowledge commits now (its
# Lease is not confirmed), so clients are locked out; edits are lost.
# TYPE     DATABASE     USER      ADDRESS  METHOD
local      all          postgres           peer
local      all          %[2]s    peer map=pgpilot
local      replication  postgres           peer
hostssl    replication  %[1]s  all      cert
hostssl    postgres     %[1]s  all      cert
local      all          all                reject
host       all          all       all      reject
`, replicationUser, MonitorUser)
}
