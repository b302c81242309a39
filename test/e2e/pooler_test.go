//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// pgbenchBin is PostgreSQL 15's pgbench, which make postgres installs (the tests run on
// the node, in its network namespace, where the Services' cluster IPs are routed).
var pgbenchBin = envOr("E2E_PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")

const (
	// poolerClients is how many pgbench clients write through the pooler while the
	// primary moves, each on one connection, at poolerRate transactions a second in all:
	// a steady load that leaves the node's two cores room for the handover itself.
	poolerClients = 50
	poolerRate    = 500
	// poolerPoolSize is spec.pooler.poolSize: server connections per pooler pod.
	poolerPoolSize = 20
	// manyClients connect to one pooler pod at once.
	manyClients = 500
)

// The pooler's acceptance checks on a real node (docs/pooler.md, "How it will be
// checked"), on a synchronous 3-instance cluster with two PgBouncer pods in transaction
// mode: a pooler setting pgpilot owns is refused by the API server; 500 clients of one
// pooler pod are served by at most poolSize server connections; pgbench's 50 clients
// writing through <cluster>-pooler-rw see no failed transaction during a switchover,
// a rolling restart and a graceful delete of the primary's pod (the longest stall is
// logged); during a crash failover the failed transactions are counted, and the pooler
// serves on the new primary within 30 s.
func TestPooler(t *testing.T) {
	if _, err := os.Stat(pgbenchBin); err != nil {
		t.Fatalf("pgbench (make postgres installs it): %v", err)
	}
	d := newDB(t, 3, func(c *dbv1.PostgresCluster) {
		c.Spec.PostgreSQL.SynchronousReplicas = 1
		c.Spec.Pooler = &dbv1.PoolerSpec{Instances: 2, Mode: "transaction", PoolSize: poolerPoolSize,
			MaxClientConnections: 1000, Parameters: map[string]string{"query_wait_timeout": "60"}}
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range d.poolerPods() {
				logTail(t, p.Namespace, p.Name, "pgbouncer", 80)
			}
		}
	})
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, time.Minute)
	d.waitPooler(2, 5*time.Minute)
	if err := d.exec("rw", "CREATE TABLE pooled (id bigserial PRIMARY KEY, step int NOT NULL, client int NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		t.Fatal(err)
	}

	d.poolerRefusesOwnedSetting()
	d.manyClientsFewServers()

	recovered := func() {
		t.Helper()
		d.waitHealthy(3, 5*time.Minute)
		d.waitStreaming(2, 2*time.Minute)
		d.waitPooler(2, 2*time.Minute)
	}
	planned := []struct {
		name  string
		event func(primary string)
	}{
		{"switchover", func(primary string) {
			target := d.otherThan(primary)
			t.Logf("switchover: from %s to %s", primary, target)
			d.switchover(target)
		}},
		{"rolling restart", func(primary string) {
			uids := map[string]string{}
			for _, p := range d.pods() {
				uids[p.Name] = string(p.UID)
			}
			at := time.Now().UTC().Format(time.RFC3339)
			t.Logf("rolling restart (%s=%s) with %s as the primary", dbv1.AnnotationRestartedAt, at, primary)
			d.update(func(c *dbv1.PostgresCluster) {
				if c.Annotations == nil {
					c.Annotations = map[string]string{}
				}
				c.Annotations[dbv1.AnnotationRestartedAt] = at
			})
			var order []string
			testutil.Eventually(t, 10*time.Minute, func() error {
				return d.rolledOut(uids, &order, func(p corev1.Pod) error {
					if p.Annotations[dbv1.AnnotationRestartedAt] != at {
						return fmt.Errorf("pod %s is not restarted yet", p.Name)
					}
					return nil
				})
			})
			t.Logf("rolling restart: pods restarted in the order %v", order)
		}},
		{"graceful delete of the primary", func(primary string) {
			t.Logf("deleting the primary's pod %s (default grace period)", primary)
			if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: primary}}); err != nil {
				t.Fatal(err)
			}
			d.waitNewPrimary(primary, 2*time.Minute)
		}},
	}
	for i, step := range planned {
		primary := d.cluster().Status.CurrentPrimary
		r := d.benchThroughPooler(step.name, i+1, func() { step.event(primary) })
		if f := r.failures(); f > 0 || r.exit != nil {
			t.Errorf("%s: %d transactions failed through the pooler, want none; pgbench's output:\n%s", step.name, f, r.errors())
		}
		if now := d.cluster().Status.CurrentPrimary; now == primary {
			t.Errorf("%s: %s is still the primary", step.name, now)
		}
		recovered()
	}

	d.crashThroughPooler(len(planned) + 1)
	recovered()
}

