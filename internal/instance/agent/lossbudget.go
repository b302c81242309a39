package agent

import (
	"context"
	"math"

	"github.com/jackc/pglogrepl"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// The loss budget of an asynchronous cluster (spec.postgresql.lossBudget, I7 in
// docs/failover.md). A failover promotes the most advanced standby and loses what it had
// not flushed; with a budget of B bytes the commit gate confirms WAL at most B beyond the
// most advanced standby's flush position, so no commit is acknowledged while no standby
// holds all but B bytes of the WAL before it. Whatever fails next (a crash, a node lost,
// the primary cut off from its peers but not from its clients), the acknowledged WAL no
// standby has is at most B. The position is read every lockoutEvery (guardPrimary);
// commits beyond the budget wait for a standby to catch up, or for one to come back.

// unlimited is the gate's limit without a budget.
const unlimited = pglogrepl.LSN(math.MaxUint64)

// gateLimit is how far the commit gate may confirm WAL now.
func (a *Agent) gateLimit() pglogrepl.LSN { return pglogrepl.LSN(a.lossLimit.Load()) }

// keepLossLimit sets the gate's limit from the flush position of the most advanced
// standby that streams (StandbysHave): while none streams, commits past the budget wait.
// Without a budget the limit is unlimited; when the position cannot be read, the last
// limit stays (read again lockoutEvery later). A primary's gate starts with a limit of
// 0 when there is a budget (startGate): nothing is confirmed before the first read.
func (a *Agent) keepLossLimit(ctx context.Context, cluster clusterconfig.Config) {
	budget := cluster.LossBudget
	if budget == nil {
		a.lossLimit.Store(uint64(unlimited))
		return
	}
	flushed, err := a.db.StandbysHave(ctx, pgconf.OtherInstances(cluster, a.cfg.PodName))
	if err != nil {
		return
	}
	a.lossLimit.Store(uint64(lossLimit(flushed, *budget)))
}

// lossLimit is the furthest the gate may confirm with the most advanced standby at
// flushed (0 when no standby has anything) and a budget of budget bytes.
func lossLimit(flushed pglogrepl.LSN, budget int64) pglogrepl.LSN {
	return flushed + pglogrepl.LSN(max(budget, 0))
}
