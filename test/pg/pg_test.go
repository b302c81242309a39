package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

const upTimeout = 90 * time.Second

// A primary and two replicas come up from nothing and stream: rows written on the
// primary appear on both, and the primary keeps a slot per replica.
func TestPrimaryAndReplicasStream(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	p := c.instances[0]
	st := c.startAll()
	if st.PostgresVersion < 150000 || st.PostgresVersion >= 160000 {
		t.Errorf("postgres version %d, want 15.x", st.PostgresVersion)
	}
	p.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
	for range 100 {
		p.mustExec("INSERT INTO t (v) VALUES ('x')")
	}
	for _, r := range c.instances[1:] {
		r.waitCount("t", 100, 30*time.Second)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		streaming := map[string]bool{}
		for _, r := range st.Replicas {
			streaming[r.Name] = r.State == "streaming"
		}
		if !streaming[c.instances[1].pod] || !streaming[c.instances[2].pod] {
			return errors.New("not both replicas streaming: " + st.Error)
		}
		return nil
	})
	// A replica refuses writes.
	if err := c.instances[1].exec("INSERT INTO t (v) VALUES ('no')"); err == nil {
		t.Error("a replica accepted a write")
	}
	// The primary keeps an active slot per replica, and says so in /metrics.
	testutil.Eventually(t, 30*time.Second, func() error {
		req, err := http.NewRequest(http.MethodGet, "https://"+p.ip+":8008/metrics", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.agentHTTP(p.pod).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, r := range c.instances[1:] {
			want := fmt.Sprintf(`pgpilot_replication_slot_active{slot="%s"} 1`, strings.ReplaceAll("pgpilot_"+r.pod, "-", "_"))
			if !strings.Contains(string(body), want) {
				return fmt.Errorf("/metrics lacks %s", want)
			}
		}
		if !strings.Contains(string(body), "pgpilot_instance_role{role=\"primary\"} 1") {
			return errors.New("/metrics does not say primary")
		}
		return nil
	})
}

// kill -9 of the primary (agent and postmaster, like a pod that dies); a replica is
// promoted through the API once the Lease names it, accepts writes, the other replica
// follows the new timeline, and the old primary rejoins through pg_rewind and catches up.
func TestFailoverAndRejoin(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	c.startAll()
	old, next, other := c.instances[0], c.instances[1], c.instances[2]
	old.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
	old.mustExec("INSERT INTO t (v) SELECT 'before' FROM generate_series(1, 50)")
	next.waitCount("t", 50, 30*time.Second)
	other.waitCount("t", 50, 30*time.Second)

	old.kill9()
	// Promoting before the Lease names the instance is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := next.api().Promote(ctx); !errors.Is(err, agentapi.ErrConflict) {
		t.Fatalf("promote while the Lease names the old primary: got %v, want a conflict", err)
	}
	c.setLease(next.pod, true)
	start := time.Now()
	if _, err := next.api().Promote(ctx); err != nil {
		t.Fatalf("promote: %v", err)
	}
	next.waitRole(agentapi.RolePrimary, 2, 30*time.Second)
	next.mustExec("INSERT INTO t (v) SELECT 'after' FROM generate_series(1, 25)")
	t.Logf("promoted and wrote %s after the promote call", time.Since(start).Round(time.Millisecond))
	other.waitRole(agentapi.RoleReplica, 2, 60*time.Second)
	other.waitCount("t", 75, 30*time.Second)

	// The old primary comes back, rewinds and follows.
	old.start()
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	old.waitCount("t", 75, 30*time.Second)
	next.mustExec("INSERT INTO t (v) VALUES ('later')")
	old.waitCount("t", 76, 30*time.Second)
	if err := old.exec("INSERT INTO t (v) VALUES ('no')"); err == nil {
		t.Error("the rejoined old primary accepted a write")
	}
}

// A standby that is down when the Lease moves to it (or that was killed while it
// promoted) starts as the primary on a new timeline: started without recovery it would
// write the old primary's timeline further from its own position, and the old primary,
// which wrote that timeline further, would find "no rewind required" and never follow.
func TestStoppedStandbyNamedPrimaryStartsANewTimeline(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	old, next := c.instances[0], c.instances[1]
	old.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
	old.mustExec("INSERT INTO t (v) SELECT 'before' FROM generate_series(1, 50)")
	next.waitCount("t", 50, 30*time.Second)
	next.stop()
	// The old primary writes on after its standby stopped: WAL the standby lacks.
	old.mustExec("INSERT INTO t (v) SELECT 'lost' FROM generate_series(1, 10)")
	old.kill9()

	c.setLease(next.pod, true)
	next.start()
	next.waitRole(agentapi.RolePrimary, 2, upTimeout)
	next.mustExec("INSERT INTO t (v) SELECT 'after' FROM generate_series(1, 5)")
	// The old primary rewinds onto the new timeline and follows.
	old.start()
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	old.waitCount("t", 55, 30*time.Second)
}