// waitPooler waits until status.pooler reports n ready pooler pods and a session
// through <cluster>-pooler-rw runs a query.
func (d *db) waitPooler(n int32, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		if p := d.cluster().Status.Pooler; p == nil || p.ReadyInstances != n {
			return fmt.Errorf("status.pooler %+v, want %d ready", p, n)
		}
		_, err := d.poolerExec("SELECT 1")
		return err
	})
}

// poolerConfig connects as the application owner through <cluster>-pooler-rw by its
// cluster IP, verifying the pooler's certificate by the Service's name. pgx's
// statement cache is off: a transaction pool gives each transaction any server
// connection.
func (d *db) poolerConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	cfg, err := d.connConfig(ctx, "rw")
	if err != nil {
		return nil, err
	}
	service := dbv1.NamesOf(d.name).PoolerReadWrite()
	cfg.Host, err = d.serviceIP(ctx, service)
	if err != nil {
		return nil, err
	}
	if cfg.TLSConfig, err = d.verifyFull(ctx, service+"."+d.ns+".svc"); err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return cfg, nil
}

// poolerExec runs sql through <cluster>-pooler-rw on a new session and returns the
// address of the server PgBouncer ran it on.
func (d *db) poolerExec(sql string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg, err := d.poolerConfig(ctx)
	if err != nil {
		return "", err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return "", err
	}
	var server string
	err = conn.QueryRow(ctx, "SELECT host(inet_server_addr())").Scan(&server)
	return server, err
}

func (d *db) serviceIP(ctx context.Context, name string) (string, error) {
	var s corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: name}, &s); err != nil {
		return "", err
	}
	return s.Spec.ClusterIP, nil
}

// poolerPods are the read-write pool's PgBouncer pods.
func (d *db) poolerPods() []corev1.Pod {
	var pods corev1.PodList
	if err := k8s.List(context.Background(), &pods, client.InNamespace(d.ns),
		client.MatchingLabels{"db.example.com/pooler": d.name, "db.example.com/pool": "rw"}); err != nil {
		d.t.Logf("listing the pooler pods: %v", err)
	}
	return pods.Items
}

// poolerRefusesOwnedSetting applies spec.pooler.parameters {auth_type: trust}: the API
// server refuses it with a message naming auth_type, and the spec stays as it was.
func (d *db) poolerRefusesOwnedSetting() {
	t := d.t
	t.Helper()
	pgc := d.cluster()
	patch := client.MergeFrom(pgc.DeepCopy())
	pgc.Spec.Pooler.Parameters = map[string]string{"query_wait_timeout": "60", "auth_type": "trust"}
	err := k8s.Patch(context.Background(), &pgc, patch)
	switch {
	case err == nil:
		t.Error("spec.pooler.parameters {auth_type: trust} was accepted, want it refused")
	case !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "auth_type"):
		t.Errorf("spec.pooler.parameters {auth_type: trust}: %v, want Invalid naming auth_type", err)
	default:
		t.Logf("bad pooler setting: the API server refused spec.pooler.parameters {auth_type: trust}: %v", err)
	}
	if got := d.cluster().Spec.Pooler.Parameters; got["auth_type"] != "" {
		t.Errorf("spec.pooler.parameters is %v after the refusal", got)
	}
}

