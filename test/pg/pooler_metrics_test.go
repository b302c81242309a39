package pg

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgpilot/pgpilot/internal/pooler"
	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The pooler's series (docs/monitoring.md, "The pooler") from a real PgBouncer in front
// of a real PostgreSQL: transactions run through it are counted, a client held behind
// the pool's one server connection is a waiting client whose wait grows, the wait and
// the transaction's time are counted in seconds once it ends, and a frozen PgBouncer
// (after the collector's timeout) and a stopped one (at once) are pgpilot_pooler_up 0
// and nothing else.
func TestPoolerMetrics(t *testing.T) {
	t.Parallel()
	dir := poolerDir(t)
	pg := startPlainPostgres(t, filepath.Join(dir, "pg"))
	pg.psql(t, "CREATE ROLE alice LOGIN PASSWORD 'alice-pw'", "CREATE ROLE "+poolerauth.Role+" LOGIN PASSWORD 'pooler-pw'",
		"CREATE TABLE t (id int)", "GRANT ALL ON t TO alice")
	pg.psql(t, poolerauth.SetupSQL()...)

	run := filepath.Join(dir, "pooler")
	cfg := pgbouncer.Config{Server: "127.0.0.1", Port: pg.port, Mode: pgbouncer.Transaction, PoolSize: 1, MaxClients: 100,
		Parameters: map[string]string{"query_wait_timeout": "60"}}
	ini, _ := startPgBouncer(t, run, &cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const timeout = pooler.CollectorTimeout
	reg := prometheus.NewRegistry()
	reg.MustRegister(pooler.NewCollector(func(ctx context.Context) (*pgbouncer.Admin, error) {
		return pgbouncer.Dial(ctx, run, cfg.ListenPort, "pgpilot_admin", "admin-pw")
	}, timeout, testr.New(t)))

	client := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=alice password=alice-pw dbname=postgres sslmode=disable", cfg.ListenPort))
		if err != nil {
			t.Fatal(err)
		}
		c.DefaultQueryExecMode = pgx.QueryExecModeExec // no named statements in transaction mode
		conn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			t.Fatalf("alice through the pooler: %v", err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	one, two := client(), client()

	before := gatherPooler(t, reg)
	if before.get(t, "pgpilot_pooler_up") != 1 {
		t.Fatalf("pgpilot_pooler_up is not 1 on a running PgBouncer: %v", before.keys())
	}
	const statements = 20
	for i := range statements {
		if _, err := one.Exec(ctx, "INSERT INTO t VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	pool := map[string]string{"datname": "postgres", "user": "alice"}
	db := map[string]string{"datname": "postgres"}
	after := gatherPooler(t, reg)
	counted := after.get(t, "pgpilot_pooler_transactions_total", db) - before.get(t, "pgpilot_pooler_transactions_total", db)
	queries := after.get(t, "pgpilot_pooler_queries_total", db) - before.get(t, "pgpilot_pooler_queries_total", db)
	t.Logf("%d statements through the pooler: pgpilot_pooler_transactions_total +%v, pgpilot_pooler_queries_total +%v", statements, counted, queries)
	if counted < statements || queries < statements {
		t.Errorf("%d statements counted as %v transactions and %v queries, want at least %d each", statements, counted, queries, statements)
	}
	for _, name := range []string{"pgpilot_pooler_received_bytes_total", "pgpilot_pooler_sent_bytes_total", "pgpilot_pooler_query_seconds_total"} {
		if after.get(t, name, db) <= before.get(t, name, db) {
			t.Errorf("%s did not grow with %d statements: %v, then %v", name, statements, before.get(t, name, db), after.get(t, name, db))
		}
	}
	if after.get(t, "pgpilot_pooler_pool_mode", pool, map[string]string{"mode": "transaction"}) != 1 {
		t.Error("pgpilot_pooler_pool_mode of alice's pool is not transaction")
	}
	if slices.ContainsFunc(after.keys(), func(k string) bool { return strings.Contains(k, `datname="pgbouncer"`) }) {
		t.Errorf("series of the admin console's pseudo-database: %v", after.keys())
	}

	// one holds the pool's only server connection in a transaction; two's query waits
	// for it.
	tx, err := one.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (-1)"); err != nil {
		t.Fatal(err)
	}
	held := time.Now()
	ran := make(chan error, 1)
	go func() {
		_, err := two.Exec(ctx, "SELECT count(*) FROM t")
		ran <- err
	}()
	const hold = 1500 * time.Millisecond
	time.Sleep(hold)
	waiting := gatherPooler(t, reg)
	maxWait := waiting.get(t, "pgpilot_pooler_client_max_wait_seconds", pool)
	t.Logf("a client held %s behind the pool's one server connection: pgpilot_pooler_clients waiting %v, active %v, client_max_wait_seconds %v, servers active %v",
		time.Since(held).Round(time.Millisecond), waiting.get(t, "pgpilot_pooler_clients", pool, map[string]string{"state": "waiting"}),
		waiting.get(t, "pgpilot_pooler_clients", pool, map[string]string{"state": "active"}), maxWait,
		waiting.get(t, "pgpilot_pooler_servers", pool, map[string]string{"state": "active"}))
	if got := waiting.get(t, "pgpilot_pooler_clients", pool, map[string]string{"state": "waiting"}); got != 1 {
		t.Errorf("pgpilot_pooler_clients waiting %v, want 1", got)
	}
	if got := waiting.get(t, "pgpilot_pooler_servers", pool, map[string]string{"state": "active"}); got != 1 {
		t.Errorf("pgpilot_pooler_servers active %v, want 1 (the pool's one, in one's transaction)", got)
	}
	if maxWait < (hold-200*time.Millisecond).Seconds() || maxWait > time.Since(held).Seconds() {
		t.Errorf("pgpilot_pooler_client_max_wait_seconds %v after a client waited %s", maxWait, time.Since(held))
	}
	if got := waiting.get(t, "pgpilot_pooler_client_slots", map[string]string{"state": "used"}); got < 3 {
		t.Errorf("pgpilot_pooler_client_slots used %v, want at least 3 (two clients and the scrape)", got)
	}
	if got := waiting.get(t, "pgpilot_pooler_server_slots", map[string]string{"state": "used"}); got < 1 {
		t.Errorf("pgpilot_pooler_server_slots used %v, want at least 1", got)
	}
	if got := waiting.get(t, "pgpilot_pooler_pools"); got < 2 {
		t.Errorf("pgpilot_pooler_pools %v, want at least alice's and the admin console's", got)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("the waiting query: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting query did not run 10 s after the transaction ended")
	}
	waited := time.Since(held)
	done := gatherPooler(t, reg)
	if got := done.get(t, "pgpilot_pooler_clients", pool, map[string]string{"state": "waiting"}); got != 0 {
		t.Errorf("pgpilot_pooler_clients waiting %v once the transaction ended, want 0", got)
	}
	if got := done.get(t, "pgpilot_pooler_client_max_wait_seconds", pool); got != 0 {
		t.Errorf("pgpilot_pooler_client_max_wait_seconds %v with no client waiting, want 0", got)
	}
	wait := done.get(t, "pgpilot_pooler_wait_seconds_total", db) - after.get(t, "pgpilot_pooler_wait_seconds_total", db)
	xact := done.get(t, "pgpilot_pooler_transaction_seconds_total", db) - after.get(t, "pgpilot_pooler_transaction_seconds_total", db)
	query := done.get(t, "pgpilot_pooler_query_seconds_total", db) - after.get(t, "pgpilot_pooler_query_seconds_total", db)
	t.Logf("the client's wait and the transaction ended: pgpilot_pooler_wait_seconds_total +%.3f, pgpilot_pooler_transaction_seconds_total +%.3f, pgpilot_pooler_query_seconds_total +%.3f",
		wait, xact, query)
	if wait < hold.Seconds()-0.2 || wait > waited.Seconds()+0.2 {
		t.Errorf("pgpilot_pooler_wait_seconds_total grew by %.3f after a client waited about %s", wait, hold)
	}
	if xact < hold.Seconds()-0.2 {
		t.Errorf("pgpilot_pooler_transaction_seconds_total grew by %.3f after a transaction of more than %s", xact, hold)
	}
	// PgBouncer counts a query's time from when the client sent it (docs/monitoring.md):
	// the waiting client's query took its wait.
	if query < hold.Seconds()-0.2 {
		t.Errorf("pgpilot_pooler_query_seconds_total grew by %.3f after a query that waited %s", query, hold)
	}

	// PgBouncer frozen (SIGSTOP): its socket takes the connection and nothing answers;
	// the scrape gives up at the timeout, up 0.
	pid := pgBouncerPid(t, ini)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	frozen := gatherPooler(t, reg)
	took := time.Since(start)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("PgBouncer frozen: the scrape took %s and served %v", took.Round(time.Millisecond), frozen.keys())
	if got := frozen.get(t, "pgpilot_pooler_up"); got != 0 || len(frozen.metricFamilies) != 1 {
		t.Errorf("with PgBouncer frozen: %v, want pgpilot_pooler_up 0 alone", frozen.keys())
	}
	if took < timeout-100*time.Millisecond || took > timeout+time.Second {
		t.Errorf("a scrape of a frozen PgBouncer took %s, want about the collector's timeout %s", took, timeout)
	}
	if got := gatherPooler(t, reg).get(t, "pgpilot_pooler_up"); got != 1 {
		t.Errorf("pgpilot_pooler_up %v once PgBouncer runs again, want 1", got)
	}

	// PgBouncer stopped: up 0, nothing else, and at once.
	sh := exec.Command(filepath.Join(PGBin, "psql"), "-X", "-h", run, "-p", strconv.Itoa(cfg.ListenPort), "-U", "pgpilot_admin", "-d", "pgbouncer", "-c", "SHUTDOWN")
	sh.Env = append(os.Environ(), "PGPASSWORD=admin-pw")
	_ = sh.Run() // PgBouncer exits without answering
	testutil.Eventually(t, 10*time.Second, func() error {
		a, err := pgbouncer.Dial(ctx, run, cfg.ListenPort, "pgpilot_admin", "admin-pw")
		if err == nil {
			_ = a.Close(ctx)
			return errors.New("PgBouncer's admin console still answers after SHUTDOWN")
		}
		return nil
	})
	start = time.Now()
	down := gatherPooler(t, reg)
	took = time.Since(start)
	t.Logf("PgBouncer stopped: the scrape took %s and served %v", took.Round(time.Millisecond), down.keys())
	if got := down.get(t, "pgpilot_pooler_up"); got != 0 || len(down.metricFamilies) != 1 {
		t.Errorf("with PgBouncer stopped: %v, want pgpilot_pooler_up 0 alone", down.keys())
	}
	if took > time.Second {
		t.Errorf("a scrape of a stopped PgBouncer took %s", took)
	}
}

// pgBouncerPid is the process of the PgBouncer started with the configuration file ini.
func pgBouncerPid(t *testing.T, ini string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"); len(args) == 2 && args[0] == PgBouncerBin && args[1] == ini {
			return pid
		}
	}
	t.Fatalf("no process %s %s", PgBouncerBin, ini)
	return 0
}

// poolerSeries is one gather of the pooler's collector.
type poolerSeries struct{ metricFamilies }

func gatherPooler(t *testing.T, reg *prometheus.Registry) poolerSeries {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering the pooler's series: %v", err)
	}
	m := metricFamilies{}
	for _, f := range families {
		m[f.GetName()] = f
	}
	return poolerSeries{m}
}

// get is the sample of name whose labels include those of every map in labels; one
// not served fails the test.
func (s poolerSeries) get(t *testing.T, name string, labels ...map[string]string) float64 {
	t.Helper()
	want := map[string]string{}
	for _, l := range labels {
		maps.Copy(want, l)
	}
	v, ok := s.value(name, want)
	if !ok {
		t.Fatalf("no series %s%v among %v", name, want, s.keys())
	}
	return v
}

// keys are the series served, as name{label="value",...}.
func (s poolerSeries) keys() []string {
	var keys []string
	for name, f := range s.metricFamilies {
		for _, m := range f.GetMetric() {
			pairs := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				pairs = append(pairs, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			keys = append(keys, name+"{"+strings.Join(pairs, ",")+"}")
		}
	}
	slices.Sort(keys)
	return keys
}