// Two promotions never choose one timeline ID. A was promoted (timeline 2) and wrote,
// then died; B, stopped before A's promotion, never saw A's history file and is
// promoted in its place. PostgreSQL alone would name B's timeline 2 as well (one above
// the newest history file B has), and pg_rewind would then find A and B "on the same
// timeline" and rewind nothing: A would follow B from a position in its own WAL, not
// B's (make chaos, back-to-back). The Lease reserves 3 for B's term; A rewinds onto it
// and loses the rows only it had.
//
// With collide, the test writes the Lease's reservation down to 2, as a Lease written
// before reservations existed would have it: both promotions choose 2, and A's agent
// must see that their histories of timeline 2 differ and clone A again.
func TestTwoPromotionsNeverChooseOneTimeline(t *testing.T) {
	t.Parallel()
	for _, collide := range []bool{false, true} {
		t.Run(fmt.Sprintf("collide=%v", collide), func(t *testing.T) { twoPromotions(t, collide) })
	}
}

func twoPromotions(t *testing.T, collide bool) {
	c := newCluster(t, 3)
	c.startAll()
	p, a, b := c.instances[0], c.instances[1], c.instances[2]
	p.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
	p.mustExec("INSERT INTO t (v) SELECT 'all' FROM generate_series(1, 50)")
	b.waitCount("t", 50, 30*time.Second)
	b.stop()
	// A receives WAL that B lacks: the two promotions leave timeline 1 at different
	// positions, so their history files of the next timeline differ.
	p.mustExec("INSERT INTO t (v) SELECT 'p' FROM generate_series(1, 10)")
	a.waitCount("t", 60, 30*time.Second)
	p.kill9()

	c.setLease(a.pod, true)
	a.waitRole(agentapi.RolePrimary, 2, upTimeout)
	a.mustExec("INSERT INTO t (v) SELECT 'a' FROM generate_series(1, 7)")
	a.kill9()

	c.setLease(b.pod, true)
	want := int64(3)
	if collide {
		c.setLeaseAnnotation(primarylease.AnnotationTimeline, "2")
		want = 2
	}
	b.start()
	b.waitRole(agentapi.RolePrimary, want, upTimeout)
	b.mustExec("INSERT INTO t (v) SELECT 'b' FROM generate_series(1, 5)")

	a.start()
	a.waitRole(agentapi.RoleReplica, want, upTimeout)
	a.waitCount("t", 55, 30*time.Second)
	if n := a.countWhere("t", "v = 'a'"); n != 0 {
		t.Errorf("A kept %d rows it wrote on its own timeline after following B", n)
	}
	b.mustExec("INSERT INTO t (v) VALUES ('later')")
	a.waitCount("t", 56, 30*time.Second)
	if collide && !strings.Contains(a.log.String(), "Cloning again: pg_rewind would take this data directory for one history") {
		t.Errorf("A's agent did not say why it cloned again; its log ends:\n%s", lastBytes(a.log.Bytes(), 3000))
	}
}

// A former primary never rewinds onto, or clones from, another database. Here the
// primary Lease was deleted and recreated naming the standby, whose volume had been
// emptied: it ran initdb, a new database with its own system identifier. pg_rewind of
// the former primary, which has the cluster's data, fails on that ("different
// systems"), and the clone that used to follow a failed rewind replaced the data with
// the empty database (issue 12). The agent now refuses and says why; the data stays.
func TestRewindOntoAnotherDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	old, other := c.instances[0], c.instances[1]
	c.anotherDatabase(other)
	old.start()
	old.waitRefusal()
	if st, err := old.status(); err != nil || st.Role == agentapi.RoleReplica {
		t.Errorf("the former primary: %+v, %v; want it not to follow another database", st, err)
	}
	old.keptItsData(other)
}

// A standby never follows a primary that holds another database. PostgreSQL's WAL
// receiver refuses it by itself, but it used to do so silently, in a loop; the agent
// now reports the refusal with what to do, and the standby's data stays its own.
func TestStandbyRefusesToFollowAnotherDatabase(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	c.anotherDatabase(p)
	// p is the primary of an empty database; r, the cluster's former standby, still
	// has standby.signal and starts as a standby of p.
	r.start()
	r.waitRefusal()
	r.keptItsData(p)
}