// manyClientsFewServers connects manyClients pgbench clients to one pooler pod, each
// inserting rows, and checks that PgBouncer serves them all with at most poolSize
// server connections: what PgBouncer reports (SHOW POOLS, through the pooler agent's
// metrics) and the application owner's sessions on the primary (pg_stat_activity).
func (d *db) manyClientsFewServers() {
	t := d.t
	t.Helper()
	var pod corev1.Pod
	for _, p := range d.poolerPods() {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil && podReady(p) {
			pod = p
		}
	}
	if pod.Name == "" {
		t.Fatal("no ready pooler pod")
	}
	pods := len(d.poolerPods())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := d.conn(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(context.Background())
	metrics, err := d.poolerMetrics(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("many clients: %d pgbench clients to the pooler pod %s (%s), poolSize %d", manyClients, pod.Name, pod.Status.PodIP, poolerPoolSize)
	run := d.startPgbench(pod.Status.PodIP, manyClients, 0, 0, 20*time.Second)
	type sample struct {
		clients, servers  int // PgBouncer's, for the pool app/app
		fromPod, sessions int // the primary's sessions of the app owner: from this pod, in all
	}
	var samples []sample
	for deadline := time.Now().Add(2 * time.Minute); !run.exited() && time.Now().Before(deadline); {
		var s sample
		if s.clients, s.servers, err = metrics(); err != nil {
			t.Logf("many clients: the pooler's metrics: %v", err)
		}
		if err := primary.QueryRow(ctx, `SELECT count(*) FILTER (WHERE client_addr = $1::inet), count(*) FROM pg_stat_activity
			WHERE usename = current_user AND backend_type = 'client backend' AND pid <> pg_backend_pid()`,
			pod.Status.PodIP).Scan(&s.fromPod, &s.sessions); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, s)
		time.Sleep(500 * time.Millisecond)
	}
	r := run.wait()
	var full []sample // the samples with every client connected
	maxServers, maxFromPod, maxSessions, maxClients := 0, 0, 0, 0
	for _, s := range samples {
		maxServers, maxFromPod, maxSessions, maxClients = max(maxServers, s.servers), max(maxFromPod, s.fromPod), max(maxSessions, s.sessions), max(maxClients, s.clients)
		if s.clients >= manyClients {
			full = append(full, s)
		}
	}
	t.Logf("many clients: %d samples, %d with all %d clients connected to %s; PgBouncer's server connections at most %d; "+
		"the app owner's sessions on the primary at most %d from %s, %d in all (%d pooler pods)",
		len(samples), len(full), manyClients, pod.Name, maxServers, maxFromPod, pod.Name, maxSessions, pods)
	t.Logf("many clients: pgbench: %s", r.summary())
	if len(full) == 0 {
		t.Errorf("many clients: PgBouncer never reported %d clients (at most %d)", manyClients, maxClients)
	}
	if maxServers > poolerPoolSize || maxFromPod > poolerPoolSize {
		t.Errorf("many clients: %d server connections in PgBouncer's pool, %d sessions from %s on the primary, want at most poolSize %d",
			maxServers, maxFromPod, pod.Name, poolerPoolSize)
	}
	if maxSessions > poolerPoolSize*pods {
		t.Errorf("many clients: %d sessions of the app owner on the primary, want at most %d (poolSize × %d pooler pods)", maxSessions, poolerPoolSize*pods, pods)
	}
	if r.failures() > 0 || r.processed == 0 || r.exit != nil {
		t.Errorf("many clients: pgbench %s, want every transaction to succeed:\n%s", r.summary(), r.errors())
	}
	d.checkPgbenchRows("many clients", 0, r)
}

// podReady is whether p's Ready condition is true.
func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poolerMetrics returns a function that scrapes pod's pooler agent (GET /metrics with
// the operator's token, verified with the cluster's CA) and returns the clients and the
// server connections of the application owner's pool, as PgBouncer's SHOW POOLS has
// them.
func (d *db) poolerMetrics(ctx context.Context, pod corev1.Pod) (func() (clients, servers int, err error), error) {
	n := dbv1.NamesOf(d.name)
	var token, ca, app corev1.Secret
	for name, s := range map[string]*corev1.Secret{n.AgentTokenSecret(): &token, n.CASecret(): &ca, n.AppSecret(): &app} {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: name}, s); err != nil {
			return nil, err
		}
	}
	httpc := testutil.AgentHTTP(pod.Name+"."+n.PoolerHeadless()+"."+d.ns+".svc", ca.Data["ca.crt"])
	user := string(app.Data["username"])
	return func() (int, int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+pod.Status.PodIP+":8008/metrics", nil)
		if err != nil {
			return 0, 0, err
		}
		req.Header.Set("Authorization", "Bearer "+string(token.Data["token"]))
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("GET /metrics: %s", resp.Status)
		}
		var p expfmt.TextParser
		families, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			return 0, 0, err
		}
		sum := func(family string) int {
			total := 0.0
			if f := families[family]; f != nil {
				for _, m := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if labels["datname"] == "app" && labels["user"] == user {
						total += m.GetGauge().GetValue()
					}
				}
			}
			return int(total)
		}
		return sum("pgpilot_pooler_clients"), sum("pgpilot_pooler_servers"), nil
	}, nil
}

