package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Programs is the directory of the PostgreSQL programs every run uses: BinDir (the
// image's), or those UseBinaries chose for data of an older major.
func (p *Postgres) Programs() string {
	if dir := p.programs.Load(); dir != nil {
		return *dir
	}
	return p.BinDir
}

// UseBinaries makes every later run use the programs in dir; "" goes back to BinDir.
// Only while postgres is stopped: a running postmaster keeps its own.
func (p *Postgres) UseBinaries(dir string) {
	if dir == "" || dir == p.BinDir {
		p.programs.Store(nil)
		return
	}
	p.programs.Store(&dir)
}

// UpgradeRecordFile is the file, in a data directory pg_upgrade made, that records the
// database it was made from: a standby of that database may set its data aside and
// clone the new one.
const UpgradeRecordFile = "pgpilot.upgraded"

// UpgradeRecord is what UpgradeRecordFile holds.
type UpgradeRecord struct {
	// SystemIdentifier and Major are the old data directory's.
	SystemIdentifier string `json:"systemIdentifier"`
	Major            string `json:"major"`
	// Lineage is the old data directory's WAL archive lineage (package backup).
	Lineage string `json:"lineage,omitempty"`
	// At is when pg_upgrade finished.
	At time.Time `json:"at"`
}

// ReadUpgradeRecord reads pgdata's upgrade record; nil with no error when it has none.
func ReadUpgradeRecord(pgdata string) (*UpgradeRecord, error) {
	b, err := os.ReadFile(filepath.Join(pgdata, UpgradeRecordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r UpgradeRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", UpgradeRecordFile, err)
	}
	return &r, nil
}

// UpgradeDir is where a major version upgrade builds the new data directory: beside
// PGData, on the same volume (pg_upgrade --link needs one file system).
func (p *Postgres) UpgradeDir() string { return p.PGData + ".upgrade" }

// Upgrade is one pg_upgrade run from the data directory in use (PGData, the programs
// in use) to UpgradeDir with the programs of NewBinDir.
type Upgrade struct {
	NewBinDir string
	// Superuser is the bootstrap superuser's name, the same in both.
	Superuser string
	// Link makes pg_upgrade hard-link the data files instead of copying them: fast and
	// needing little space, but once the new server has run, the old one can no
	// longer start.
	Link bool
	// Jobs is pg_upgrade's --jobs.
	Jobs int
	// Check runs pg_upgrade --check against the running old server on Port, changing
	// nothing.
	Check bool
	Port  int
}

// PrepareUpgrade makes UpgradeDir a new, empty data directory of the new major, made
// the way InitDB makes a cluster's (pg_upgrade refuses other encodings, locales or
// checksum settings), with local trust: only pg_upgrade connects to it, over a socket
// of its own, until the agent writes its configuration.
func (p *Postgres) PrepareUpgrade(ctx context.Context, u Upgrade) error {
	dir := p.UpgradeDir()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(u.NewBinDir, "initdb"), "-D", dir, "--data-checksums", "--encoding=UTF8", "--locale=C",
		"--auth-local=trust", "--auth-host=reject", "--username="+u.Superuser)
	cmd.Env = append(os.Environ(), p.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb of PostgreSQL's new major: %w: %s", err, LastLines(out, 5))
	}
	return nil
}

// RunUpgrade runs pg_upgrade (u.Check: --check against the running server). Its
// failure says what pg_upgrade said, with the list of problems it wrote to a file.
func (p *Postgres) RunUpgrade(ctx context.Context, u Upgrade) error {
	work := p.PGData + ".upgrade-work"
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	args := []string{
		"--old-datadir=" + p.PGData, "--new-datadir=" + p.UpgradeDir(),
		"--old-bindir=" + p.Programs(), "--new-bindir=" + u.NewBinDir,
		"--username=" + u.Superuser, "--socketdir=" + work, "--jobs=" + fmt.Sprint(max(u.Jobs, 1)),
		"--retain",
	}
	if u.Link {
		args = append(args, "--link")
	}
	if u.Check {
		args = append(args, "--check", fmt.Sprintf("--old-port=%d", u.Port))
	}
	cmd := exec.CommandContext(ctx, filepath.Join(u.NewBinDir, "pg_upgrade"), args...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_upgrade: %w: %s", err, upgradeFailure(out))
	}
	return nil
}

// problemFile is pg_upgrade's "A list of ... is in the file:" followed by its path.
var problemFile = regexp.MustCompile(`(?m)^\s*(/\S+\.txt)\s*$`)

// upgradeFailure is what pg_upgrade's output says went wrong: the lines after its
// "*failure*" mark (or its last lines), with the first lines of the problem list it
// names.
func upgradeFailure(out []byte) string {
	text := string(out)
	if i := strings.Index(text, "*failure*"); i >= 0 {
		text = text[i+len("*failure*"):]
	}
	msg := LastLines([]byte(text), 8)
	if m := problemFile.FindStringSubmatch(text); m != nil {
		if b, err := os.ReadFile(m[1]); err == nil {
			msg += " | " + LastLines(b, 8)
		}
	}
	return msg
}

// StartUpgradeOnTimeline makes the upgraded directory's WAL begin on timeline tli
// (pg_resetwal -l, on the cleanly shut down directory pg_upgrade left) instead of 1.
// The upgraded database archives where the old one did, and PostgreSQL takes every
// history file it finds above its own timeline for a continuation of it: on timeline 1
// it took the old database's 00000002.history for its own, and a point-in-time
// recovery from its first backup refused to start ("requested timeline 2 is not a
// child of this server's history"; make e2e). Above every timeline the old database
// used it follows none of them; with one ID left free between the two (the caller's
// choice), a restore of the old database stops looking at the gap (PostgreSQL looks
// for newer timelines one ID at a time) and follows none of the new one's either.
func (p *Postgres) StartUpgradeOnTimeline(ctx context.Context, newBinDir string, tli int64) error {
	dir := p.UpgradeDir()
	controldata := func() (ControlData, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(newBinDir, "pg_controldata"), "-D", dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return ControlData{}, fmt.Errorf("pg_controldata: %w: %s", err, LastLines(out, 3))
		}
		return ParseControlData(out), nil
	}
	cd, err := controldata()
	if err != nil {
		return err
	}
	if len(cd.RedoWALFile) != 24 {
		return fmt.Errorf("pg_controldata gave no REDO WAL file name for %s (%q)", dir, cd.RedoWALFile)
	}
	start := fmt.Sprintf("%08X%s", tli, cd.RedoWALFile[8:])
	cmd := exec.CommandContext(ctx, filepath.Join(newBinDir, "pg_resetwal"), "-l", start, "-D", dir)
	cmd.Env = append(os.Environ(), p.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_resetwal -l %s: %w: %s", start, err, LastLines(out, 3))
	}
	if cd, err = controldata(); err != nil {
		return err
	}
	if cd.Timeline != tli {
		return fmt.Errorf("the upgraded data directory is on timeline %d after pg_resetwal, not %d", cd.Timeline, tli)
	}
	// A history file for the new timeline, archived like a promotion's: a standby's
	// clone and its WAL receiver ask the primary for it (TIMELINE_HISTORY), and a
	// restore reads it. It says the timeline began where the upgraded WAL begins; no
	// WAL before that point belongs to this database, and nothing ever reads it.
	history := fmt.Sprintf("1\t%s\tupgraded by pg_upgrade: a new database, whose WAL begins here\n", cd.Checkpoint)
	name := fmt.Sprintf("%08X.history", tli)
	if err := writeFileDurable(filepath.Join(dir, "pg_wal", name), []byte(history), 0o600); err != nil {
		return err
	}
	return writeFileDurable(filepath.Join(dir, "pg_wal", "archive_status", name+".ready"), nil, 0o600)
}