// anotherDatabase writes a row through the primary (instance 0) of a two-instance
// cluster, then makes other the primary of another database: both instances killed,
// other's volume emptied, the Lease recreated as a new cluster's naming other, which
// runs initdb. The other instance, which keeps the row, stays stopped.
func (c *cluster) anotherDatabase(other *instance) {
	t := c.t
	t.Helper()
	c.instances[0].mustExec("CREATE TABLE keep (v text)")
	c.instances[0].mustExec("INSERT INTO keep VALUES ('the cluster''s data')")
	for _, in := range c.instances {
		in.waitCount("keep", 1, 30*time.Second)
	}
	for _, in := range c.instances {
		in.kill9()
	}
	if err := os.RemoveAll(other.pgdata); err != nil {
		t.Fatal(err)
	}
	if err := kube.CoordinationV1().Leases(c.namespace).Delete(context.Background(), dbv1.NamesOf(c.name).PrimaryLease(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.setLease(other.pod, false)
	other.start()
	other.waitRole(agentapi.RolePrimary, 0, upTimeout)
}

// waitRefusal waits until in's agent reports that it refuses another database.
func (in *instance) waitRefusal() {
	in.c.t.Helper()
	testutil.Eventually(in.c.t, upTimeout, func() error {
		st, err := in.status()
		if err != nil {
			return err
		}
		if !strings.Contains(st.Refusal, "holds another database") {
			return fmt.Errorf("%s: role %s, refusal %q, error %q; want the refusal", in.pod, st.Role, st.Refusal, st.Error)
		}
		return nil
	})
}

// keptItsData checks that in did not set its data directory aside and, started as the
// primary with other stopped, still has the row anotherDatabase wrote.
func (in *instance) keptItsData(other *instance) {
	t := in.c.t
	t.Helper()
	if aside, _ := filepath.Glob(in.pgdata + ".*-*"); len(aside) > 0 {
		t.Errorf("%s's data directory was set aside: %v", in.pod, aside)
	}
	in.kill9()
	other.kill9()
	in.c.setLease(in.pod, true)
	in.start()
	in.waitRole(agentapi.RolePrimary, 0, upTimeout)
	in.waitCount("keep", 1, 30*time.Second)
}

// A postmaster that dies (kill -9, the agent alive) is restarted by the agent, as the
// same primary, with its data.
func TestCrashedPostmasterIsRestarted(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	before := p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("CREATE TABLE t AS SELECT generate_series(1, 10) AS id")
	pid := p.postmasterPid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, upTimeout, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		if !st.Ready || st.StartedAt == nil || !st.StartedAt.After(*before.StartedAt) || p.postmasterPid() == pid {
			return fmt.Errorf("not restarted yet: %+v", st)
		}
		return nil
	})
	p.waitCount("t", 10, 10*time.Second)
	// While the crash is recent, the status says what happened: a kill it did not
	// ask for, which the kernel's OOM killer is the usual sender of.
	if st, err := p.status(); err != nil || st.RecentCrashes != 1 ||
		!strings.Contains(st.Error, "postgres exited unexpectedly after") || !strings.Contains(st.Error, "killed by signal 9") {
		t.Errorf("status after the crash: %d recent crashes, error %q (%v); want the crash explained", st.RecentCrashes, st.Error, err)
	} else {
		t.Logf("reported: %s", st.Error)
	}
}

