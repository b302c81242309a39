package pg

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// poolerProc is a pooler agent (agent pooler) run as the postgres OS user, with
// PgBouncer as its child: a pooler pod of an operated cluster.
type poolerProc struct {
	port, apiPort int
	cmd           *exec.Cmd
	log           *lockedWriter
	done          chan struct{}
}

// startPooler runs the read-write pool's agent for c, with the certificates the
// operator issued for spec.pooler, and tells c's instances where it is (before they
// start: they are given it at their start).
func startPooler(t *testing.T, c *cluster) *poolerProc {
	t.Helper()
	names := dbv1.NamesOf(c.name)
	dir := poolerDir(t)
	for sub, secret := range map[string]string{"pooler": names.PoolerTLSSecret(), "client": names.PoolerClientTLSSecret()} {
		var s corev1.Secret
		testutil.Eventually(t, time.Minute, func() error {
			return k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: secret}, &s)
		})
		mustMkdir(t, filepath.Join(dir, "tls", sub), 0o755)
		for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
			mustWrite(t, filepath.Join(dir, "tls", sub, k), s.Data[k])
		}
	}
	mustMkdir(t, filepath.Join(dir, "run"), 0o700)
	writeKubeconfig(t, filepath.Join(dir, "kubeconfig"), apiServer)
	chownR(t, dir)
	p := &poolerProc{port: freeTCPPort(t), apiPort: freeTCPPort(t), done: make(chan struct{})}
	p.cmd = exec.Command(agentBin, "pooler", "--pod-name", c.name+"-pooler-rw-0", "--namespace", c.namespace, "--pool", "rw",
		"--config", filepath.Join(c.dir, "config.json"), "--run-dir", filepath.Join(dir, "run"),
		"--port", strconv.Itoa(p.port), "--api-address", "127.0.0.1:"+strconv.Itoa(p.apiPort),
		"--tls", filepath.Join(dir, "tls", "pooler"), "--client-tls", filepath.Join(dir, "tls", "client"),
		// The instances' certificates name pods, and the tests reach them by address:
		// encrypted, not verified.
		"--server-ca", "", "--peers", c.peers(), "--auth", filepath.Join(c.dir, "auth"),
		"--kubeconfig", filepath.Join(dir, "kubeconfig"), "--pgbouncer", PgBouncerBin, "--linger", "0s")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}, Pdeathsig: syscall.SIGKILL}
	p.cmd.Env = append(os.Environ(), "HOME="+dir)
	p.log = syncWriter(&bytes.Buffer{})
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("the pooler agent's log:\n%s", lastBytes(p.log.bytes(), 8000))
		}
	})
	c.poolers = "127.0.0.1:" + strconv.Itoa(p.apiPort)
	return p
}

// clientsResult is what clients writing through a pooler saw.
type clientsResult struct {
	acked  []int64
	failed int
	stall  time.Duration
	errors map[string]int
}

