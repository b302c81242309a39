package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// prepareTimeline makes the promotion of this instance in view's term choose the
// timeline the Lease reserved for it, reserving a higher one first when this
// instance's own history files reach the reservation (a promotion of its own that was
// cut short, or a Lease written before reservations existed). It returns the ID the
// promotion will choose. It fails, and the promotion with it, when the Lease moved on.
func (a *Agent) prepareTimeline(ctx context.Context, view LeaseView) (int64, error) {
	checkpointTLI, err := a.db.CheckpointTimeline(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the checkpoint's timeline: %w", err)
	}
	h, err := a.pg.HistoryFiles()
	if err != nil {
		return 0, err
	}
	inUse := max(h.NewestReal(), checkpointTLI)
	rec := a.lease.Record()
	if rec.Holder != a.cfg.PodName || rec.Term != view.Term {
		return 0, primarylease.ErrNotHolder
	}
	if rec.Timeline <= inUse {
		if err := a.lease.Apply(ctx, primarylease.ReserveTimeline(a.cfg.PodName, view.Term, inUse)); err != nil {
			return 0, fmt.Errorf("reserving a timeline above %d: %w", inUse, err)
		}
		a.log.Info("Reserved a timeline above this instance's own", "timeline", a.lease.Record().Timeline, "leaseHad", rec.Timeline)
		rec = a.lease.Record()
	}
	if err := a.pg.ReserveTimelines(h, checkpointTLI, rec.Timeline); err != nil {
		return 0, fmt.Errorf("placing the history files below timeline %d: %w", rec.Timeline, err)
	}
	return rec.Timeline, nil
}

// checkRewindSource checks the postgres at host before this data directory is rewound
// onto it. It fails when host holds another database (another system identifier):
// pg_rewind would fail and the clone that follows a failed rewind would replace this
// instance's data with it, the fate of a cluster whose Lease was recreated naming an
// instance that had just run initdb. It returns a reason to clone again instead of
// rewinding when both are on the same timeline ID but their history files of it differ:
// two promotions chose the ID (a Lease written before reservations existed, say), and
// pg_rewind, which compares only the IDs, would answer "no rewind required".
func (a *Agent) checkRewindSource(ctx context.Context, host pgconf.Upstream, primary string) (reclone string, err error) {
	cd, err := a.pg.ControlData(ctx)
	if err != nil {
		return "", err
	}
	own, err := postgres.SystemIdentifier(a.cfg.PGData)
	if err != nil {
		return "", err
	}
	peer, err := peerSystem(ctx, host, cd.Timeline)
	if err != nil {
		return "", fmt.Errorf("asking %s for its system identifier and timeline: %w", primary, err)
	}
	if err := sameSystem(primary, peer.systemID, own); err != nil {
		return "", err
	}
	if cd.Timeline <= 1 || peer.timeline != cd.Timeline {
		return "", nil
	}
	history, err := os.ReadFile(postgres.HistoryPath(a.pg.PGData, cd.Timeline))
	if err != nil {
		return "", fmt.Errorf("reading this instance's history file of timeline %d: %w", cd.Timeline, err)
	}
	if bytes.Equal(history, peer.history) {
		return "", nil
	}
	return fmt.Sprintf("both are on timeline %d, but their Histories of it differ (this instance: %q; %s: %q)",
		cd.Timeline, postgres.LastLines(history, 1), primary, postgres.LastLines(peer.history, 1)), nil
}

// sameSystem refuses a primary with another database (system identifier) than this
// instance's: rewinding onto it, cloning from it or following it would replace or mix
// this instance's data with another database's.
func sameSystem(primary, peerID, own string) error {
	if peerID == own {
		return nil
	}
	return refused("refusing to rewind onto %s, clone from it or follow it: it holds another database (system identifier %s; this instance's is %s), "+
		"and any of them would replace this instance's data, which is kept. If this instance holds the cluster's data, the primary Lease must name an instance of it "+
		"(see docs/data-safety.md); to clone this instance from %s anyway, delete its PersistentVolumeClaim", primary, peerID, own, primary)
}

// peer is what a replication connection tells of another postgres.
type peer struct {
	systemID string
	timeline int64
	// history is its history file of its timeline, when that is the one asked about.
	history []byte
	// inRecovery: it is a standby or still recovering (in_hot_standby, which
	// PostgreSQL 14+ reports at every connection's start).
	inRecovery bool
}

// peerSystem asks the postgres at host, over a replication connection, for its system
// identifier and timeline ID and, when that is tli, its history file of it.
func peerSystem(ctx context.Context, host pgconf.Upstream, tli int64) (peer, error) {
	cfg, err := host.PgConfig(map[string]string{"replication": "true", "application_name": "pgpilot-agent"})
	if err != nil {
		return peer{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return peer{}, err
	}
	defer conn.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return peer{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	p := peer{systemID: sys.SystemID, timeline: int64(sys.Timeline), inRecovery: conn.ParameterStatus("in_hot_standby") == "on"}
	if p.timeline != tli || tli <= 1 {
		return p, nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, int32(tli))
	if err != nil {
		return peer{}, fmt.Errorf("TIMELINE_HISTORY %d: %w", tli, err)
	}
	p.history = h.Content
	return p, nil
}