// A container restarted after a kill starts a new PID namespace, where the dead
// postmaster's PID soon belongs to another process. PostgreSQL then takes its lock files
// for live ones and refuses to start, for good. The agent, which holds the volume's
// interlock, removes them: here both name a live process that is not postgres, and the
// instance comes back with its data.
func TestStaleLockFilesOfADeadPostmasterAreRemoved(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("CREATE TABLE t AS SELECT generate_series(1, 10) AS id")
	p.kill9()
	pidFile := filepath.Join(p.dir, "pgdata", "postmaster.pid")
	content, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("a killed postmaster leaves its postmaster.pid: %v", err)
	}
	// A live process of postgres's OS user that is neither postgres nor its ancestor:
	// PostgreSQL takes a lock naming its own, its parent's or its grandparent's PID, or
	// another user's process, for stale.
	other := exec.Command("sleep", "300")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	live := strconv.Itoa(other.Process.Pid)
	_, rest, _ := strings.Cut(string(content), "\n")
	if err := os.WriteFile(pidFile, []byte(live+"\n"+rest), 0o600); err != nil {
		t.Fatal(err)
	}
	socketLock := filepath.Join(p.dir, "run", ".s.PGSQL.5432.lock")
	if err := os.WriteFile(socketLock, []byte(live+"\n"+filepath.Join(p.dir, "pgdata")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.waitCount("t", 10, 10*time.Second)
}

// The Lease names an instance whose volume is empty in a cluster that was bootstrapped
// before: the agent refuses to initdb (which would start an empty database in place of
// the lost one) and says why.
func TestLostVolumeOnThePrimaryIsNotReinitialised(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	c.setLease(c.instances[0].pod, true)
	p := c.instances[0]
	p.start()
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		if !strings.Contains(st.Error, "refusing to initialise a new, empty database") {
			return fmt.Errorf("status error %q", st.Error)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(p.dir, "pgdata", "PG_VERSION")); err == nil {
		t.Error("initdb ran anyway")
	}
}

// Bad input gives a clear error and never touches data: missing Secrets and a broken
// configuration stop the agent with a message; an unreachable primary at clone time is
// retried without leaving a half-made data directory; a directory that is not a
// PostgreSQL data directory is left alone.
func TestBadInput(t *testing.T) {
	t.Parallel()
	t.Run("missing secret", func(t *testing.T) {
		c := newCluster(t, 1)
		if err := os.Remove(filepath.Join(c.dir, "secrets", "replication", "password")); err != nil {
			t.Fatal(err)
		}
		p := c.instances[0]
		p.start()
		waitExit(t, p, "reading the replication credentials")
	})
	t.Run("corrupt configuration", func(t *testing.T) {
		c := newCluster(t, 1)
		mustWrite(t, filepath.Join(c.dir, "config.json"), []byte(`{"clusterName": "x", `))
		p := c.instances[0]
		p.start()
		waitExit(t, p, "is not valid JSON")
	})
	t.Run("unreachable primary at clone time", func(t *testing.T) {
		c := newCluster(t, 2)
		r := c.instances[1] // the primary c.instances[0] is never started
		r.start()
		testutil.Eventually(t, 30*time.Second, func() error {
			st, err := r.status()
			if err != nil {
				return err
			}
			if !strings.Contains(st.Error, "cloning from "+c.instances[0].pod) {
				return fmt.Errorf("status error %q", st.Error)
			}
			return nil
		})
		for _, d := range []string{"pgdata", "pgdata.clone"} {
			if _, err := os.Stat(filepath.Join(r.dir, d)); err == nil {
				t.Errorf("%s exists after failed clones", d)
			}
		}
		// Once the primary is up, the replica's retries succeed.
		c.instances[0].start()
		r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	})
	t.Run("foreign files in the data directory", func(t *testing.T) {
		c := newCluster(t, 1)
		p := c.instances[0]
		mustMkdir(t, filepath.Join(p.dir, "pgdata"), 0o700)
		mustWrite(t, filepath.Join(p.dir, "pgdata", "precious.txt"), []byte("user data"))
		chownR(t, p.dir)
		p.start()
		testutil.Eventually(t, 30*time.Second, func() error {
			st, err := p.status()
			if err != nil {
				return err
			}
			if !strings.Contains(st.Error, "holds no PostgreSQL data directory") {
				return fmt.Errorf("status error %q", st.Error)
			}
			return nil
		})
		if b, err := os.ReadFile(filepath.Join(p.dir, "pgdata", "precious.txt")); err != nil || string(b) != "user data" {
			t.Errorf("the foreign file was touched: %v %q", err, b)
		}
	})
}

// waitExit waits for the agent to exit with an error that contains want.
func waitExit(t *testing.T, in *instance, want string) {
	t.Helper()
	select {
	case <-in.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit")
	}
	if in.cmd.ProcessState.ExitCode() == 0 {
		t.Errorf("the agent exited 0")
	}
	if !strings.Contains(in.log.String(), want) {
		t.Errorf("the agent's output does not say %q:\n%s", want, in.log.String())
	}
}

// Fence stops a primary at once, and it stays down while the Lease still names it; once
// the Lease names another instance it rejoins as that one's replica. Demote does the
// same after a clean shutdown, with every write on the replica first.
func TestFenceAndDemote(t *testing.T) {
	t.Parallel()
	for _, action := range []string{"fence", "demote"} {
		t.Run(action, func(t *testing.T) {
			c := newCluster(t, 2)
			c.startAll()
			p, r := c.instances[0], c.instances[1]
			p.mustExec("CREATE TABLE t AS SELECT generate_series(1, 1000) AS id")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			call := p.api().Fence
			if action == "demote" {
				call = p.api().Demote
			}
			st, err := call(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// A demote answers once the Lease records the clean release: postgres has
			// written its shutdown checkpoint and may still be exiting.
			if st.Role != agentapi.RoleFenced || st.Running && action == "fence" {
				t.Errorf("after %s: %+v", action, st)
			}
			if err := p.exec("INSERT INTO t VALUES (0)"); err == nil {
				t.Errorf("a write succeeded after %s", action)
			}
			if action == "demote" {
				// A clean shutdown sent every WAL record to the replica.
				r.waitCount("t", 1000, 10*time.Second)
				testutil.Eventually(t, 10*time.Second, func() error {
					if st, err := p.status(); err != nil || st.Running {
						return fmt.Errorf("postgres still runs after the demote (%v)", err)
					}
					return nil
				})
			}
			time.Sleep(2 * time.Second) // the agent's loop runs every second: it must not restart it
			if st, _ := p.status(); st.Running {
				t.Errorf("a fenced primary was restarted while the Lease still names it")
			}
			c.setLease(r.pod, true)
			if _, err := r.api().Promote(ctx); err != nil {
				t.Fatal(err)
			}
			r.waitRole(agentapi.RolePrimary, 2, 30*time.Second)
			p.waitRole(agentapi.RoleReplica, 2, upTimeout)
		})
	}
}

// Passwords follow the Secrets: a changed password takes effect at the next start.
func TestPasswordRotation(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.stop()
	c.creds.App.Password = "rotated-" + c.name
	mustWrite(t, filepath.Join(c.dir, "secrets", "app", "password"), []byte(c.creds.App.Password))
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("SELECT 1")
	if !strings.Contains(p.log.String(), `"roles":["app"]`) {
		t.Errorf("the agent did not report setting the app password")
	}
	if strings.Contains(p.log.String(), c.creds.App.Password) {
		t.Errorf("the password appears in the agent's output")
	}
}

// A replica that is down while the primary writes a lot catches up when it comes back:
// its slot kept the WAL it needs.
func TestFarBehindReplicaCatchesUp(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	r.kill9()
	// About 150 MB of WAL: several segments past any checkpoint while it is away.
	p.mustExec("CREATE TABLE big AS SELECT g AS id, repeat('x', 500) AS pad FROM generate_series(1, 200000) g")
	p.mustExec("UPDATE big SET pad = repeat('y', 500)")
	if err := p.exec("CHECKPOINT"); err == nil {
		t.Fatal("the application owner may CHECKPOINT") // only superusers may; keeps the test honest about who connects
	}
	st := p.mustStatus()
	r.start()
	r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	r.waitCount("big", 200000, 2*time.Minute)
	testutil.Eventually(t, time.Minute, func() error {
		rs, err := r.status()
		if err != nil {
			return err
		}
		got, err1 := agentapi.ParseLSN(rs.ReplayedLSN)
		want, err2 := agentapi.ParseLSN(st.WriteLSN)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("replayed %s, primary was at %s", rs.ReplayedLSN, st.WriteLSN)
		}
		return nil
	})
}

// A standby whose primary no longer has the WAL it needs (its slot gone, the segments
// checkpointed away, no archive) is cloned again by its agent and catches up, instead
// of staying a replica whose WAL receiver fails forever. The data directory it
// replaces is not deleted (it used to be, the moment the clone was complete): it is set
// aside on the volume, reported, superseded once the new clone streams, and removed
// only when the volume needs the space (issue 12).
func TestStandbyWhoseWALIsGoneIsClonedAgain(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	p, r := c.instances[0], c.instances[1]
	vol := r.onVolume(1 << 30)
	c.startAll()
	stoppedAt := r.mustStatus().Position
	r.kill9()
	p.mustExec("CREATE TABLE big AS SELECT g AS id, repeat('x', 500) AS pad FROM generate_series(1, 100000) g")
	// Until the segment the standby stopped in is gone from pg_wal: its slot is active
	// until the primary's walsender notices the standby is gone, and the primary's agent
	// makes it again (reserving WAL) within seconds whenever it finds it missing, which
	// under load could be before the writes above.
	testutil.Eventually(t, time.Minute, func() error {
		if err := p.superExec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active"); err != nil {
			return err
		}
		for range 3 {
			if err := p.superExec("SELECT pg_switch_wal()"); err != nil {
				return err
			}
			if err := p.superExec("CHECKPOINT"); err != nil {
				return err
			}
		}
		return p.superExec(fmt.Sprintf(`DO $$ BEGIN IF EXISTS (SELECT FROM pg_ls_waldir() WHERE name = pg_walfile_name('%s'))
			THEN RAISE EXCEPTION 'the segment of %s is still in pg_wal'; END IF; END $$`, stoppedAt, stoppedAt))
	})
	start := time.Now()
	r.start()
	r.waitCount("big", 100000, 3*time.Minute)
	t.Logf("the standby caught up %s after it started again", time.Since(start).Round(time.Second))
	r.waitRole(agentapi.RoleReplica, 1, upTimeout)

	// The replaced data directory is kept and reported, and superseded once the new
	// clone streams.
	kept := r.waitSupersededAside()
	if !strings.Contains(kept.Reason, "no longer has the WAL") || kept.Bytes == 0 {
		t.Errorf("the set-aside directory is reported as %+v; want its reason and size", kept)
	}
	if _, err := os.Stat(filepath.Join(vol, kept.Name, "PG_VERSION")); err != nil {
		t.Errorf("the set-aside data directory is not on the volume: %v", err)
	}

	// The volume needs the space (less than a fifth free): the superseded directory goes,
	// and the standby keeps streaming.
	var fs syscall.Statfs_t
	if err := syscall.Statfs(vol, &fs); err != nil {
		t.Fatal(err)
	}
	used := int64(fs.Blocks-fs.Bfree) * fs.Bsize
	resizeVolume(t, vol, (used*100/85+4095)/4096*4096)
	testutil.Eventually(t, 2*time.Minute, func() error {
		st, err := r.status()
		if err != nil {
			return err
		}
		if len(st.SetAside) != 0 {
			return fmt.Errorf("set aside: %+v; want it removed", st.SetAside)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(vol, kept.Name)); !os.IsNotExist(err) {
		t.Errorf("the superseded directory is still on the full volume: %v", err)
	}
	p.mustExec("INSERT INTO big VALUES (0, 'after')")
	r.waitCount("big", 100001, 30*time.Second)
}

// tryWrite commits one row on in within timeout: an error when the commit is not
// acknowledged in time (the connection is closed, never cancelled).
func (in *instance) tryWrite(timeout time.Duration, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// A primary that can confirm its Lease neither through the API server nor through every
// other instance stops acknowledging commits T after its last confirmation, by itself
// and without stopping postgres; it serves again, the same postmaster, once the API
// server answers and the Lease still names it. Reaching one peer of two is not enough
// (it used to be: such a primary kept serving forever).
func TestUnconfirmedPrimaryStopsAcknowledging(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		kills int
	}{{"cut off from everything", 2}, {"reaching one peer of two", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3)
			c.startAll()
			p := c.instances[0]
			p.mustExec("CREATE TABLE t (id int)")
			pid := p.postmasterPid()
			p.proxy.setCut(true)
			for _, r := range c.instances[3-tc.kills:] {
				r.kill9()
			}
			cutAt := time.Now()
			var lastOK time.Time
			testutil.Eventually(t, 3*primarylease.Duration, func() error {
				if err := p.tryWrite(time.Second, "INSERT INTO t VALUES (1)"); err == nil {
					lastOK = time.Now()
					return errors.New("the primary still acknowledges commits")
				}
				// A write can also fail for being slow under load: it counts only once
				// the agent says it withholds acknowledgements.
				if st, err := p.status(); err != nil || st.Gate != agentapi.GateWithholding {
					return fmt.Errorf("a write failed, but the commit gate is %q (%v)", st.Gate, err)
				}
				return nil
			})
			t.Logf("the unconfirmed primary stopped acknowledging commits %s after it was cut off (last acknowledged at %s)",
				time.Since(cutAt).Round(100*time.Millisecond), lastOK.Sub(cutAt).Round(100*time.Millisecond))
			if !lastOK.IsZero() && lastOK.Sub(cutAt) > primarylease.Duration+time.Second {
				t.Errorf("a commit was acknowledged %s after the cut, more than T = %s", lastOK.Sub(cutAt), primarylease.Duration)
			}
			st, err := p.status()
			if err != nil || st.Gate != agentapi.GateWithholding || st.Confirmation == nil || st.Confirmation.Valid || st.Ready {
				t.Errorf("status while unconfirmed: %+v %v", st, err)
			}
			p.proxy.setCut(false)
			p.waitRole(agentapi.RolePrimary, 1, 30*time.Second)
			// Clients are let in again once the next renewal confirms the Lease, within a
			// second or two: until then a new session is refused (the lockout).
			testutil.Eventually(t, 10*time.Second, func() error {
				return p.tryWrite(5*time.Second, "INSERT INTO t VALUES (2)")
			})
			if now := p.postmasterPid(); now != pid {
				t.Errorf("postgres was restarted (pid %d, then %d): a pause needs no restart", pid, now)
			}
		})
	}
}