// UndoUpgrade makes the old data directory what it was before a pg_upgrade that
// failed or never finished: the new directory goes (nothing ever ran on it), and the
// control file --link renamed comes back. Nothing else of the old directory changed
// (pg_upgrade's documentation, "Reverting to old cluster").
func (p *Postgres) UndoUpgrade() error {
	if err := os.RemoveAll(p.UpgradeDir()); err != nil {
		return err
	}
	control := filepath.Join(p.PGData, "global", "pg_control")
	if _, err := os.Stat(control); errors.Is(err, os.ErrNotExist) {
		if err := os.Rename(control+".old", control); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("restoring the old data directory's control file: %w", err)
		}
	}
	return nil
}

// FinishUpgrade moves the upgraded directory into place: the old one is set aside
// (SetAside, with why), the new one gets the old one's pgpilot files (its bootstrap
// marker) and rec, and becomes PGData. The programs in use go back to the image's.
func (p *Postgres) FinishUpgrade(rec UpgradeRecord, why string, now time.Time) (string, error) {
	dir := p.UpgradeDir()
	old, err := filepath.Glob(filepath.Join(p.PGData, "pgpilot.*"))
	if err != nil {
		return "", err
	}
	for _, f := range old {
		if filepath.Base(f) == UpgradeRecordFile {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		if err := writeFileDurable(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			return "", err
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	if err := writeFileDurable(filepath.Join(dir, UpgradeRecordFile), b, 0o600); err != nil {
		return "", err
	}
	_ = os.RemoveAll(filepath.Join(dir, "pg_upgrade_output.d"))
	aside, err := p.SetAside(why, now)
	if err != nil {
		return "", err
	}
	if err := os.Rename(dir, p.PGData); err != nil {
		return aside, fmt.Errorf("moving the upgraded data directory into place: %w", err)
	}
	p.UseBinaries("")
	return aside, syncDir(filepath.Dir(p.PGData))
}

// ResumeUpgrade finishes or undoes an upgrade the agent did not see through (it was
// killed): an upgraded directory already set in place stays; one whose old directory
// was set aside but not yet replaced is moved in; any other goes (UndoUpgrade).
func (p *Postgres) ResumeUpgrade() (string, error) {
	if _, err := os.Stat(p.UpgradeDir()); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if _, err := os.Stat(p.PGData); errors.Is(err, os.ErrNotExist) {
		if rec, err := ReadUpgradeRecord(p.UpgradeDir()); err != nil || rec == nil {
			return "", fmt.Errorf("the data directory is missing and %s has no upgrade record (%v): leaving both as they are", p.UpgradeDir(), err)
		}
		if err := os.Rename(p.UpgradeDir(), p.PGData); err != nil {
			return "", err
		}
		return "moved the upgraded data directory into place", syncDir(filepath.Dir(p.PGData))
	}
	return "removed an unfinished upgrade's new data directory; the old one is as it was", p.UndoUpgrade()
}
