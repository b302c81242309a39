package failover

import (
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/opmetrics"
)

// recordMove counts a move of the primary Lease in the operator's metrics: a failover
// with its duration from the first observation of the failure (record's), a switchover
// with the time since the old primary released the Lease (sinceVacant). Giving the
// Lease back to the old primary moves nothing.
func recordMove(c *dbv1.PostgresCluster, action Action, switchover bool, record *dbv1.FailoverRecord, sinceVacant time.Duration) {
	switch {
	case action != Move:
	case switchover:
		opmetrics.RecordMove(c, opmetrics.KindSwitchover, sinceVacant)
	case record != nil:
		took, err := time.ParseDuration(record.Duration)
		if err != nil {
			took = sinceVacant
		}
		opmetrics.RecordMove(c, opmetrics.KindFailover, took)
	}
}