// A primary that loses only the API server, while every other instance follows it,
// keeps serving (failsafe): they confirm it, and without the API server no failover
// can happen behind its back.
func TestPrimaryWithoutAPIServerButPeersKeepsServing(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE t (id int)")
	p.proxy.setCut(true)
	until := time.Now().Add(3 * primarylease.Duration)
	n := 0
	for time.Now().Before(until) {
		// A withheld commit hangs: 10 s tells it from a write slow under load.
		if err := p.tryWrite(10*time.Second, "INSERT INTO t VALUES ($1)", n); err != nil {
			t.Fatalf("write %d failed %s before the end, with the API server cut off: %v", n, time.Until(until), err)
		}
		n++
		time.Sleep(50 * time.Millisecond)
	}
	p.waitCount("t", int64(n), time.Second)
	st, err := p.status()
	if err != nil || st.Confirmation == nil || st.Confirmation.Via != "peers" {
		t.Errorf("status: %+v %v; want confirmed via peers", st.Confirmation, err)
	}
}

// In synchronous mode no acknowledged write is lost when the primary dies: a writer
// commits one row at a time while the primary is killed three times, each time the
// replica with the highest received WAL position is promoted (what the failover
// controller does), and every acknowledged row is on the last primary.
func TestSynchronousNoAcknowledgedWriteLost(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	c.setConfig("synchronousReplicas", 1)
	c.startAll()
	primary := c.instances[0]
	primary.mustExec("CREATE TABLE acked (id bigint PRIMARY KEY)")
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := primary.status()
		if err != nil {
			return err
		}
		for _, r := range st.Replicas {
			if r.SyncState != "sync" && r.SyncState != "potential" {
				return fmt.Errorf("replica %s is %s, want sync or potential", r.Name, r.SyncState)
			}
		}
		if len(st.Replicas) != 2 {
			return fmt.Errorf("%d replicas streaming", len(st.Replicas))
		}
		return nil
	})

	var (
		mu      sync.Mutex
		current = primary
	)
	w := testutil.StartWriter(func(context.Context) (*pgx.ConnConfig, error) {
		mu.Lock()
		defer mu.Unlock()
		return current.connConfig()
	}, testutil.WriterOptions{Table: "acked", FirstID: 1, Interval: 5 * time.Millisecond, PerStatementInterval: 100 * time.Millisecond})
	ackedCount := func() int {
		return len(slices.DeleteFunc(w.Attempts(), func(a testutil.Attempt) bool { return !a.Acked() }))
	}

	timeline := int64(1)
	for round := range 3 {
		before := ackedCount()
		testutil.Eventually(t, time.Minute, func() error {
			if n := ackedCount(); n < before+100 {
				return fmt.Errorf("round %d: %d rows acknowledged so far", round, n)
			}
			return nil
		})
		old := current
		old.kill9()
		var best *instance
		var bestLSN uint64
		for _, in := range c.instances {
			if in == old {
				continue
			}
			st := in.mustStatus()
			lsn, err := agentapi.ParseLSN(st.ReceivedLSN)
			if err != nil {
				t.Fatalf("%s received %q: %v", in.pod, st.ReceivedLSN, err)
			}
			if best == nil || lsn > bestLSN {
				best, bestLSN = in, lsn
			}
		}
		c.setLease(best.pod, true)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := best.api().Promote(ctx); err != nil {
			cancel()
			t.Fatalf("round %d: promote %s: %v", round, best.pod, err)
		}
		cancel()
		timeline++
		best.waitRole(agentapi.RolePrimary, timeline, 30*time.Second)
		mu.Lock()
		current = best
		mu.Unlock()
		old.start()
		old.waitRole(agentapi.RoleReplica, timeline, upTimeout)
	}
	attempts := w.Stop()
	check := current.checkAcked(attempts)
	t.Logf("%d rows acknowledged over 3 primary kills, %d writes failed (unacknowledged), %d acknowledged rows lost",
		check.Acked, check.Attempted-check.Acked, len(check.Lost))
	if len(check.Lost) > 0 {
		t.Errorf("acknowledged rows lost: %v", check.Lost)
	}
}

