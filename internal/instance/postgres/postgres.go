// Package postgres runs one PostgreSQL server for the agent: its data directory (state,
// control data, history files, set-aside copies, WAL segments left unarchived), its
// configuration files, and the postmaster process (start, stop, kill every process it
// left). It holds no policy: what to run, when and why is the agent's (package agent).
package postgres

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
)

// Postgres runs the PostgreSQL programs of one data directory.
type Postgres struct {
	BinDir string
	PGData string
	// Env is added to every program's environment (PGPASSFILE, ...).
	Env []string
	// Lock is the interlock on the volume (Interlock); postgres inherits it, so it is
	// held as long as any of its processes lives.
	Lock *os.File
	// SocketLock is the lock file of postgres's Unix socket (<socket dir>/.s.PGSQL.<port>.lock).
	SocketLock string
	// StaleLockRemoved, when set, is told of every stale lock file removed.
	StaleLockRemoved func(file string)

	// hbaMu serializes the writes of pg_hba.conf; hbaLocked is whether the last one
	// locked clients out (lockout.go), hbaWritten whether there was one. hbaGen counts
	// the writes; hbaLetIn is the write that let clients in after a lockout (or the
	// first), and hbaLoaded the last write the postmaster is known to have loaded
	// (HBALoaded): a file written is not yet in force, but a write that lets clients in
	// while they are let in changes nothing for them.
	hbaMu      sync.Mutex
	hbaLocked  bool
	hbaWritten bool
	hbaGen     uint64
	hbaLetIn   uint64
	hbaLoaded  uint64
	// programs, when set, is the directory of the programs in use instead of BinDir
	// (UseBinaries).
	programs atomic.Pointer[string]
}

// WriteHBA writes pg_hba.conf for in when it says otherwise now, and reports whether it
// did (postgres then needs a reload).
func (p *Postgres) WriteHBA(in pgconf.ConfInput) (bool, error) {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	if p.hbaWritten && p.hbaLocked == in.LockedOut {
		return false, nil
	}
	if err := pgconf.WriteFileAtomic(filepath.Join(p.PGData, "pg_hba.conf"), []byte(in.HBA()), 0o600); err != nil {
		return false, err
	}
	p.wroteHBA(in.LockedOut)
	return true, nil
}

// wroteHBA records a write of pg_hba.conf; hbaMu is held.
func (p *Postgres) wroteHBA(locked bool) {
	p.hbaGen++
	if !locked && (!p.hbaWritten || p.hbaLocked) {
		p.hbaLetIn = p.hbaGen
	}
	p.hbaLocked, p.hbaWritten = locked, true
}

// ForgetHBA makes the next WriteHBA write pg_hba.conf whatever it holds (its reload
// failed).
func (p *Postgres) ForgetHBA() {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	p.hbaWritten = false
}

// HBALocked reports whether pg_hba.conf, as last written, locks clients out.
func (p *Postgres) HBALocked() bool {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	return p.hbaWritten && p.hbaLocked
}

// HBALetInPending reports whether pg_hba.conf, as last written, lets clients in after
// a lockout but the postmaster is not yet known to have loaded it, and which write is
// the last (for HBALoaded).
func (p *Postgres) HBALetInPending() (gen uint64, pending bool) {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	return p.hbaGen, p.hbaWritten && !p.hbaLocked && p.hbaLoaded < p.hbaLetIn
}

// HBAGeneration is the last write of pg_hba.conf (for HBALoaded).
func (p *Postgres) HBAGeneration() uint64 {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	return p.hbaGen
}

// HBALoaded records that the postmaster loaded pg_hba.conf as written by write gen, or
// later.
func (p *Postgres) HBALoaded(gen uint64) {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	p.hbaLoaded = max(p.hbaLoaded, gen)
}

// ClientsLetIn reports whether clients may connect: pg_hba.conf, as last written, lets
// them in, and the postmaster loaded the write that let them in after the last
// lockout. A postgres told to reload loads the file a moment later, and a client sent
// to it before then was refused.
func (p *Postgres) ClientsLetIn() bool {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	return p.hbaWritten && !p.hbaLocked && p.hbaLoaded >= p.hbaLetIn
}

