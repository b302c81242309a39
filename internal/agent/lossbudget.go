package agent

import (
	"context"
	"math"

	"github.com/jackc/pglogrepl"
)

// StandbysHave is the furthest WAL position any standby is known to have flushed: the
// flush positions of those streaming, and the restart positions of slots (the flush
// position their standby last reported), 0 when none.
func (d *DB) StandbysHave(ctx context.Context, slots []string) (pglogrepl.LSN, error) {
	s, err := d.text(ctx, `SELECT coalesce(greatest(
		(SELECT max(flush_lsn) FROM pg_stat_replication WHERE application_name <> $1),
		(SELECT max(restart_lsn) FROM pg_replication_slots WHERE slot_type = 'physical' AND slot_name = ANY($2))), '0/0')::text`,
		GateName, slots)
	if err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

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

// keepLossLimit sets the gate's limit from the most advanced standby's flush position:
// a standby that streams reports it; one that went away (its pod deleted, its node
// lost) still has what it flushed, which its replication slot kept as its restart
// position, until the slot is released (spec.postgresql.idleSlotTimeout).
// Without a budget the limit is unlimited; when the position cannot be read, the last
// limit stays (a standby's flush position only grows, and one that left is seen at the
// next read).
func (a *Agent) keepLossLimit(ctx context.Context) {
	budget := a.cluster.LossBudget
	if budget == nil {
		a.lossLimit.Store(uint64(unlimited))
		return
	}
	var slots []string
	for _, pod := range a.peers() {
		slots = append(slots, SlotName(pod))
	}
	flushed, err := a.db.StandbysHave(ctx, slots)
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