// A changed cluster configuration (the ConfigMap, updated in place by the kubelet) is
// applied without a restart: parameters and synchronous replication.
func TestConfigurationReload(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	before := c.startAll()
	p, r := c.instances[0], c.instances[1]
	c.setConfig("parameters", map[string]string{"work_mem": "12MB"})
	c.setConfig("synchronousReplicas", 1)
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		if len(st.Replicas) != 1 || st.Replicas[0].SyncState != "sync" {
			return fmt.Errorf("replicas %+v, want %s sync", st.Replicas, r.pod)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := p.conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var workMem string
	if err := conn.QueryRow(ctx, "SHOW work_mem").Scan(&workMem); err != nil || workMem != "12MB" {
		t.Errorf("work_mem = %q (%v), want 12MB", workMem, err)
	}
	if st := p.mustStatus(); st.StartedAt == nil || !st.StartedAt.Equal(*before.StartedAt) {
		t.Error("postgres was restarted to apply the change")
	}
}

// A parameter value postgres refuses gives an error that names it, and a retry; fixing
// the configuration lets the instance start, with its data.
func TestBadParameterIsReportedAndRetried(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("CREATE TABLE t AS SELECT 1 AS id")
	p.stop()
	c.setConfig("parameters", map[string]string{"shared_buffers": "banana"})
	p.start()
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		if !strings.Contains(st.Error, `shared_buffers`) || !strings.Contains(st.Error, "banana") {
			return fmt.Errorf("status error %q does not name the bad parameter", st.Error)
		}
		return nil
	})
	c.setConfig("parameters", map[string]string{"shared_buffers": "32MB"})
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.waitCount("t", 1, 10*time.Second)
}

