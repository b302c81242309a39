package postgres

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A data directory the agent replaces by a new clone (a rewind failed, the primary no
// longer has the WAL a standby needs, or postgres refuses a standby's clone that never
// ran: the agent's clone.go) is never deleted on the spot. It is renamed aside on the
// same volume, <pgdata>.set-aside-<UTC time>, with the reason in a file of its own, and
// stays there:
//   - pending until the data directory cloned after it is verified (it ran and streamed
//     as a standby, or serves as the primary): until then it may be the only good copy;
//   - superseded after that, and removed only when the volume needs the space: when its
//     free space falls below KeepFreePercent, or a clone needs the room. The oldest goes
//     first.
// Every set-aside directory is reported in the agent's status, and the operator turns
// that into events and the PostgresCluster's status (docs/data-safety.md).

const (
	asideInfix = ".set-aside-"
	// asideReason holds, in a set-aside directory, why and when it was set aside.
	asideReason = "pgpilot.set-aside"
	// supersededMark is created in a set-aside directory once a newer clone is verified.
	supersededMark = "pgpilot.superseded"
	// olderMajorMark is created in a set-aside directory of data a major version
	// upgrade replaced: the way back, superseded only once a base backup of the new
	// major exists (the agent's upgrade.go), not when the new data is verified.
	olderMajorMark = "pgpilot.older-major"
	asideStamp     = "20060102T150405Z"
	// KeepFreePercent of the volume is kept free by removing superseded directories.
	KeepFreePercent = 20
)

// Aside is one set-aside data directory.
type Aside struct {
	Path string
	// At is when it was set aside.
	At time.Time
	// Reason is why.
	Reason string
	// Superseded is true once a data directory cloned after it was verified.
	Superseded bool
	// OlderMajor is the data of the major an upgrade left (MarkOlderMajor).
	OlderMajor bool
}

// MarkOlderMajor marks the set-aside directory at path as the data of the major an
// upgrade left.
func MarkOlderMajor(path string) error {
	return writeFileDurable(filepath.Join(path, olderMajorMark), nil, 0o600)
}

// SetAside renames the data directory aside, with why in it. It returns the new path.
func (p *Postgres) SetAside(why string, now time.Time) (string, error) {
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

// PutBack undoes SetAside after a clone that failed: nothing replaced the data.
func (p *Postgres) PutBack(path string) error {
	if err := os.Rename(path, p.PGData); err != nil {
		return err
	}
	return os.Remove(filepath.Join(p.PGData, asideReason))
}

// Asides lists the set-aside directories beside the data directory, oldest first.
func (p *Postgres) Asides() ([]Aside, error) {
	paths, err := filepath.Glob(p.PGData + asideInfix + "*")
	if err != nil {
		return nil, err
	}
	var out []Aside
	for _, path := range paths {
		at, err := time.Parse(asideStamp, strings.TrimPrefix(path, p.PGData+asideInfix))
		if err != nil {
			continue // not one of ours
		}
		a := Aside{Path: path, At: at}
		if b, err := os.ReadFile(filepath.Join(path, asideReason)); err == nil {
			if _, why, ok := strings.Cut(strings.TrimSpace(string(b)), "\n"); ok {
				a.Reason = why
			}
		}
		if _, err := os.Stat(filepath.Join(path, supersededMark)); err == nil {
			a.Superseded = true
		}
		if _, err := os.Stat(filepath.Join(path, olderMajorMark)); err == nil {
			a.OlderMajor = true
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y Aside) int { return x.At.Compare(y.At) })
	return out, nil
}

// Supersede marks every pending set-aside directory superseded: the data directory in
// use now was cloned after each of them (setting one aside is what made room for it)
// and has been verified.
func (p *Postgres) Supersede(list []Aside, now time.Time) (marked []string, err error) {
	for i := range list {
		if list[i].Superseded {
			continue
		}
		note := "superseded at " + now.UTC().Format(time.RFC3339) + " by a verified clone\n"
		if err := writeFileDurable(filepath.Join(list[i].Path, supersededMark), []byte(note), 0o600); err != nil {
			return marked, err
		}
		list[i].Superseded = true
		marked = append(marked, filepath.Base(list[i].Path))
	}
	return marked, nil
}

// Reclaim removes superseded set-aside directories, oldest first, while the volume has
// less than want bytes free. It returns the names removed.
func (p *Postgres) Reclaim(list []Aside, want uint64) (removed []string, err error) {
	for _, a := range list {
		free, _, err := VolumeSpace(filepath.Dir(p.PGData))
		if err != nil || free >= want {
			return removed, err
		}
		if !a.Superseded {
			continue
		}
		if err := os.RemoveAll(a.Path); err != nil {
			return removed, err
		}
		removed = append(removed, filepath.Base(a.Path))
	}
	return removed, nil
}

// VolumeSpace is the free (for an unprivileged user) and total bytes of dir's file
// system.
func VolumeSpace(dir string) (free, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// DirSize is the bytes of the regular files under path.
func DirSize(path string) int64 {
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

// KeepFree is the free space the volume keeps: KeepFreePercent of it.
func KeepFree(total uint64) uint64 { return total / 100 * KeepFreePercent }
