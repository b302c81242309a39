package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// A data directory the agent replaces by a new clone (a rewind failed, the primary no
// longer has the WAL a standby needs, or postgres refuses a standby's clone that never
// ran: clone.go) is never deleted on the spot. It is renamed aside on the same volume,
// <pgdata>.set-aside-<UTC time>, with the reason in a file of its own, and stays there:
//   - pending until the data directory cloned after it is verified (it ran and streamed
//     as a standby, or serves as the primary): until then it may be the only good copy;
//   - superseded after that, and removed only when the volume needs the space: when its
//     free space falls below keepFreePercent, or a clone needs the room. The oldest goes
//     first.
// Every set-aside directory is reported in the agent's status, and the operator turns
// that into events and the PostgresCluster's status (docs/data-safety.md).

const (
	asideInfix = ".set-aside-"
	// asideReason holds, in a set-aside directory, why and when it was set aside.
	asideReason = "pgpilot.set-aside"
	// supersededMark is created in a set-aside directory once a newer clone is verified.
	supersededMark = "pgpilot.superseded"
	asideStamp     = "20060102T150405Z"
	// keepFreePercent of the volume is kept free by removing superseded directories.
	keepFreePercent = 20
	// volumeEvery is how often the set-aside directories and the volume's free space
	// are looked at when nothing else asks.
	volumeEvery = 30 * time.Second
)

// aside is one set-aside data directory.
type aside struct {
	path       string
	at         time.Time
	reason     string
	superseded bool
}

// setAside renames the data directory aside, with why in it. It returns the new path.
func (p *Postgres) setAside(why string, now time.Time) (string, error) {
	note := fmt.Sprintf("%s\n%s\n", now.UTC().Format(time.RFC3339), why)
	if err := writeFileDurable(filepath.Join(p.PGData, asideReason), []byte(note), 0o600); err != nil {
		return "", fmt.Errorf("recording why the data directory is set aside: %w", err)
	}
	path := p.PGData + asideInfix + now.UTC().Format(asideStamp)
	if err := os.Rename(p.PGData, path); err != nil {
		return "", fmt.Errorf("setting the data directory aside: %w", err)
	}
	return path, syncDir(filepath.Dir(p.PGData))
}

// putBack undoes setAside after a clone that failed: nothing replaced the data.
func (p *Postgres) putBack(path string) error {
	if err := os.Rename(path, p.PGData); err != nil {
		return err
	}
	return os.Remove(filepath.Join(p.PGData, asideReason))
}

// asides lists the set-aside directories beside the data directory, oldest first.
func (p *Postgres) asides() ([]aside, error) {
	paths, err := filepath.Glob(p.PGData + asideInfix + "*")
	if err != nil {
		return nil, err
	}
	var out []aside
	for _, path := range paths {
		at, err := time.Parse(asideStamp, strings.TrimPrefix(path, p.PGData+asideInfix))
		if err != nil {
			continue // not one of ours
		}
		a := aside{path: path, at: at}
		if b, err := os.ReadFile(filepath.Join(path, asideReason)); err == nil {
			if _, why, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok {
				a.reason = why
			}
		}
		if _, err := os.Stat(filepath.Join(path, supersededMark)); err == nil {
			a.superseded = true
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y aside) int { return x.at.Compare(y.at) })
	return out, nil
}

// supersede marks every pending set-aside directory superseded: the data directory in
// use now was cloned after each of them (setting one aside is what made room for it)
// and has been verified.
func (p *Postgres) supersede(list []aside, now time.Time) (marked []string, err error) {
	for i := range list {
		if list[i].superseded {
			continue
		}
		note := "superseded at " + now.UTC().Format(time.RFC3339) + " by a verified clone\n"
		if err := writeFileDurable(filepath.Join(list[i].path, supersededMark), []byte(note), 0o600); err != nil {
			return marked, err
		}
		list[i].superseded = true
		marked = append(marked, filepath.Base(list[i].path))
	}
	return marked, nil
}

// reclaim removes superseded set-aside directories, oldest first, while the volume has
// less than want bytes free. It returns the names removed.
func (p *Postgres) reclaim(list []aside, want uint64) (removed []string, err error) {
	for _, a := range list {
		free, _, err := volumeSpace(filepath.Dir(p.PGData))
		if err != nil || free >= want {
			return removed, err
		}
		if !a.superseded {
			continue
		}
		if err := os.RemoveAll(a.path); err != nil {
			return removed, err
		}
		removed = append(removed, filepath.Base(a.path))
	}
	return removed, nil
}

// volumeSpace is the free (for an unprivileged user) and total bytes of dir's file
// system.
func volumeSpace(dir string) (free, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// dirSize is the bytes of the regular files under path.
func dirSize(path string) int64 {
	var n int64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed under us: a smaller size
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// keepFree is the free space the volume keeps: keepFreePercent of it.
func keepFree(total uint64) uint64 { return total / 100 * keepFreePercent }

// makeRoom frees space for a clone of about need bytes: superseded set-aside
// directories go, oldest first, until the clone fits with the volume's reserve.
func (a *Agent) makeRoom(need int64) {
	list, err := a.pg.asides()
	if err != nil {
		a.log.Info("Could not list the set-aside data directories", "error", err.Error())
		return
	}
	_, total, err := volumeSpace(filepath.Dir(a.cfg.PGData))
	if err != nil {
		a.log.Info("Could not read the volume's free space", "error", err.Error())
		return
	}
	removed, err := a.pg.reclaim(list, keepFree(total)+uint64(max(need, 0)))
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
	list, err := a.pg.asides()
	if err != nil {
		a.log.Info("Could not list the set-aside data directories", "error", err.Error())
		return
	}
	if slices.ContainsFunc(list, func(x aside) bool { return !x.superseded }) && verified(ctx) {
		marked, err := a.pg.supersede(list, time.Now())
		for _, name := range marked {
			a.log.Info("The data directory cloned after this set-aside one is verified: it stays until the volume needs the space", "directory", name)
		}
		if err != nil {
			a.log.Error(err, "Could not mark a set-aside data directory superseded")
		}
	}
	if _, total, err := volumeSpace(filepath.Dir(a.cfg.PGData)); err == nil {
		removed, err := a.pg.reclaim(list, keepFree(total))
		a.logRemoved(removed, fmt.Sprintf("the volume had less than %d%% free", keepFreePercent), err)
		if len(removed) > 0 {
			list = slices.DeleteFunc(list, func(x aside) bool { return slices.Contains(removed, filepath.Base(x.path)) })
		}
	}
	report := make([]agentapi.SetAside, 0, len(list))
	pending = 0
	for _, x := range list {
		reason := x.reason
		if len(reason) > 300 {
			reason = reason[:300] + "..."
		}
		report = append(report, agentapi.SetAside{Name: filepath.Base(x.path), Reason: reason, At: x.at,
			Superseded: x.superseded, Bytes: dirSize(x.path)})
		if !x.superseded {
			pending++
		}
	}
	a.mu.Lock()
	a.setAsides, a.asidePending, a.volumeDone = report, pending, time.Now()
	a.mu.Unlock()
}

// noteSetAside makes the next keepVolume look at once.
func (a *Agent) noteSetAside() {
	a.mu.Lock()
	a.asidePending++
	a.mu.Unlock()
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