// Scaling down drops the primary's slot for the departed instance, so WAL does not pile
// up for it; slots of the remaining instances stay.
func TestSlotOfDepartedInstanceIsDropped(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	c.startAll()
	p := c.instances[0]
	c.instances[2].stop()
	c.setConfig("replicas", 2)
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		var names []string
		for _, s := range st.Slots {
			names = append(names, s.Name)
		}
		want := []string{SlotFor(c.instances[1].pod)}
		if fmt.Sprint(names) != fmt.Sprint(want) {
			return fmt.Errorf("slots %v, want %v", names, want)
		}
		return nil
	})
}

// A replica that stays away cannot fill the primary's volume with the WAL its slot keeps:
// past a quarter of the volume (max_slot_wal_keep_size), PostgreSQL invalidates the slot
// and removes the WAL, the primary keeps serving, and the replica, when it returns, is
// cloned again and catches up. Without the bound the slot kept every segment and the
// primary's volume filled up (issue 12).
func TestAbsentReplicasSlotCannotFillThePrimarysVolume(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	p, r := c.instances[0], c.instances[1]
	const volume = 640 << 20
	p.onVolume(volume)
	c.startAll()
	r.kill9()
	p.mustExec("CREATE TABLE w (id int)")
	// 40 segments of 16 MiB: the whole volume, were they all kept.
	for i := range 40 {
		p.mustExec("INSERT INTO w VALUES ($1)", i)
		if err := p.superExec("SELECT pg_switch_wal()"); err != nil {
			t.Fatalf("segment %d: %v", i, err)
		}
		if i%4 == 3 {
			if err := p.superExec("CHECKPOINT"); err != nil {
				t.Fatalf("checkpoint after segment %d: %v", i, err)
			}
		}
	}
	walBytes := dirSize(t, filepath.Join(p.pgdata, "pg_wal"))
	t.Logf("the primary's pg_wal holds %d MiB of a %d MiB volume", walBytes>>20, volume>>20)
	if walBytes > volume/2 {
		t.Errorf("the absent replica's slot keeps %d MiB of WAL on a %d MiB volume; want at most a quarter, and some room for the rest", walBytes>>20, volume>>20)
	}
	p.mustExec("INSERT INTO w VALUES (100)")
	// The replica returns: cloned again, it catches up.
	r.start()
	r.waitCount("w", 41, 3*time.Minute)
	r.waitRole(agentapi.RoleReplica, 1, upTimeout)
}

