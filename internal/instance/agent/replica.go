package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// A replica cluster's switch of roles (docs/replica-cluster.md, "Switching roles"): the
// primary of cluster A, given spec.replica, is demoted: it stops as a switchover's old
// primary does (writes locked out, the commit gate drained, a fast shutdown that sends
// every connected standby its WAL up to the shutdown checkpoint) and starts again as a
// standby of the source, B, without a rewind. Where it stopped is its demotion token;
// B's promotion with that token waits until B has replayed past it. So no commit A
// acknowledged is missing from B, and A writes nothing after B may.

// demotedMarker is the file in a demoted primary's data directory that holds its
// demotion token until it streams from the source: until then, its data may hold
// commits the source lacks, and it is never replaced by a clone of the source.
const demotedMarker = "pgpilot.demoted"

// demoteToFollow stops the running primary cleanly, keeping the Lease, and starts it again as
// a standby of source.
func (a *Agent) demoteToFollow(ctx context.Context, source string) error {
	a.log.Info("Demoting: spec.replica names a source; stopping cleanly to follow it", "source", source)
	a.stopCleanly(ctx)
	a.fencedNow.Store(false)
	a.mu.Lock()
	h := a.lastHandover
	a.role = agentapi.RoleStarting
	a.mu.Unlock()
	if h == nil || !h.Clean || h.FinalLSN == "" {
		// Its data is kept and follows the source all the same; without a token the
		// source's promotion cannot know it has all of it.
		return fmt.Errorf("demoting: postgres did not stop cleanly (%+v): no demotion token; it starts as a standby of %s, and %s's promotion cannot be planned", h, source, source)
	}
	sysid, err := a.pg.SystemIdentifier()
	if err != nil {
		return err
	}
	token := fmt.Sprintf("%s:%d:%s", sysid, h.Timeline, h.FinalLSN)
	if err := pgconf.WriteFileAtomic(filepath.Join(a.cfg.PGData, demotedMarker), []byte(token+"\n"), 0o600); err != nil {
		return err
	}
	a.log.Info("Demoted: stopped cleanly; give the demotion token to the source's promotion (spec.replica.promotionToken)", "token", token)
	return a.runStandby(ctx, source)
}

// demotionToken is the token a demoted primary's data directory holds, "" when none.
func (a *Agent) demotionToken() string {
	b, err := os.ReadFile(filepath.Join(a.cfg.PGData, demotedMarker))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// dropDemotion forgets the demotion once the standby streams from the source: the
// source has all it wrote (a stream starts only from a point in the source's history).
func (a *Agent) dropDemotion() {
	if a.demotionToken() == "" {
		return
	}
	if err := os.Remove(filepath.Join(a.cfg.PGData, demotedMarker)); err == nil {
		a.log.Info("The demoted data streams from the source: it holds nothing the source lacks")
	}
}

// promotionToken is a parsed spec.replica.promotionToken.
type promotionToken struct {
	system   string
	timeline int64
	lsn      pglogrepl.LSN
}

func parsePromotionToken(s string) (promotionToken, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return promotionToken{}, fmt.Errorf("promotionToken %q is not <system identifier>:<timeline>:<LSN>", s)
	}
	tl, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return promotionToken{}, fmt.Errorf("promotionToken %q: timeline: %w", s, err)
	}
	lsn, err := pglogrepl.ParseLSN(parts[2])
	if err != nil {
		return promotionToken{}, fmt.Errorf("promotionToken %q: %w", s, err)
	}
	return promotionToken{system: parts[0], timeline: tl, lsn: lsn}, nil
}

// errPromotionWaits is a promotion held until the demoted source's final WAL is here.
var errPromotionWaits = errors.New("the promotion waits for the demoted source's final WAL")

// promotionAllowed returns nil when a replica cluster's promotion may go ahead: no
// token, or this standby holds the same database and has replayed past the position
// the token names.
func (a *Agent) promotionAllowed(ctx context.Context) error {
	a.mu.Lock()
	r := a.cluster.Replica
	a.mu.Unlock()
	if r == nil || r.PromotionToken == "" {
		return nil
	}
	t, err := parsePromotionToken(r.PromotionToken)
	if err != nil {
		return refused("%v: not promoting; set spec.replica.promotionToken to the source's status.replica.demotionToken, or remove it to promote with what was received", err)
	}
	sysid, err := a.pg.SystemIdentifier()
	if err != nil {
		return err
	}
	if sysid != t.system {
		return refused("spec.replica.promotionToken is database %s's, this is %s: not promoting; remove it to promote with what was received", t.system, sysid)
	}
	replayed, err := a.db.ReplayLSN(ctx)
	if err != nil {
		return err
	}
	if replayed <= t.lsn {
		return fmt.Errorf("%w: replayed %s, the source stopped at %s on timeline %d", errPromotionWaits, replayed, t.lsn, t.timeline)
	}
	return nil
}

// startDemoted starts a primary's data directory as a standby of the source, with no
// rewind: a rewind would discard what the source lacks. If it holds such WAL, the
// stream does not start and the data stays as it is.
func (a *Agent) startDemoted(ctx context.Context, source string) error {
	a.log.Info("Starting a primary's data directory as a standby of the source, without a rewind", "source", source)
	return a.runStandby(ctx, source)
}