// removeStaleLocks removes postmaster.pid and the socket's lock file when no postgres of
// this data directory can be running: the interlock is held (no other container's) and
// no process of this container works in the data directory. PostgreSQL judges a lock
// file stale only when no process has the PID it names, and a restarted container
// starts a new PID namespace: the old postmaster's PID is soon some other process's
// (a thread of the agent, say), and postgres then refuses to start, for good (make
// chaos, container-kill: the pod never came back as a replica, "lock file
// .s.PGSQL.5432.lock already exists", for five minutes).
//
// Processes of a postmaster just killed (Process.killAll) may take a moment to go: it
// waits up to 2 s for them first, so that a restart right after a crash does not find
// them still holding the shared memory.
func (p *Postgres) removeStaleLocks() {
	for deadline := time.Now().Add(2 * time.Second); len(processesIn(p.PGData)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return
		}
	}
	if p.Lock == nil {
		return
	}
	for _, f := range []string{filepath.Join(p.PGData, "postmaster.pid"), p.SocketLock} {
		if f != "" && os.Remove(f) == nil && p.StaleLockRemoved != nil {
			p.StaleLockRemoved(f)
		}
	}
}

// Interlock takes an exclusive flock on <PGDATA>.lock, waiting while another process
// holds it: a container left running on this volume (a force-deleted pod) must stop
// before another postmaster starts on the same files. PostgreSQL's own interlock cannot
// see across containers, which have separate PID and IPC namespaces. waiting is called
// every 10 s while it waits.
func Interlock(ctx context.Context, pgdata string, waiting func()) (*os.File, error) {
	f, err := os.OpenFile(pgdata+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	last := time.Now()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s.lock: %w", pgdata, err)
		}
		if time.Since(last) > 10*time.Second {
			waiting()
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Bin is the path of the PostgreSQL program name.
func (p *Postgres) Bin(name string) string { return filepath.Join(p.Programs(), name) }

// run runs a PostgreSQL program to completion and returns its combined output.
func (p *Postgres) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, p.Bin(name), args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", name, err, LastLines(out, 5))
	}
	return out, nil
}

// LastLines is the last n lines of b, trimmed, for an error or a log line.
func LastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// DataState is what is in the data directory.
type DataState int

const (
	// DataEmpty — no data directory, or an empty one.
	DataEmpty DataState = iota
	// DataStandby — a data directory set up to run as a standby (standby.signal).
	DataStandby
	// DataPrimary — a data directory that last ran, or will run, as a primary.
	DataPrimary
)

func (s DataState) String() string {
	return [...]string{"empty", "standby", "primary"}[s]
}

// State inspects the data directory. A directory without PG_VERSION is not a data
// directory; it is reported empty only if it really is empty, so nothing ever removes
// files it does not understand.
func (p *Postgres) State() (DataState, error) {
	entries, err := os.ReadDir(p.PGData)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return DataEmpty, nil
	}
	if err != nil {
		return DataEmpty, err
	}
	if _, err := os.Stat(filepath.Join(p.PGData, "PG_VERSION")); err != nil {
		return DataEmpty, fmt.Errorf("%s is not empty but holds no PostgreSQL data directory (no PG_VERSION); refusing to touch it", p.PGData)
	}
	if _, err := os.Stat(filepath.Join(p.PGData, "standby.signal")); err == nil {
		return DataStandby, nil
	}
	return DataPrimary, nil
}

// Recovering reports whether the data directory is in an archive recovery that has not
// ended (recovery.signal, which postgres removes when it promotes).
func (p *Postgres) Recovering() bool {
	_, err := os.Stat(filepath.Join(p.PGData, "recovery.signal"))
	return err == nil
}

// BootstrapMarker is created in the data directory once the first primary created the
// cluster's roles and database; clones and rewinds carry it along.
const BootstrapMarker = "pgpilot.bootstrapped"

// Bootstrapped reports whether the bootstrap marker exists.
func (p *Postgres) Bootstrapped() bool {
	_, err := os.Stat(filepath.Join(p.PGData, BootstrapMarker))
	return err == nil
}

// MarkBootstrapped creates the bootstrap marker.
func (p *Postgres) MarkBootstrapped() error {
	return pgconf.WriteFileAtomic(filepath.Join(p.PGData, BootstrapMarker), []byte("roles and database created by pgpilot\n"), 0o600)
}

// SystemIdentifier reads the database system identifier: the first field of
// global/pg_control, a uint64 in the machine's byte order in every PostgreSQL version.
// It is "" when the data directory holds no control file (empty, or being cloned into).
// Reading the file, not running pg_controldata, keeps it cheap enough for every status.
func (p *Postgres) SystemIdentifier() (string, error) {
	id, err := SystemIdentifier(p.PGData)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return id, err
}