// A replica away for longer than idleSlotTimeout keeps no WAL on the primary, however
// much room the volume has: its slot holds WAL until then, is released after, and the
// segment the replica needs goes with the next checkpoint. Back, the replica catches up
// (cloned again here: there is no archive).
func TestIdleSlotIsReleasedAfterTheTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 20 * time.Second
	c := newCluster(t, 2)
	c.setConfig("idleSlotTimeout", timeout.String())
	p, r := c.instances[0], c.instances[1]
	c.startAll()
	p.mustExec("CREATE TABLE w (id int)")
	p.mustExec("INSERT INTO w VALUES (0)")
	r.waitCount("w", 1, upTimeout)
	st := r.mustStatus()
	needed := p.walFileName(st.Position)
	r.kill9()
	gone := time.Now()
	slot := SlotFor(r.pod)
	writeSegments := func(from, n int) {
		for i := from; i < from+n; i++ {
			p.mustExec("INSERT INTO w VALUES ($1)", i)
			if err := p.superExec("SELECT pg_switch_wal()"); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.superExec("CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() bool {
		_, err := os.Stat(filepath.Join(p.pgdata, "pg_wal", needed))
		return err == nil
	}
	released := func() bool {
		st := p.mustStatus()
		i := slices.IndexFunc(st.Slots, func(s agentapi.SlotStatus) bool { return s.Name == slot })
		return i >= 0 && st.Slots[i].Released
	}
	writeSegments(1, 4)
	// Looked at in this order, a slot not released after the look at pg_wal was not
	// released during it. (Under load, writing the segments may take longer than
	// idleSlotTimeout: then the slot may be released by now, and the segment gone.)
	if !kept() && !released() {
		t.Fatalf("the primary removed %s, which the absent replica needs, while its slot was not released", needed)
	}
	deadline := time.Now().Add(timeout + time.Minute)
	for !released() {
		if time.Now().After(deadline) {
			t.Fatalf("the slot %s of an instance away for %s is not released (idleSlotTimeout %s)", slot, time.Since(gone).Round(time.Second), timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if away := time.Since(gone); away < timeout {
		t.Fatalf("the slot %s was released after %s, before idleSlotTimeout (%s)", slot, away.Round(time.Second), timeout)
	}
	t.Logf("slot %s released %s after its instance went away", slot, time.Since(gone).Round(time.Second))
	writeSegments(5, 4)
	if kept() {
		t.Errorf("the primary still keeps %s for a replica away for longer than idleSlotTimeout", needed)
	}
	r.start()
	r.waitCount("w", 9, 3*time.Minute)
	r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	// Its slot holds WAL for it again from its first reply.
	var last agentapi.SlotStatus
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if st, err := p.status(); err == nil {
			if i := slices.IndexFunc(st.Slots, func(s agentapi.SlotStatus) bool { return s.Name == slot }); i >= 0 {
				if last = st.Slots[i]; last.Active && !last.Released {
					return
				}
			}
		}
	}
	t.Errorf("the returned replica does not stream through its slot, holding WAL: %+v", last)
}

// walFileName is the name of the WAL segment holding lsn on this instance's timeline.
func (in *instance) walFileName(lsn string) string {
	in.c.t.Helper()
	var name string
	in.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_walfile_name($1::pg_lsn)", lsn).Scan(&name)
	})
	return name
}

// A signal other than SIGTERM or SIGINT sent to the agent by mistake (a reload habit,
// kill -HUP) does not end it: postgres keeps its supervisor and keeps running.
func TestAgentSurvivesStraySignals(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	c.startAll()
	pm := p.postmasterPid()
	for _, s := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2} {
		if err := p.cmd.Process.Signal(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	select {
	case <-p.done:
		t.Fatalf("the agent exited after a stray signal: %v", p.cmd.ProcessState)
	case <-time.After(2 * time.Second):
	}
	if st, err := p.status(); err != nil || st.Role != agentapi.RolePrimary {
		t.Errorf("after stray signals the agent says %+v, %v", st, err)
	}
	if now := p.postmasterPid(); now != pm {
		t.Errorf("postgres was restarted (postmaster %d, then %d)", pm, now)
	}
	if !strings.Contains(p.log.String(), "Ignored a signal") {
		t.Error("the agent did not log the signals it ignored")
	}
}

// SlotFor is the slot name the primary keeps for pod.
func SlotFor(pod string) string { return strings.ReplaceAll("pgpilot_"+pod, "-", "_") }
