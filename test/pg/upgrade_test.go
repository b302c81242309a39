package pg

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// nextMajor is the bin directory of PostgreSQL 17 for the upgrade tests, carried out
// of its image by hack/postgres-next.sh (make test-quick sets PGPILOT_PG_NEXT) and
// copied once into the run's work directory, where the postgres OS user can run it.
func nextMajor(t testing.TB) string {
	t.Helper()
	nextOnce.Do(func() {
		src := os.Getenv("PGPILOT_PG_NEXT")
		if src == "" {
			nextErr = fmt.Errorf("PGPILOT_PG_NEXT is not set: make test-quick sets it; by hand, PGPILOT_PG_NEXT=$(bash hack/postgres-next.sh)")
			return
		}
		// The carried tree's top is five levels above its bin directory
		// (usr/lib/postgresql/17/bin).
		top := filepath.Clean(filepath.Join(src, "../../../../.."))
		dst := filepath.Join(workDir, "pg-next")
		if out, err := exec.Command("cp", "-a", top, dst).CombinedOutput(); err != nil {
			nextErr = fmt.Errorf("copying %s: %v: %s", top, err, out)
			return
		}
		rel, err := filepath.Rel(top, src)
		if err != nil {
			nextErr = err
			return
		}
		nextBin = filepath.Join(dst, rel)
	})
	if nextErr != nil {
		t.Fatal(nextErr)
	}
	return nextBin
}

var (
	nextOnce sync.Once
	nextBin  string
	nextErr  error
)

// toNextMajor restarts in's agent as the operator's rollout would during an upgrade:
// on the new major's image, with PostgreSQL 15's programs carried into the pod.
func (in *instance) toNextMajor(t testing.TB, bin string) {
	t.Helper()
	carried := filepath.Join(in.dir, "carried")
	mustMkdir(t, carried, 0o755)
	b, _ := json.Marshal(map[string]string{"major": "15", "version": "postgres (PostgreSQL) 15", "binDir": PGBin})
	mustWrite(t, filepath.Join(carried, "carried.json"), b)
	in.stop()
	in.binDir, in.carriedDir = bin, carried
	in.start()
}