// SystemIdentifier reads the system identifier from pgdata's global/pg_control: its
// first 8 bytes, in the machine's byte order. A missing file is an error.
func SystemIdentifier(pgdata string) (string, error) {
	f, err := os.Open(filepath.Join(pgdata, "global", "pg_control"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b [8]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return "", fmt.Errorf("reading the system identifier from pg_control: %w", err)
	}
	return strconv.FormatUint(binary.NativeEndian.Uint64(b[:]), 10), nil
}

// Major reads PG_VERSION.
func (p *Postgres) Major() (string, error) {
	b, err := os.ReadFile(filepath.Join(p.PGData, "PG_VERSION"))
	return strings.TrimSpace(string(b)), err
}

// InitDB creates a new data directory with checksums, peer authentication for the local
// superuser and SCRAM for everything else.
func (p *Postgres) InitDB(ctx context.Context, superuser pgconf.Credential) error {
	pwfile, err := os.CreateTemp("", "pgpilot-pw-")
	if err != nil {
		return err
	}
	defer os.Remove(pwfile.Name())
	if _, err := pwfile.WriteString(superuser.Password + "\n"); err != nil {
		return err
	}
	if err := pwfile.Close(); err != nil {
		return err
	}
	_, err = p.run(ctx, "initdb", "-D", p.PGData, "--data-checksums", "--encoding=UTF8", "--locale=C",
		"--auth-local=peer", "--auth-host=scram-sha-256", "--username="+superuser.Username, "--pwfile="+pwfile.Name())
	return err
}

// BaseBackup clones the data directory from host into a scratch directory beside PGData
// and moves it into place only once complete, so a failed clone leaves nothing half-made.
func (p *Postgres) BaseBackup(ctx context.Context, host pgconf.Upstream) error {
	scratch := p.PGData + ".clone"
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	_, err := p.run(ctx, "pg_basebackup", "-D", scratch, "-d", host.Conninfo(nil),
		"-w", "-X", "stream", "-c", "fast", "--no-manifest")
	if err != nil {
		_ = os.RemoveAll(scratch)
		return err
	}
	// Only a clone of a primary: one taken from a server in recovery may never start
	// (clone.go). It never ran, so nothing of it is data to keep.
	from := "primary"
	if host.Standby {
		from = "standby"
	}
	if label, err := ReadBackupLabel(scratch); err != nil || label["BACKUP FROM"] != from {
		_ = os.RemoveAll(scratch)
		if err != nil {
			return fmt.Errorf("reading the clone's backup_label: %w", err)
		}
		return fmt.Errorf("discarded the clone: backup_label says BACKUP FROM: %s, not %s (the server left or entered recovery)", label["BACKUP FROM"], from)
	}
	if err := os.Chmod(scratch, 0o700); err != nil {
		return err
	}
	if err := os.RemoveAll(p.PGData); err != nil { // empty, or this clone's previous failed rename
		return err
	}
	return os.Rename(scratch, p.PGData)
}

// ReadBackupLabel reads dir's backup_label: its "KEY: value" lines by key.
func ReadBackupLabel(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "backup_label"))
	if err != nil {
		return nil, err
	}
	label := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			label[k] = strings.TrimSpace(v)
		}
	}
	return label, nil
}

// Rewind makes a former primary's data directory follow the new primary at host.
func (p *Postgres) Rewind(ctx context.Context, host pgconf.Upstream) (string, error) {
	src := host.Conninfo(map[string]string{"dbname": "postgres"})
	// pg_rewind may run postgres in single-user mode, which checks postmaster.pid too.
	p.removeStaleLocks()
	out, err := p.run(ctx, "pg_rewind", "-D", p.PGData, "--source-server="+src)
	if err != nil {
		return "", err
	}
	return LastLines(out, 3), nil
}

// ControlData is what pg_controldata says.
type ControlData struct {
	// State is "Database cluster state", e.g. "shut down", "in production".
	State string
	// Timeline is "Latest checkpoint's TimeLineID".
	Timeline int64
	// Checkpoint is "Latest checkpoint location": after a clean shutdown, the shutdown
	// checkpoint, the last record of the WAL.
	Checkpoint string
	// RedoWALFile is "Latest checkpoint's REDO WAL file", the WAL segment's name.
	RedoWALFile string
}

// ShutDown reports whether the data directory was shut down cleanly as a primary.
func (cd ControlData) ShutDown() bool { return cd.State == "shut down" }