// benchThroughPooler runs poolerClients pgbench clients through <cluster>-pooler-rw,
// runs event once they are writing, lets them write on until an insert through the
// pooler is acknowledged and 5 s more, and logs what pgbench saw: the failed
// transactions, the longest stall (the longest time in which no transaction
// completed) and the longest transaction. Every transaction pgbench counted is in the
// table.
func (d *db) benchThroughPooler(name string, step int, event func()) pgbenchResult {
	t := d.t
	t.Helper()
	ip, err := d.serviceIP(context.Background(), dbv1.NamesOf(d.name).PoolerReadWrite())
	if err != nil {
		t.Fatal(err)
	}
	run := d.startPgbench(ip, poolerClients, poolerRate, step, time.Hour)
	// Every client connected and writing: pgbench's progress reports begin, and a
	// few seconds of them before the event.
	testutil.Eventually(t, time.Minute, func() error {
		if run.exited() {
			r := run.wait()
			t.Fatalf("%s: pgbench ended before the event: %s\n%s", name, r.summary(), r.output)
		}
		if out := run.output(); strings.Count(out, "progress: ") < 3 {
			return fmt.Errorf("%s: pgbench is not writing yet:\n%s", name, out)
		}
		return nil
	})
	from := time.Now()
	event()
	testutil.Eventually(t, time.Minute, func() error {
		_, err := d.poolerExec("SELECT 1")
		return err
	})
	to := time.Now()
	time.Sleep(5 * time.Second)
	r := run.stop()
	d.logPoolerSteps(from, to)
	t.Logf("%s: pgbench through the pooler: %s", name, r.summary())
	d.checkPgbenchRows(name, step, r)
	return r
}

// crashThroughPooler runs the clients while the primary's postmaster is killed each
// time it starts until the cluster fails over (what TestPrimaryFailures does): the
// transactions in flight on the failed primary fail, as they must, and are counted;
// the pooler serves on the new primary within 30 s of the failover.
func (d *db) crashThroughPooler(step int) {
	t := d.t
	t.Helper()
	const name = "crash failover"
	primary := d.cluster().Status.CurrentPrimary
	var (
		killed, moved, served time.Time
		now, newIP            string
	)
	r := d.benchThroughPooler(name, step, func() {
		killed = time.Now()
		// Probes through the pooler from the first kill: when does a new session's
		// insert run on the new primary?
		type probe struct {
			at     time.Time
			server string
		}
		probes := make(chan probe, 4096)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				server, err := d.poolerExec(fmt.Sprintf("INSERT INTO pooled (step, client) VALUES (%d, -1)", step))
				if err == nil {
					probes <- probe{time.Now(), server}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		kills := d.killPostgresUntilFailover(primary, 2*time.Minute)
		moved = time.Now()
		now = d.cluster().Status.CurrentPrimary
		newIP = d.pod(now).Status.PodIP
		t.Logf("%s: postgres of %s killed %d times; %s is the primary %s after the first kill", name, primary, kills, now, moved.Sub(killed).Round(10*time.Millisecond))
		deadline := time.Now().Add(time.Minute)
		for served.IsZero() && time.Now().Before(deadline) {
			select {
			case p := <-probes:
				if p.server == newIP {
					served = p.at
				}
			case <-time.After(time.Second):
			}
		}
		close(stop)
		<-done
	})
	t.Logf("%s: pgbench's clients aborted at: %s", name, r.abortReasons())
	if r.exit != nil && len(r.aborted) == 0 {
		t.Errorf("%s: pgbench failed:\n%s", name, r.errors())
	}
	if served.IsZero() {
		t.Errorf("%s: %d transactions failed; no insert through the pooler ran on the new primary %s (%s) within a minute of the failover",
			name, r.failures(), now, newIP)
		return
	}
	t.Logf("%s: %d transactions failed (%d clients aborted at an error, %d failed); the pooler served on the new primary %s %s after the failover, %s after the first kill",
		name, r.failures(), len(r.aborted), r.failed, now, served.Sub(moved).Round(10*time.Millisecond), served.Sub(killed).Round(10*time.Millisecond))
	if took := served.Sub(moved); took > 30*time.Second {
		t.Errorf("%s: the pooler served on the new primary %s after the failover, want within 30 s", name, took.Round(10*time.Millisecond))
	}
}

// logPoolerSteps logs what the pooler agents did between from and to: their pauses,
// holds, moves and resumptions.
func (d *db) logPoolerSteps(from, to time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	since := metav1.NewTime(from.Add(-time.Second))
	for _, p := range d.poolerPods() {
		b, err := clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "pgbouncer", SinceTime: &since}).DoRaw(ctx)
		if err != nil {
			d.t.Logf("  log of %s: %v", p.Name, err)
			continue
		}
		var lines []string
		for _, line := range strings.Split(string(b), "\n") {
			for _, what := range []string{"Paused the pool", "Pointed the pool", "Resumed the pool", "Holding clients", "Could not follow"} {
				if strings.Contains(line, what) {
					lines = append(lines, "    "+line)
					break
				}
			}
		}
		d.t.Logf("  the pooler agent %s from %s to %s:\n%s", p.Name, from.UTC().Format("15:04:05.000"),
			to.Add(5*time.Second).UTC().Format("15:04:05.000"), strings.Join(lines, "\n"))
	}
}