// waitUpgrade waits until in's agent reports the upgrade to 17 in phase.
func (in *instance) waitUpgrade(t testing.TB, phase string, timeout time.Duration) agentapi.Upgrade {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *agentapi.Upgrade
	for time.Now().Before(deadline) {
		if st, err := in.status(); err == nil && st.Upgrade != nil {
			last = st.Upgrade
			if last.Phase == phase {
				return *last
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: no upgrade in phase %s within %s; last %+v\n%s", in.pod, phase, timeout, last, lastBytes(in.log.Bytes(), 6000))
	return agentapi.Upgrade{}
}

// A primary and two standbys on PostgreSQL 15, written to all along: set to 17, the
// primary checks, stops, upgrades with pg_upgrade and starts on 17 with every
// acknowledged row; its standbys set their 15 data aside and clone it; statistics
// are rebuilt.
//
// In synchronous mode too: commits wait for a standby of the new major, and none that
// was acknowledged is lost.
func TestMajorUpgrade(t *testing.T) {
	t.Parallel()
	for _, k := range []int{0, 1} {
		t.Run(fmt.Sprintf("synchronousReplicas=%d", k), func(t *testing.T) {
			t.Parallel()
			upgradeUnderWrites(t, k)
		})
	}
}

func upgradeUnderWrites(t *testing.T, synchronous int) {
	bin := nextMajor(t)
	c := newCluster(t, 3)
	c.setConfig("synchronousReplicas", synchronous)
	c.setConfig("upgrade", map[string]any{"withoutBackup": true}) // no backup store here
	before := c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE items (id bigint PRIMARY KEY, note text)")
	p.mustExec("INSERT INTO items SELECT g, 'before ' || g FROM generate_series(1, 5000) g")

	// A writer all along, through the upgrade: every acknowledged row must be there.
	var acked []int64
	var ackedMu sync.Mutex
	var next atomic.Int64
	next.Store(100000)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for {
			select {
			case <-stop:
				return
			default:
			}
			id := next.Add(1)
			if err := p.exec("INSERT INTO items VALUES ($1, 'during')", id); err == nil {
				ackedMu.Lock()
				acked = append(acked, id)
				ackedMu.Unlock()
			} else {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()

	c.setConfig("version", "17")
	for _, r := range c.instances[1:] {
		r.toNextMajor(t, bin)
		r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	}
	c.setLease(p.pod, true)
	p.toNextMajor(t, bin)
	c.setLease(p.pod, true)
	done := p.waitUpgrade(t, agentapi.UpgradeCompleted, 4*time.Minute)
	t.Logf("upgrade: %+v", done)
	if done.WritesStoppedMillis <= 0 {
		t.Errorf("the upgrade did not say how long writes stopped: %+v", done)
	}
	close(stop)
	<-wrote

	st := p.waitRole(agentapi.RolePrimary, 0, upTimeout)
	if st.PostgresVersion/10000 != 17 || st.UpgradedFrom == nil || st.UpgradedFrom.Major != "15" {
		t.Fatalf("primary after the upgrade: version %d, upgraded from %+v", st.PostgresVersion, st.UpgradedFrom)
	}
	// Above every timeline of the old database, whose history files share the archive,
	// with one ID left free between them.
	if st.Timeline <= before.Timeline+1 {
		t.Errorf("the upgraded primary is on timeline %d, the old database was on %d", st.Timeline, before.Timeline)
	}
	ackedMu.Lock()
	want := append([]int64(nil), acked...)
	ackedMu.Unlock()
	if len(want) == 0 {
		t.Fatal("the writer had no write acknowledged")
	}
	p.mustExec("INSERT INTO items VALUES (1, 'after') ON CONFLICT (id) DO UPDATE SET note = 'after'")
	if n := p.countWhere("items", "id <= 5000"); n != 5000 {
		t.Errorf("%d of the 5000 rows before the upgrade", n)
	}
	missing := p.countMissing(t, want)
	if missing > 0 {
		t.Errorf("%d of %d acknowledged rows are missing after the upgrade", missing, len(want))
	}
	t.Logf("%d rows acknowledged during the upgrade, all present", len(want))
	var stats int
	if err := p.query("SELECT count(*) FROM pg_stats WHERE tablename = 'items'", &stats); err != nil || stats == 0 {
		t.Errorf("no planner statistics for items after the upgrade (%d, %v)", stats, err)
	}
	onPrimary, err := p.count("items")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.instances[1:] {
		rs := r.waitRole(agentapi.RoleReplica, st.Timeline, 3*time.Minute)
		deadline := time.Now().Add(3 * time.Minute)
		for rs.PostgresVersion/10000 != 17 && time.Now().Before(deadline) {
			time.Sleep(500 * time.Millisecond)
			rs, _ = r.status()
		}
		if rs.PostgresVersion/10000 != 17 {
			t.Fatalf("%s runs %d, not 17\n%s", r.pod, rs.PostgresVersion, lastBytes(r.log.Bytes(), 4000))
		}
		// The primary's count: a write the writer gave up on may have committed too.
		r.waitCount("items", onPrimary, upTimeout)
		if len(rs.SetAside) == 0 {
			t.Errorf("%s kept no set-aside copy of its PostgreSQL 15 data", r.pod)
		}
	}
	if len(st.SetAside) == 0 || !strings.Contains(st.SetAside[0].Reason, "upgraded to PostgreSQL 17") {
		t.Errorf("the primary's PostgreSQL 15 data directory was not set aside: %+v", st.SetAside)
	}
}

// Without a recent base backup (here, without a backup store at all) the upgrade waits
// in its checks, the primary serving PostgreSQL 15 and saying why, until the user
// lets it go without one.
func TestMajorUpgradeWaitsForABackup(t *testing.T) {
	t.Parallel()
	bin := nextMajor(t)
	c := newCluster(t, 1)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE items (id bigint PRIMARY KEY)")
	c.setConfig("version", "17")
	c.setLease(p.pod, true)
	p.toNextMajor(t, bin)
	c.setLease(p.pod, true)
	waiting := p.waitUpgrade(t, agentapi.UpgradeChecking, 2*time.Minute)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(waiting.Message, "no backup store") && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		waiting = p.waitUpgrade(t, agentapi.UpgradeChecking, time.Minute)
	}
	if !strings.Contains(waiting.Message, "no backup store") || !strings.Contains(waiting.Message, "spec.upgrade.withoutBackup") {
		t.Fatalf("the upgrade does not say it waits for a backup: %q", waiting.Message)
	}
	if st := p.waitRole(agentapi.RolePrimary, 1, upTimeout); st.PostgresVersion/10000 != 15 {
		t.Fatalf("the primary runs %d while the upgrade waits", st.PostgresVersion)
	}
	p.mustExec("INSERT INTO items VALUES (1)")
	c.setConfig("upgrade", map[string]any{"withoutBackup": true})
	p.waitUpgrade(t, agentapi.UpgradeCompleted, 3*time.Minute)
	if n, err := p.count("items"); err != nil || n != 1 {
		t.Errorf("%d rows (%v) after the upgrade, want 1", n, err)
	}
}

// The pod of a primary killed while pg_upgrade runs (the agent, pg_upgrade and the
// servers it started: a container's processes all go with it) comes back on the old
// major with its data as it was, every row there, and upgrades again.
func TestMajorUpgradeKilledMidwayStartsOver(t *testing.T) {
	t.Parallel()
	bin := nextMajor(t)
	c := newCluster(t, 1)
	c.setConfig("upgrade", map[string]any{"withoutBackup": true})
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE items (id bigint PRIMARY KEY, note text)")
	p.mustExec("INSERT INTO items SELECT g, repeat('x', 200) FROM generate_series(1, 100000) g")
	c.setConfig("version", "17")
	c.setLease(p.pod, true)
	p.toNextMajor(t, bin)
	c.setLease(p.pod, true)
	p.waitUpgrade(t, agentapi.UpgradeUpgrading, 3*time.Minute)
	time.Sleep(time.Second) // pg_upgrade under way
	_ = p.cmd.Process.Kill()
	<-p.done
	if out, err := exec.Command("pkill", "-KILL", "-f", p.dir).CombinedOutput(); err != nil {
		t.Logf("pkill: %v %s", err, out) // nothing left is fine too
	}
	time.Sleep(500 * time.Millisecond)
	p.start()
	done := p.waitUpgrade(t, agentapi.UpgradeCompleted, 4*time.Minute)
	t.Logf("upgraded after the kill: %s", done.Message)
	if st := p.waitRole(agentapi.RolePrimary, 0, upTimeout); st.PostgresVersion/10000 != 17 {
		t.Fatalf("the primary runs %d after the upgrade", st.PostgresVersion)
	}
	if n, err := p.count("items"); err != nil || n != 100000 {
		t.Errorf("%d rows (%v) after the upgrade, want 100000", n, err)
	}
	if strings.Contains(p.log.String(), "Found an upgrade the agent did not finish") {
		t.Log("the restarted agent undid or finished the interrupted upgrade first")
	}
}

// countMissing counts the ids of want that items lacks.
func (in *instance) countMissing(t *testing.T, want []int64) int64 {
	t.Helper()
	var missing int64
	in.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT count(*) FROM unnest($1::bigint[]) id WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.id = id)", want).Scan(&missing)
	})
	return missing
}

// An upgrade pg_upgrade --check refuses (a function whose library the new major lacks,
// as an extension missing from the new image would be) stops nothing: the primary
// serves PostgreSQL 15 on, and says why.
func TestMajorUpgradeRefusedLeavesTheOldMajorServing(t *testing.T) {
	t.Parallel()
	bin := nextMajor(t)
	c := newCluster(t, 1)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE items (id bigint PRIMARY KEY)")
	p.mustExec("INSERT INTO items SELECT generate_series(1, 100)")
	// As the superuser over the local socket (the only way it logs in). CREATE FUNCTION
	// checks that the library exists: the function is made with one that does, then
	// pointed at one that exists nowhere.
	psql := exec.Command(filepath.Join(PGBin, "psql"), "-h", filepath.Join(p.dir, "run"), "-U", "postgres", "-d", "app", "-v", "ON_ERROR_STOP=1",
		"-c", "CREATE FUNCTION gone() RETURNS language_handler LANGUAGE c AS '$libdir/plpgsql', 'plpgsql_call_handler'",
		"-c", "UPDATE pg_proc SET probin = '$libdir/pgpilot_gone' WHERE proname = 'gone'")
	psql.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("creating a function whose library is gone: %v\n%s", err, out)
	}
	c.setConfig("version", "17")
	c.setLease(p.pod, true)
	p.toNextMajor(t, bin)
	c.setLease(p.pod, true)
	failed := p.waitUpgrade(t, agentapi.UpgradeFailed, 3*time.Minute)
	t.Logf("the upgrade failed: %s", failed.Message)
	if !strings.Contains(failed.Message, "pgpilot_gone") || !strings.Contains(failed.Message, "nothing was stopped") {
		t.Errorf("the failure does not name the missing library: %q", failed.Message)
	}
	st := p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	if st.PostgresVersion/10000 != 15 || !st.Ready {
		t.Fatalf("after the refused upgrade: version %d, ready %v", st.PostgresVersion, st.Ready)
	}
	p.mustExec("INSERT INTO items VALUES (101)")
	if n, err := p.count("items"); err != nil || n != 101 {
		t.Errorf("%d rows (%v), want 101", n, err)
	}
	if _, err := os.Stat(p.pgdata + ".upgrade"); !os.IsNotExist(err) {
		t.Errorf("the refused upgrade's new data directory is left: %v", err)
	}
}