// ControlData runs pg_controldata.
func (p *Postgres) ControlData(ctx context.Context) (ControlData, error) {
	out, err := p.run(ctx, "pg_controldata", "-D", p.PGData)
	if err != nil {
		return ControlData{}, err
	}
	if bytes.Contains(out, []byte("untrustworthy")) {
		// Read while postgres rewrote it (its CRC does not match): read it again.
		return ControlData{}, fmt.Errorf("pg_controldata: the control file was read while being written")
	}
	return ParseControlData(out), nil
}

// ParseControlData reads pg_controldata's output.
func ParseControlData(out []byte) ControlData {
	var cd ControlData
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "Database cluster state":
			cd.State = v
		case "Latest checkpoint's TimeLineID":
			cd.Timeline, _ = strconv.ParseInt(v, 10, 64)
		case "Latest checkpoint location":
			cd.Checkpoint = v
		case "Latest checkpoint's REDO WAL file":
			cd.RedoWALFile = v
		}
	}
	return cd
}

// WriteConfig writes postgresql.conf, pg_hba.conf, pg_ident.conf and, for a standby, standby.signal;
// for a primary it removes standby.signal.
func (p *Postgres) WriteConfig(in pgconf.ConfInput) error {
	p.hbaMu.Lock()
	defer p.hbaMu.Unlock()
	files := map[string]string{
		"postgresql.conf": pgconf.PostgresqlConf(in),
		"pg_hba.conf":     in.HBA(),
		"pg_ident.conf":   pgconf.IdentConf(),
	}
	for name, content := range files {
		if err := pgconf.WriteFileAtomic(filepath.Join(p.PGData, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	p.wroteHBA(in.LockedOut)
	signal := filepath.Join(p.PGData, "standby.signal")
	if in.Role == pgconf.AsStandby {
		return pgconf.WriteFileAtomic(signal, nil, 0o600)
	}
	if err := os.Remove(signal); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// writeFileDurable is writeFileAtomic with the new content synced before the rename,
// so that a crash too leaves the old content or the whole new one.
func writeFileDurable(path string, content []byte, mode os.FileMode) error {
	return pgconf.ReplaceFile(path, content, mode, true)
}

// Process is a running postmaster.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	tail *tailBuffer
	// dataDir is the data directory: the working directory of every postgres process.
	dataDir string
	// Started is when the postmaster was started.
	Started time.Time
}

// Start starts the postmaster as a child, its output going to the agent's own and the
// last of it kept for error messages.
func (p *Postgres) Start() (*Process, error) {
	p.removeStaleLocks()
	if err := p.RemoveUnusedPlaceholders(); err != nil {
		return nil, fmt.Errorf("removing unused placeholder history files: %w", err)
	}
	cmd := exec.Command(p.Bin("postgres"), "-D", p.PGData)
	cmd.Env = append(os.Environ(), p.Env...)
	tail := &tailBuffer{max: 8 << 10}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(os.Stdout, tail), io.MultiWriter(os.Stderr, tail)
	// Its own process group: a terminal's Ctrl-C or a signal to the agent's group does
	// not reach postgres behind the agent's back; the agent decides how it stops.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.Lock != nil {
		cmd.ExtraFiles = []*os.File{p.Lock}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting postgres: %w", err)
	}
	proc := &Process{cmd: cmd, done: make(chan struct{}), Started: time.Now(), tail: tail, dataDir: p.PGData}
	go func() {
		proc.err = cmd.Wait()
		close(proc.done)
	}()
	return proc, nil
}

// Done is closed when the postmaster has exited.
func (pr *Process) Done() <-chan struct{} { return pr.done }

// Err is how the postmaster exited; valid after Done.
func (pr *Process) Err() error { return pr.err }

// Complaint is what postgres said went wrong before it exited: its last ERROR, FATAL and
// PANIC messages and the LOG lines about invalid settings (a bad parameter is reported
// as a LOG line, then "configuration file contains errors" as FATAL), the last three.
// The FATALs postgres answers clients with while it cannot take connections ("the
// database system is starting up", the agent's own pings among them) or ends their
// sessions with ("terminating connection due to unexpected postmaster exit") say
// nothing of why it exited, and would push the reason out of the three.
func (pr *Process) Complaint() string {
	var msgs []string
	for _, line := range strings.Split(pr.tail.String(), "\n") {
		for _, level := range []string{"FATAL:", "PANIC:", "ERROR:", "LOG:"} {
			_, msg, ok := strings.Cut(line, level)
			if !ok {
				continue
			}
			msg = strings.TrimSpace(msg)
			if level == "FATAL:" && (strings.HasPrefix(msg, "the database system is ") || strings.HasPrefix(msg, "terminating connection due to ")) {
				break
			}
			if level != "LOG:" || strings.Contains(msg, "invalid") || strings.Contains(msg, "unrecognized") || strings.Contains(msg, "syntax error") {
				msgs = append(msgs, msg)
			}
			break
		}
	}
	if len(msgs) > 3 {
		msgs = msgs[len(msgs)-3:]
	}
	return strings.Join(msgs, "; ")
}

// Signal is the signal that ended the postmaster, 0 when it exited by itself or has
// not exited; valid after Done.
func (pr *Process) Signal() syscall.Signal {
	var exit *exec.ExitError
	if !errors.As(pr.err, &exit) {
		return 0
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// Tail is the end of what the postmaster wrote (its log until the logging collector
// takes over), the last 8 KiB of it.
func (pr *Process) Tail() string { return pr.tail.String() }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = t.b[over:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Pid of the postmaster.
func (pr *Process) Pid() int { return pr.cmd.Process.Pid }

// StopMode is how postgres is stopped.
type StopMode int

const (
	// StopFast disconnects every session at once (no commit waiting for the gate is
	// acknowledged), writes the shutdown checkpoint and sends all WAL to the connected
	// standbys before it exits.
	StopFast StopMode = iota
	// StopKill kills every process of postgres at once (SIGKILL, see KillAll); the next
	// start recovers from the crash. For the data it is PostgreSQL's immediate
	// shutdown, without waiting for each process to take SIGQUIT and the postmaster to
	// collect them, which takes hundreds of milliseconds on a busy node. A process with
	// a SIGKILL pending runs none of its code again: once the signal is sent, nothing
	// of this postgres commits or sends WAL.
	StopKill
)

// Stop shuts the postmaster down in mode within timeout, escalating (fast, then
// immediate, then SIGKILL of every postgres process); it returns the signal the
// postmaster exited after when that is not mode's own (0 when it is).
func (pr *Process) Stop(timeout time.Duration, mode StopMode) (escalated syscall.Signal) {
	if mode == StopKill {
		pr.KillAll()
		<-pr.done
		return 0
	}
	steps := []struct {
		sig syscall.Signal
		d   time.Duration
	}{{syscall.SIGINT, timeout * 3 / 4}, {syscall.SIGQUIT, timeout / 4}}
	defer pr.KillAll()
	for i, s := range steps {
		_ = pr.cmd.Process.Signal(s.sig)
		select {
		case <-pr.done:
			if i > 0 {
				return s.sig
			}
			return 0
		case <-time.After(s.d):
		}
	}
	pr.KillAll()
	<-pr.done
	return syscall.SIGKILL
}

// KillAll kills the postmaster and every process it started. Each of those leads a
// process group and a session of its own (PostgreSQL's InitPostmasterChild calls
// setsid), so a signal to the postmaster's group reaches the postmaster alone, and a
// backend orphaned by a dead postmaster runs on until it notices: one with
// synchronous_commit off or local could still acknowledge a commit. They are found by
// their working directory, the data directory (the postmaster moves there first and its
// children inherit it), which also finds the orphans of a postmaster that already
// died. A live postmaster is stopped (SIGSTOP) first, so that it starts nothing between
// the listing and the kill.
//
// The postmaster is signalled through os.Process, which refuses once it has been
// waited for (its PID may then be another process's).
func (pr *Process) KillAll() {
	pm := pr.cmd.Process
	if pm.Signal(syscall.SIGSTOP) == nil {
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if state, err := procState(pm.Pid); err != nil || state == 'T' || state == 'Z' {
				break
			}
		}
	}
	for _, p := range processesIn(pr.dataDir) {
		if p != pm.Pid {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	_ = pm.Signal(syscall.SIGKILL)
}

// procState is the state letter of /proc/<pid>/stat (R, S, T, Z ...).
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; it ends at the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return b[i+2], nil
}

// processesIn lists the processes, other than this one, whose working directory is dir.
func processesIn(dir string) []int {
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == os.Getpid() {
			continue
		}
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p)); err == nil && cwd == want {
			pids = append(pids, p)
		}
	}
	return pids
}

// ProgramsMajor is the PostgreSQL major version of the programs in binDir ("15"), from
// postgres --version.
func ProgramsMajor(ctx context.Context, binDir string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("running postgres --version: %w", err)
	}
	fields := strings.Fields(string(out)) // "postgres (PostgreSQL) 15.10 (Debian 15.10-0+deb12u1)"
	if len(fields) < 3 {
		return "", fmt.Errorf("cannot read the version from %q", out)
	}
	return strings.SplitN(fields[2], ".", 2)[0], nil
}