// checkPgbenchRows checks that every transaction pgbench counted for step is a row of
// the table: none acknowledged and lost. Failed transactions may have committed.
func (d *db) checkPgbenchRows(name string, step int, r pgbenchResult) {
	d.t.Helper()
	var rows int64
	testutil.Eventually(d.t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := d.conn(ctx, "rw")
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.QueryRow(ctx, "SELECT count(*) FROM pooled WHERE step = $1 AND client >= 0", step).Scan(&rows)
	})
	switch {
	case rows < r.processed:
		d.t.Errorf("%s: %d rows of pgbench's in the table, but it counted %d transactions: acknowledged writes lost", name, rows, r.processed)
	case rows > r.processed+r.failures():
		d.t.Errorf("%s: %d rows of pgbench's in the table, more than its %d transactions and %d failures", name, rows, r.processed, r.failures())
	default:
		d.t.Logf("%s: %d rows of pgbench's in the table, %d transactions counted", name, rows, r.processed)
	}
}

// pgbench is a running pgbench.
type pgbench struct {
	t       testing.TB
	cmd     *exec.Cmd
	dir     string
	clients int
	done    chan struct{}
	err     error
}

// pgbenchResult is what a pgbench run reported.
type pgbenchResult struct {
	clients int
	// processed is pgbench's "number of transactions actually processed", failed its
	// "number of failed transactions" (serialization and deadlock failures).
	processed, failed int64
	// aborted are the clients pgbench ended at an error other than those: a broken
	// connection, an error of the pooler. pgbench 15 does not retry them: each lost the
	// transaction it was running and wrote no more.
	aborted []int
	// stall is the longest time in which no transaction completed, at stallAt (its
	// end); longest the longest transaction from its scheduled start (--rate: a client
	// held up starts its next transactions late), longestSent from when it was sent.
	// From the per-transaction logs.
	stall, longest, longestSent time.Duration
	stallAt                     time.Time
	exit                        error
	output                      string
}

// failures are the transactions that failed: pgbench's failed ones and one for each
// client it aborted.
func (r pgbenchResult) failures() int64 { return r.failed + int64(len(r.aborted)) }

func (r pgbenchResult) summary() string {
	exit := "exit 0"
	if r.exit != nil {
		exit = r.exit.Error()
	}
	return fmt.Sprintf("%d clients, %d transactions, %d failed (%d failed, %d clients aborted), longest stall %s (ended %s), "+
		"longest transaction %s from its scheduled start, %s from when it was sent, %s",
		r.clients, r.processed, r.failures(), r.failed, len(r.aborted), r.stall.Round(time.Millisecond),
		r.stallAt.UTC().Format("15:04:05.000"), r.longest.Round(time.Millisecond), r.longestSent.Round(time.Millisecond), exit)
}

// abortReasons counts the errors pgbench aborted clients at, by message.
func (r pgbenchResult) abortReasons() string {
	count := map[string]int{}
	for _, m := range regexp.MustCompile(`client \d+ (?:script \d+ )?aborted[^:]*: (.*)`).FindAllStringSubmatch(r.output, -1) {
		count[strings.TrimSpace(m[1])]++
	}
	var out []string
	for _, why := range slices.Sorted(maps.Keys(count)) {
		out = append(out, fmt.Sprintf("%d× %q", count[why], why))
	}
	return strings.Join(out, ", ")
}

