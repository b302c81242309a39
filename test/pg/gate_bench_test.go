package pg

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gateBenchSeconds is how long each pgbench run lasts (PGPILOT_GATE_BENCH_SECONDS, 20
// by default).
func gateBenchSeconds() int {
	if s, err := strconv.Atoi(os.Getenv("PGPILOT_GATE_BENCH_SECONDS")); err == nil && s > 0 {
		return s
	}
	return 20
}

// BenchmarkCommitGate prints what the commit gate costs: pgbench through a pgpilot
// primary (a single instance, so its commits wait for the agent's gate and nothing
// else) against a bare postgres of the same programs, started with the very same
// postgresql.conf less the gate (synchronous_standby_names empty), on the same machine,
// both over their Unix socket as the postgres superuser. Each iteration is one pair of
// runs per workload, the order alternating; the figures are the medians over the pairs
// and the ratio pgpilot / bare:
//   - commit: pgbench -N (the simple update, one commit per transaction), 8 clients;
//   - read: pgbench -S (select only), 8 clients.
//
// A third server, the floor, is the bare one with the cheapest synchronous standby
// PostgreSQL has: its own pg_receivewal (a C client of the same protocol), writing into
// memory (tmpfs, where its flush after every message costs nothing) and reporting each
// message as flushed at once (--synchronous). Any commit gate built on
// synchronous replication pays at least that round trip; floor/bare is the best ratio
// such a gate can reach on this machine, and pgpilot/floor what the gate adds to it.
//
// It asserts nothing about the figures (make bench runs it 3 times).
func BenchmarkCommitGate(b *testing.B) {
	c := newCluster(b, 1)
	c.startAll()
	in := c.instances[0]
	in.mustExec("SELECT 1")
	pgpilot := pgbenchTarget{socket: filepath.Join(in.dir, "run"), port: 5432}
	bare := startBare(b, in, filepath.Join(c.dir, "bare"), 5433, "")
	floor := startBare(b, in, filepath.Join(c.dir, "floor"), 5434, floorStandby)
	startFloorStandby(b, floor)

	targets := []struct {
		name string
		t    pgbenchTarget
	}{{"pgpilot", pgpilot}, {"bare", bare}, {"floor", floor}}
	for _, t := range targets {
		t.t.run(b, "-i", "-q", "-s", "10")
	}
	seconds := strconv.Itoa(gateBenchSeconds())
	workloads := []struct {
		name string
		args []string
	}{
		{"commit", []string{"-N", "-c", "8", "-j", "2", "-T", seconds}},
		{"read", []string{"-S", "-c", "8", "-j", "2", "-T", seconds}},
	}
	tps := map[string][]float64{}
	b.ResetTimer()
	for i := range b.N {
		for _, w := range workloads {
			order := slices.Clone(targets)
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, o := range order {
				got := o.t.tps(b, w.args...)
				tps[w.name+"/"+o.name] = append(tps[w.name+"/"+o.name], got)
				b.Logf("pair %d, %s, %s: %.0f tps", i+1, w.name, o.name, got)
			}
		}
	}
	b.StopTimer()
	for _, w := range workloads {
		p, r, f := median(tps[w.name+"/pgpilot"]), median(tps[w.name+"/bare"]), median(tps[w.name+"/floor"])
		b.ReportMetric(p, w.name+"-pgpilot-tps")
		b.ReportMetric(r, w.name+"-bare-tps")
		b.ReportMetric(f, w.name+"-floor-tps")
		b.ReportMetric(p/r, w.name+"-ratio")
		b.ReportMetric(f/r, w.name+"-floor-ratio")
		b.Logf("%s: pgpilot %.0f tps, bare %.0f tps, floor %.0f tps (medians of %d rounds of %s s): pgpilot/bare %.3f, floor/bare %.3f, pgpilot/floor %.3f",
			w.name, p, r, f, b.N, seconds, p/r, f/r, p/f)
	}
	b.ReportMetric(0, "ns/op")
}

// pgbenchTarget is a postgres pgbench reaches over a Unix socket as postgres.
type pgbenchTarget struct {
	socket string
	port   int
}

var tpsLine = regexp.MustCompile(`(?m)^tps = ([0-9.]+) \(without initial connection time\)`)

// tps runs pgbench with args and returns its transactions per second.
func (t pgbenchTarget) tps(b *testing.B, args ...string) float64 {
	out := t.run(b, args...)
	m := tpsLine.FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("pgbench %v printed no tps:\n%s", args, out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// run runs pgbench with args against postgres as the postgres OS user and returns its
// output.
func (t pgbenchTarget) run(b *testing.B, args ...string) string {
	b.Helper()
	cmd := exec.Command(filepath.Join(PGBin, "pgbench"), append([]string{"-h", t.socket, "-p", strconv.Itoa(t.port), "-U", "postgres"}, append(args, "postgres")...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b.Fatalf("pgbench %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}

// floorStandby is the application_name of the floor's synchronous standby.
const floorStandby = "pg_receivewal"

// startBare initialises and starts, in dir, a postgres of the same programs as in's
// with in's postgresql.conf, less the commit gate and in's addresses: no TCP, its own
// socket directory and port, and synchronousStandby as its synchronous_standby_names
// (none when empty). It is stopped when the benchmark ends.
func startBare(b *testing.B, in *instance, dir string, port int, synchronousStandby string) pgbenchTarget {
	b.Helper()
	mustMkdir(b, dir, 0o755)
	if err := os.Chown(dir, int(pgUID), int(pgGID)); err != nil {
		b.Fatal(err)
	}
	data, run := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	// The same initdb options as the agent's first primary (checksums on).
	if out, err := asPostgres("initdb", "-D", data, "--data-checksums", "--encoding=UTF8", "--locale=C", "--auth=peer").CombinedOutput(); err != nil {
		b.Fatalf("initdb: %v\n%s", err, out)
	}
	mustMkdir(b, run, 0o755)
	if err := os.Chown(run, int(pgUID), int(pgGID)); err != nil {
		b.Fatal(err)
	}
	t := pgbenchTarget{socket: run, port: port}
	cmd := asPostgres("postgres", "-D", data, "-c", "config_file="+filepath.Join(in.pgdata, "postgresql.conf"),
		"-c", "hba_file="+filepath.Join(data, "pg_hba.conf"), "-c", "ident_file="+filepath.Join(data, "pg_ident.conf"),
		"-c", "listen_addresses=", "-c", "unix_socket_directories="+run, "-c", "port="+strconv.Itoa(t.port),
		"-c", "synchronous_standby_names="+synchronousStandby)
	startUntil(b, cmd, "the bare postgres did not start", func() bool {
		return asPostgres("pg_isready", "-h", run, "-p", strconv.Itoa(t.port)).Run() == nil
	})
	return t
}

// startUntil starts cmd, stopped by SIGINT when the benchmark ends, and waits up to 30 s
// until ready; failing, it prints failure and cmd's output.
func startUntil(b *testing.B, cmd *exec.Cmd, failure string, ready func() bool) {
	b.Helper()
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			b.Fatalf("%s:\n%s", failure, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startFloorStandby streams t's WAL into a directory in memory (/dev/shm) with
// pg_receivewal as t's synchronous standby, and waits until t counts it as such. It is
// stopped, and its directory removed, when the benchmark ends.
func startFloorStandby(b *testing.B, t pgbenchTarget) {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "pgpilot-floor-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chown(dir, int(pgUID), int(pgGID)); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(PGBin, "pg_receivewal"), "-D", dir, "-h", t.socket, "-p", strconv.Itoa(t.port),
		"-U", "postgres", "--synchronous", "--no-loop")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	startUntil(b, cmd, "pg_receivewal did not become the floor's synchronous standby", t.hasSyncStandby)
}

// hasSyncStandby reports whether t has a synchronous standby streaming.
func (t pgbenchTarget) hasSyncStandby() bool {
	cmd := exec.Command(filepath.Join(PGBin, "psql"), "-X", "-At", "-h", t.socket, "-p", strconv.Itoa(t.port), "-U", "postgres",
		"-c", "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'", "postgres")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	out, err := cmd.Output()
	return err == nil && strings.TrimSpace(string(out)) == "1"
}