// BenchmarkMajorUpgrade upgrades a primary and a standby of PostgreSQL 15 with 200,000
// rows (about 30 MB) to 17, b.N times, while a writer inserts through the primary, and
// prints how long writes were unavailable (the longest time between two acknowledged
// inserts, the rollout's restarts included) and how long the primary was down for
// pg_upgrade (its agent's writesStoppedMillis), in seconds: the mean and the worst. It
// asserts nothing about the figures; make bench runs it 3 times.
func BenchmarkMajorUpgrade(b *testing.B) {
	bin := nextMajor(b)
	var gaps, down []float64
	for range b.N {
		c := newCluster(b, 2)
		c.setConfig("upgrade", map[string]any{"withoutBackup": true})
		c.startAll()
		p, r := c.instances[0], c.instances[1]
		p.mustExec("CREATE TABLE items (id bigint PRIMARY KEY, note text)")
		p.mustExec("INSERT INTO items SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g")
		stop := make(chan struct{})
		gap := make(chan time.Duration)
		go func() {
			last, worst := time.Now(), time.Duration(0)
			for id := int64(1_000_000); ; id++ {
				select {
				case <-stop:
					gap <- worst
					return
				default:
				}
				if p.exec("INSERT INTO items VALUES ($1, 'during')", id) == nil {
					worst, last = max(worst, time.Since(last)), time.Now()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
		c.setConfig("version", "17")
		r.toNextMajor(b, bin)
		r.waitRole(agentapi.RoleReplica, 1, upTimeout)
		c.setLease(p.pod, true)
		p.toNextMajor(b, bin)
		c.setLease(p.pod, true)
		u := p.waitUpgrade(b, agentapi.UpgradeCompleted, 5*time.Minute)
		for p.exec("SELECT 1") != nil {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Second)
		close(stop)
		gaps = append(gaps, (<-gap).Seconds())
		down = append(down, float64(u.WritesStoppedMillis)/1000)
		c.stopAll()
	}
	b.ReportMetric(mean(gaps), "unavailable-s")
	b.ReportMetric(slices.Max(gaps), "unavailable-max-s")
	b.ReportMetric(mean(down), "pg_upgrade-down-s")
	b.ReportMetric(slices.Max(down), "pg_upgrade-down-max-s")
}

func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