// errors are pgbench's lines other than its progress reports.
func (r pgbenchResult) errors() string {
	var out []string
	for _, line := range strings.Split(r.output, "\n") {
		if !strings.HasPrefix(line, "progress: ") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// startPgbench starts pgbench against host:5432 as the application owner, TLS
// required (sslmode=require), with clients clients over 2 threads, each inserting one
// row of step per transaction in the simple query protocol (a transaction pool does
// not keep prepared statements), at rate transactions a second in all (0: as fast as
// it can), for at most duration, logging every transaction.
func (d *db) startPgbench(host string, clients, rate, step int, duration time.Duration) *pgbench {
	d.t.Helper()
	var secret corev1.Secret
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).AppSecret()}, &secret); err != nil {
		d.t.Fatal(err)
	}
	dir := d.t.TempDir()
	script := filepath.Join(dir, "insert.sql")
	if err := os.WriteFile(script, []byte("INSERT INTO pooled (step, client) VALUES (:step, :client_id);\n"), 0o644); err != nil {
		d.t.Fatal(err)
	}
	args := []string{"--no-vacuum", "--file", script, "--client", strconv.Itoa(clients), "--jobs", "2",
		"--time", strconv.Itoa(int(duration.Seconds())), "--define", "step=" + strconv.Itoa(step),
		"--progress", "1", "--log", "--log-prefix", filepath.Join(dir, "tx")}
	if rate > 0 {
		args = append(args, "--rate", strconv.Itoa(rate))
	}
	out, err := os.Create(filepath.Join(dir, "output"))
	if err != nil {
		d.t.Fatal(err)
	}
	defer out.Close() // pgbench has its own descriptor
	p := &pgbench{t: d.t, dir: dir, clients: clients, done: make(chan struct{})}
	p.cmd = exec.Command(pgbenchBin, args...)
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), "PGHOST="+host, "PGPORT=5432", "PGDATABASE=app", "PGUSER="+string(secret.Data["username"]),
		"PGPASSWORD="+string(secret.Data["password"]), "PGSSLMODE=require", "PGCONNECT_TIMEOUT=10", "PGAPPNAME=pgbench")
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	d.t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// output is what pgbench wrote so far, its report and errors.
func (p *pgbench) output() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "output"))
	return string(b)
}

func (p *pgbench) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the run as its --time would (SIGALRM: the clients end after their
// transaction) and returns what it reported.
func (p *pgbench) stop() pgbenchResult {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGALRM)
	}
	return p.wait()
}

// wait waits for pgbench to end, for at most 90 s (a client may wait for the pooler's
// query_wait_timeout, 60 s) before it is killed, and reads its report and logs.
func (p *pgbench) wait() pgbenchResult {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("pgbench did not end within 90 s; killed")
	}
	r := pgbenchResult{clients: p.clients, exit: p.err, output: p.output()}
	if m := regexp.MustCompile(`number of transactions actually processed: (\d+)`).FindStringSubmatch(r.output); m != nil {
		r.processed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := regexp.MustCompile(`number of failed transactions: (\d+)`).FindStringSubmatch(r.output); m != nil {
		r.failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	for _, m := range regexp.MustCompile(`client (\d+) (?:script \d+ )?aborted`).FindAllStringSubmatch(r.output, -1) {
		c, _ := strconv.Atoi(m[1])
		if !slices.Contains(r.aborted, c) {
			r.aborted = append(r.aborted, c)
		}
	}
	sort.Ints(r.aborted)
	ends, longest, longestSent, err := readPgbenchLogs(p.dir)
	if err != nil {
		p.t.Errorf("pgbench's transaction logs: %v", err)
	}
	r.longest, r.longestSent = longest, longestSent
	for i := 1; i < len(ends); i++ {
		if gap := ends[i].Sub(ends[i-1]); gap > r.stall {
			r.stall, r.stallAt = gap, ends[i]
		}
	}
	return r
}

// readPgbenchLogs reads pgbench's per-transaction logs in dir (tx.<pid> and
// tx.<pid>.<thread>: client_id transaction_no time script_no time_epoch time_us
// [schedule_lag]) and returns when each transaction that did not fail completed, in
// order, and the longest one's time, from its scheduled start and from when it was
// sent (without the schedule lag).
func readPgbenchLogs(dir string) (ends []time.Time, longest, longestSent time.Duration, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "tx.*"))
	if err != nil || len(files) == 0 {
		return nil, 0, 0, fmt.Errorf("no log in %s: %v", dir, err)
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil { // failed or skipped
				continue
			}
			sec, err1 := strconv.ParseInt(fields[4], 10, 64)
			usec, err2 := strconv.ParseInt(fields[5], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			ends = append(ends, time.Unix(sec, usec*1000))
			longest = max(longest, time.Duration(us)*time.Microsecond)
			if len(fields) > 6 {
				if lag, err := strconv.ParseInt(fields[6], 10, 64); err == nil {
					us -= lag
				}
			}
			longestSent = max(longestSent, time.Duration(us)*time.Microsecond)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, 0, 0, err
		}
	}
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	return ends, longest, longestSent, nil
}
