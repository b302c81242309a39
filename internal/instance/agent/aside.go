package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// makeRoom frees space for a clone of about need bytes: superseded set-aside
// directories go, oldest first, until the clone fits with the volume's reserve.
func (a *Agent) makeRoom(need int64) {
	list, err := a.pg.Asides()
	if err != nil {
		a.log.Info("Could not list the set-aside data directories", "error", err.Error())
		return
	}
	_, total, err := postgres.VolumeSpace(filepath.Dir(a.cfg.PGData))
	if err != nil {
		a.log.Info("Could not read the volume's free space", "error", err.Error())
		return
	}
	removed, err := a.pg.Reclaim(list, postgres.KeepFree(total)+uint64(max(need, 0)))
	a.logRemoved(removed, "a new clone needs the room", err)
}

func (a *Agent) logRemoved(removed []string, why string, err error) {
	for _, name := range removed {
		a.log.Info("Removed a set-aside data directory a newer clone superseded: "+why, "directory", name)
	}
	if err != nil {
		a.log.Error(err, "Could not remove a superseded set-aside data directory")
	}
}

// volumeEvery is how often the set-aside directories and the volume's free space are
// looked at when nothing else asks.
const volumeEvery = 30 * time.Second

// keepVolume looks after the set-aside data directories, at most every volumeEvery
// unless one is pending: once verified says the data directory in use is sound, the
// pending ones are superseded; superseded ones go while the volume's free space is
// below its reserve. What remains is reported in the status.
func (a *Agent) keepVolume(ctx context.Context, verified func(context.Context) bool) {
	a.mu.Lock()
	pending, last := a.asidePending, a.volumeDone
	a.mu.Unlock()
	if pending == 0 && time.Since(last) < volumeEvery {
		return
	}
	if pending > 0 && time.Since(last) < time.Second {
		return
	}
	list, err := a.pg.Asides()
	if err != nil {
		a.log.Info("Could not list the set-aside data directories", "error", err.Error())
		return
	}
	// The data an upgrade left is the way back until the new major is backed up.
	supersedable := slices.DeleteFunc(slices.Clone(list), func(x postgres.Aside) bool { return x.OlderMajor && !a.newMajorBackedUp(ctx, x.At) })
	if slices.ContainsFunc(supersedable, func(x postgres.Aside) bool { return !x.Superseded }) && verified(ctx) {
		marked, err := a.pg.Supersede(supersedable, time.Now())
		for _, name := range marked {
			a.log.Info("The data directory cloned after this set-aside one is verified: it stays until the volume needs the space", "directory", name)
		}
		if err != nil {
			a.log.Error(err, "Could not mark a set-aside data directory superseded")
		}
	}
	if _, total, err := postgres.VolumeSpace(filepath.Dir(a.cfg.PGData)); err == nil {
		removed, err := a.pg.Reclaim(list, postgres.KeepFree(total))
		a.logRemoved(removed, fmt.Sprintf("the volume had less than %d%% free", postgres.KeepFreePercent), err)
		if len(removed) > 0 {
			list = slices.DeleteFunc(list, func(x postgres.Aside) bool { return slices.Contains(removed, filepath.Base(x.Path)) })
		}
	}
	a.reportAsides(list)
}

// reportAsides puts list in the status, and counts the ones waiting for a verified
// clone as pending.
func (a *Agent) reportAsides(list []postgres.Aside) {
	report := make([]agentapi.SetAside, 0, len(list))
	pending := 0
	for _, x := range list {
		reason := x.Reason
		if len(reason) > 300 {
			reason = reason[:300] + "..."
		}
		report = append(report, agentapi.SetAside{Name: filepath.Base(x.Path), Reason: reason, At: x.At,
			Superseded: x.Superseded, Bytes: postgres.DirSize(x.Path)})
		if !x.Superseded && !x.OlderMajor {
			pending++ // an older major's data waits for a backup, not for a clone
		}
	}
	a.mu.Lock()
	a.setAsides, a.asidePending, a.volumeDone = report, pending, time.Now()
	a.mu.Unlock()
}

// noteSetAside reports the set-aside directories at once rather than at the next
// keepVolume: a clone takes minutes, and the copy it replaced is the way back
// meanwhile. Failing that, it makes the next keepVolume look within a second.
func (a *Agent) noteSetAside() {
	list, err := a.pg.Asides()
	if err != nil {
		a.log.Info("Could not list the set-aside data directories", "error", err.Error())
		a.mu.Lock()
		a.asidePending++
		a.mu.Unlock()
		return
	}
	a.reportAsides(list)
}

// errRefused marks an error that is a refusal to replace or mix data: reported as
// such (agentapi.Status.Refusal), it needs a person.
type errRefused struct{ msg string }

func (e *errRefused) Error() string { return e.msg }

func refused(format string, args ...any) error { return &errRefused{msg: fmt.Sprintf(format, args...)} }

// refusal is err's refusal message, "" when it is not one.
func refusal(err error) string {
	var r *errRefused
	if errors.As(err, &r) {
		return r.msg
	}
	return ""
}
