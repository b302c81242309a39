package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// Timeline IDs (docs/failover.md, "Timeline IDs"). PostgreSQL names a promoted
// server's new timeline one above the newest it can find a history file for, in its
// own pg_wal (and its archive, which a cluster need not have). Two promotions that
// never saw each other's history files therefore choose the same ID: a standby killed
// while it was promoted and started again as primary chose 21, and the standby
// promoted in its place, which had never seen that 00000015.history, chose 21 too
// (make chaos, back-to-back). pg_rewind then takes the two for one history ("same
// timeline, no rewind required"), and the former primary follows WAL that is not a
// continuation of its own.
//
// So the primary Lease reserves the ID of each term's promotion, above every one in
// use, and the promoting agent makes PostgreSQL choose it: it places a placeholder
// history file for every missing ID below the reserved one, since PostgreSQL only
// checks that a history file exists.
//
// A placeholder holds only a comment. PostgreSQL reads it as a timeline that is no
// child of the one the standby replays, so a running standby's search for a newer
// timeline passes over it ("new timeline is not a child", a LOG line) and the
// promotion branches from the timeline really replayed. A start whose newest history
// file were a placeholder would refuse to recover ("requested timeline is not a child
// of this server's history"): placeholders with no real history file above them are
// removed before every start (Postgres.removeUnusedPlaceholders).

// placeholderMark begins every placeholder history file.
const placeholderMark = "# pgpilot: timeline reserved"

var historyName = regexp.MustCompile(`^([0-9A-F]{8})\.history$`)

// histories are the history files of pg_wal by timeline ID, each true when it is a
// placeholder.
type histories map[int64]bool

// historyFiles lists pg_wal's history files.
func (p *Postgres) historyFiles() (histories, error) {
	dir := filepath.Join(p.PGData, "pg_wal")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	h := histories{}
	for _, e := range entries {
		m := historyName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil {
			continue
		}
		h[id] = isPlaceholder(filepath.Join(dir, e.Name()))
	}
	return h, nil
}

// newestReal is the highest timeline ID of a real history file (1 when there is none).
func (h histories) newestReal() int64 {
	newest := int64(1)
	for id, placeholder := range h {
		if !placeholder {
			newest = max(newest, id)
		}
	}
	return newest
}

// isPlaceholder reports whether the history file at path is a placeholder.
func isPlaceholder(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, len(placeholderMark))
	n, _ := f.Read(head)
	return bytes.Equal(head[:n], []byte(placeholderMark))
}

// IsPlaceholderHistory reports whether the WAL file at path is a placeholder history
// file: the archiver never stores one.
func IsPlaceholderHistory(path string) bool {
	return historyName.MatchString(filepath.Base(path)) && isPlaceholder(path)
}

func historyPath(pgdata string, id int64) string {
	return filepath.Join(pgdata, "pg_wal", fmt.Sprintf("%08X.history", id))
}

// reserveTimelines places a placeholder history file for every ID after from and
// before next that has none in h (pg_wal's history files), so that a promotion
// recovering on timeline from or later chooses next.
func (p *Postgres) reserveTimelines(h histories, from, next int64) error {
	for id := max(from+1, 2); id < next; id++ {
		if _, ok := h[id]; ok {
			continue
		}
		body := fmt.Sprintf("%s for another promotion of this cluster; this instance never ran on timeline %d\n", placeholderMark, id)
		if err := writeFileDurable(historyPath(p.PGData, id), []byte(body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// removeUnusedPlaceholders removes the placeholders above the newest real history
// file: no promotion used them, and a start would find one as the newest timeline.
func (p *Postgres) removeUnusedPlaceholders() error {
	h, err := p.historyFiles()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	newest := h.newestReal()
	for id, placeholder := range h {
		if placeholder && id > newest {
			if err := os.Remove(historyPath(p.PGData, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

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
	h, err := a.pg.historyFiles()
	if err != nil {
		return 0, err
	}
	inUse := max(h.newestReal(), checkpointTLI)
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
	if err := a.pg.reserveTimelines(h, checkpointTLI, rec.Timeline); err != nil {
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
	own, err := backup.SystemIdentifier(a.cfg.PGData)
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
	history, err := os.ReadFile(historyPath(a.pg.PGData, cd.Timeline))
	if err != nil {
		return "", fmt.Errorf("reading this instance's history file of timeline %d: %w", cd.Timeline, err)
	}
	if bytes.Equal(history, peer.history) {
		return "", nil
	}
	return fmt.Sprintf("both are on timeline %d, but their histories of it differ (this instance: %q; %s: %q)",
		cd.Timeline, lastLines(history, 1), primary, lastLines(peer.history, 1)), nil
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
