package pgsql

import (
	"context"

	"github.com/jackc/pglogrepl"
)

// StandbysHave is the furthest WAL position that one of standbys (by application_name)
// streaming now has flushed, 0 when none streams. Only a standby that streams counts:
// a failover can promote only a standby that is there, so one that went away (its pod
// deleted, its node lost) bounds nothing, whatever its slot still says; and a
// connection that is not one of the cluster's standbys (pg_receivewal, pg_basebackup,
// a replication-certificate holder's own client) is no failover candidate at all.
func (d *DB) StandbysHave(ctx context.Context, standbys []string) (pglogrepl.LSN, error) {
	s, err := d.text(ctx, `SELECT coalesce(max(flush_lsn), '0/0')::text FROM pg_stat_replication
		WHERE application_name = ANY($1) AND state = 'streaming'`, standbys)
	if err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}