// writeThroughPooler runs n clients, each inserting rows into table on one connection
// through the pooler (TLS, the application's login), ids from base up, until stop is
// closed.
func writeThroughPooler(t *testing.T, c *cluster, p *poolerProc, n int, table string, base int64, stop <-chan struct{}) <-chan clientsResult {
	t.Helper()
	out := make(chan clientsResult, 1)
	results := make(chan clientsResult, n)
	connect := func(ctx context.Context) (*pgx.Conn, error) {
		cc, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=app dbname=app sslmode=require", p.port))
		if err != nil {
			return nil, err
		}
		cc.Password, cc.DefaultQueryExecMode = c.creds.App.Password, pgx.QueryExecModeExec
		return pgx.ConnectConfig(ctx, cc)
	}
	var wg sync.WaitGroup
	for i := range n {
		conn, err := connect(context.Background())
		if err != nil {
			t.Fatalf("client %d through the pooler: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := clientsResult{errors: map[string]int{}}
			defer func() {
				if conn != nil {
					_ = conn.Close(context.Background())
				}
				results <- r
			}()
			for id := base + int64(i)*1_000_000; ; id++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				var err error
				if conn == nil {
					conn, err = connect(ctx)
				}
				if err == nil {
					_, err = conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", id)
				}
				cancel()
				r.stall = max(r.stall, time.Since(start))
				if err != nil {
					r.failed++
					r.errors[err.Error()]++
					if conn != nil && conn.IsClosed() {
						conn = nil
					}
				} else {
					r.acked = append(r.acked, id)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	go func() {
		wg.Wait()
		close(results)
		var all clientsResult
		all.errors = map[string]int{}
		for r := range results {
			all.acked = append(all.acked, r.acked...)
			all.failed += r.failed
			all.stall = max(all.stall, r.stall)
			for e, k := range r.errors {
				all.errors[e] += k
			}
		}
		out <- all
	}()
	return out
}

// The pooler hides a planned move of the primary from its clients: a switchover and
// a deleted primary pod (a drain, a rolling update) are a pause to them, not an error.
// The primary's agent asks the pooler agent to hold their queries before its handover,
// PgBouncer lets the transactions in flight end, and the pooler agent resumes them on
// the new primary once it accepts writes. Every acknowledged row is on the new primary.
func TestPoolerHidesPlannedHandovers(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3, func(pgc *dbv1.PostgresCluster) {
		pgc.Spec.Pooler = &dbv1.PoolerSpec{Instances: 1, Mode: "transaction", PoolSize: 5,
			Parameters: map[string]string{"query_wait_timeout": "60"}}
	})
	p := startPooler(t, c)
	startOperated(t, c)
	testutil.Eventually(t, time.Minute, func() error {
		return c.writeThroughRW("CREATE TABLE IF NOT EXISTS pooled (id bigint PRIMARY KEY)")
	})
	for k, step := range []struct {
		name string
		move func(primary string)
	}{
		{"switchover", func(primary string) {
			target := c.instances[0].pod
			if target == primary {
				target = c.instances[1].pod
			}
			c.annotate(dbv1.AnnotationSwitchoverTo, target)
		}},
		{"primary pod deleted", func(primary string) {
			var pod corev1.Pod
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: primary}, &pod); err != nil {
				t.Fatal(err)
			}
			if err := k8s.Delete(context.Background(), &pod); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		primary := c.holder()
		stop := make(chan struct{})
		results := writeThroughPooler(t, c, p, 10, "pooled", int64(k)*100_000_000, stop)
		time.Sleep(time.Second)
		step.move(primary)
		testutil.Eventually(t, time.Minute, func() error {
			if h := c.holder(); h == "" || h == primary {
				return fmt.Errorf("the Lease names %q", h)
			}
			return nil
		})
		time.Sleep(2 * time.Second)
		close(stop)
		r := <-results
		for e, k := range r.errors {
			t.Logf("%s: %d× %s", step.name, k, e)
		}
		t.Logf("%s: %d statements acknowledged, %d failed, the longest took %s", step.name, len(r.acked), r.failed, r.stall.Round(time.Millisecond))
		if r.failed > 0 {
			t.Errorf("%s: %d statements failed through the pooler, want none", step.name, r.failed)
		}
		if len(r.acked) == 0 {
			t.Fatalf("%s: nothing acknowledged: the clients did not write through the pooler", step.name)
		}
		holder := c.holder()
		var newPrimary *instance
		for _, in := range c.instances {
			if in.pod == holder {
				newPrimary = in
			}
		}
		var onPrimary int64
		if err := newPrimary.onSession(func(ctx context.Context, conn *pgx.Conn) error {
			return conn.QueryRow(ctx, "SELECT count(*) FROM pooled WHERE id = ANY($1)", r.acked).Scan(&onPrimary)
		}); err != nil {
			t.Fatal(err)
		}
		if onPrimary != int64(len(r.acked)) {
			t.Errorf("%s: %d of the %d rows acknowledged through the pooler are on the new primary %s", step.name, onPrimary, len(r.acked), holder)
		}
	}
}
