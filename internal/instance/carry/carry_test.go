package carry

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// pgBin is where Debian's PostgreSQL 15 package, which the real-PostgreSQL tests run
// (hack/install-postgres.sh), puts its programs.
const pgBin = "/usr/lib/postgresql/15/bin"

func TestWrapper(t *testing.T) {
	got := wrapper("/../../../../..", "ld-linux-x86-64.so.2", "pg_ctl")
	want := `#!/bin/sh
bin=${0%/*}
exec "$bin/../../../../../lib/ld-linux-x86-64.so.2" --library-path "$bin/../../../../../lib" --argv0 "$0" "$bin/.real/pg_ctl" "$@"
`
	if got != want {
		t.Errorf("wrapper:\n%s\nwant:\n%s", got, want)
	}
}

func TestLoadMissing(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a directory never carried into: %v, want an os.ErrNotExist", err)
	}
}

func TestCarryRefuses(t *testing.T) {
	if _, err := Carry("/", "carried"); err == nil {
		t.Error("Carry into a relative directory succeeded")
	}
	dir := filepath.Join(t.TempDir(), "carried")
	if _, err := Carry(t.TempDir(), dir); err == nil || !strings.Contains(err.Error(), "found 0") {
		t.Errorf("Carry from a root without PostgreSQL: %v", err)
	}
}

// TestCarry carries this machine's PostgreSQL 15 and runs a server with the carried
// programs only: initdb, pg_ctl, postgres and psql.
func TestCarry(t *testing.T) {
	if _, err := os.Stat(filepath.Join(pgBin, "postgres")); err != nil {
		t.Fatalf("PostgreSQL 15 is not installed at %s: run hack/install-postgres.sh (make test-quick does)", pgBin)
	}
	base := t.TempDir()
	asUser := pgUser(t, base)
	dir := filepath.Join(base, "carried")
	c, err := Carry("/", dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Major != "15" || !strings.HasPrefix(c.Version, "postgres (PostgreSQL) 15.") || c.BinDir != filepath.Join(dir, pgBin) {
		t.Errorf("Carry returned %+v", c)
	}
	// An init container may run twice.
	if _, err := Carry("/", dir); err != nil {
		t.Fatalf("carrying again: %v", err)
	}
	if loaded, err := Load(dir); err != nil || loaded != c {
		t.Errorf("Load: %+v, %v; want %+v", loaded, err, c)
	}
	if _, err := os.Stat(filepath.Join(dir, "lib", "libc.so.6")); err != nil {
		t.Errorf("glibc was not carried: %v", err)
	}
	// The wrappers find the tree from their own path: it works wherever it is moved.
	moved := filepath.Join(base, "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	dir = moved
	c.BinDir = filepath.Join(dir, pgBin)

	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(c.BinDir, name), args...)
		cmd.Dir = base
		asUser(cmd)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := run("postgres", "--version"); out != c.Version {
		t.Errorf("postgres --version: %q, want %q", out, c.Version)
	}
	if out := run("pg_controldata", "--version"); !strings.HasPrefix(out, "pg_controldata (PostgreSQL) 15.") {
		t.Errorf("pg_controldata --version: %q", out)
	}

	work := filepath.Join(base, "work")
	socket := filepath.Join(work, "socket")
	data := filepath.Join(work, "data")
	logFile := filepath.Join(work, "log")
	for _, d := range []string{work, socket} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		chown(t, d)
	}
	run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--locale=C", "-E", "UTF8")
	cmd := exec.Command(filepath.Join(c.BinDir, "pg_ctl"), "-w", "-D", data, "-o", "-k "+socket+" -c listen_addresses=''", "-l", logFile, "start")
	cmd.Dir = base
	asUser(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("pg_ctl start: %v\n%s\nserver log:\n%s", err, out, log)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd := exec.Command(filepath.Join(c.BinDir, "pg_ctl"), "-w", "-D", data, "stop", "-m", "immediate")
			asUser(cmd)
			_ = cmd.Run()
		}
	})

	psql := func(sql string) string {
		return run("psql", "-X", "-A", "-t", "-h", socket, "-U", "postgres", "-d", "postgres", "-c", sql)
	}
	if out := psql("SELECT 1"); out != "1" {
		t.Errorf("SELECT 1: %q", out)
	}
	// The server found its share and lib directories beside the carried programs, from
	// argv[0], not the installation it was carried from.
	want := filepath.Join(dir, "usr/share/postgresql/15") + "|" + filepath.Join(dir, "usr/lib/postgresql/15/lib")
	if out := psql("SELECT string_agg(setting, '|' ORDER BY name DESC) FROM pg_config WHERE name IN ('SHAREDIR', 'PKGLIBDIR')"); out != want {
		t.Errorf("SHAREDIR|PKGLIBDIR: %q, want %q", out, want)
	}
	// And runs on the carried glibc.
	pid, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(filepath.Join("/proc", strings.SplitN(string(pid), "\n", 2)[0], "maps"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), filepath.Join(dir, "lib", "libc.so.6")) {
		t.Errorf("postgres does not run on the carried libc.so.6:\n%s", maps)
	}
	run("pg_ctl", "-w", "-D", data, "stop", "-m", "fast")
	stopped = true
}

// pgUser returns what runs a command as the postgres OS user when the test runs as root
// (PostgreSQL refuses to run as root), and makes base traversable by it; as another
// user it changes nothing.
func pgUser(t *testing.T, base string) func(*exec.Cmd) {
	if os.Geteuid() != 0 {
		return func(*exec.Cmd) {}
	}
	uid, gid := postgresIDs(t)
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	}
}

// chown gives dir to the postgres OS user when the test runs as root.
func chown(t *testing.T, dir string) {
	if os.Geteuid() != 0 {
		return
	}
	uid, gid := postgresIDs(t)
	if err := os.Chown(dir, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
}

func postgresIDs(t *testing.T) (uint32, uint32) {
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal("no postgres OS user (Debian's postgresql package creates it):", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uint32(uid), uint32(gid)
}
