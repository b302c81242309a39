package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// customQueriesFile has one good query, one that fails, one a non-superuser may not
// run, and one slower than the timeout.
const customQueriesFile = `
app_rows:
  query: "SELECT 'metrics' AS tbl, count(*) AS total FROM metrics"
  target_databases: [app]
  metrics:
    - tbl: {usage: LABEL}
    - total: {usage: GAUGE, description: Rows of the table}
divide:
  query: SELECT 1/0 AS result
  metrics:
    - result: {usage: GAUGE}
superuser_only:
  query: SELECT length(pg_read_file('postgresql.conf')) AS size
  metrics:
    - size: {usage: GAUGE}
slow:
  query: SELECT pg_sleep(10)::text AS slept, 1 AS one
  metrics:
    - slept: {usage: LABEL}
    - one: {usage: GAUGE}
`

// The database statistics an instance exports, on real PostgreSQL: each family moves
// with what the test does (commits, rollbacks, a deadlock, temporary files, a lock
// wait, an idle transaction, a checkpoint, WAL), scrapes within the cache time share one
// query batch, and custom queries run as a role without privileges: a query that needs
// the superuser, one that fails and one that runs too long each report their failure
// alone.
func TestInstanceMetrics(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.customQueries = filepath.Join(c.dir, "queries.yaml")
	mustWrite(t, c.customQueries, []byte(customQueriesFile))
	chownR(t, c.dir)
	p, r := c.instances[0], c.instances[1]
	c.startAll()
	p.mustExec("CREATE TABLE metrics (id int PRIMARY KEY, v text)")
	p.mustExec("INSERT INTO metrics SELECT i, 'x' FROM generate_series(1, 200) i")
	// The custom queries' role can read what it is granted, as any role: the agent
	// makes it at its first scrape as primary.
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, err := c.scrape(p); err != nil {
			return err
		}
		return p.exec("GRANT SELECT ON metrics TO " + pgconf.MonitorUser)
	})
	p.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "INSERT INTO metrics VALUES (1000, 'rolled back')")
		return tx.Rollback(ctx)
	})
	// Temporary files: a sort larger than work_mem.
	p.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SET work_mem = '64kB'; SELECT count(*) FROM (SELECT i FROM generate_series(1, 200000) i ORDER BY i DESC) s")
		return err
	})
	deadlock(t, p)

	// An idle transaction holding a row lock, and a backend waiting for it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	idle := mustConn(t, p)
	defer idle.Close(context.Background())
	tx, err := idle.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE metrics SET v = 'held' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	waiter := mustConn(t, p)
	defer waiter.Close(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "UPDATE metrics SET v = 'waiting' WHERE id = 1")
		waited <- err
	}()

	var m metricFamilies
	testutil.Eventually(t, 30*time.Second, func() error {
		var err error
		if m, err = c.scrape(p); err != nil {
			return err
		}
		for _, check := range []struct {
			name   string
			labels map[string]string
			ok     func(float64) bool
			want   string
		}{
			{"pgpilot_stats_up", nil, eq(1), "1"},
			{"pgpilot_database_size_bytes", map[string]string{"datname": "app"}, gt(1 << 20), "> 1 MiB"},
			{"pgpilot_database_xact_commit_total", map[string]string{"datname": "app"}, gt(2), "> 2"},
			{"pgpilot_database_xact_rollback_total", map[string]string{"datname": "app"}, gt(0), "> 0"},
			{"pgpilot_database_deadlocks_total", map[string]string{"datname": "app"}, gt(0), "> 0"},
			{"pgpilot_database_temp_bytes_total", map[string]string{"datname": "app"}, gt(0), "> 0"},
			{"pgpilot_database_temp_files_total", map[string]string{"datname": "app"}, gt(0), "> 0"},
			{"pgpilot_database_blocks_hit_total", map[string]string{"datname": "app"}, gt(0), "> 0"},
			{"pgpilot_database_tuples_total", map[string]string{"datname": "app", "op": "inserted"}, gt(199), "> 199"},
			{"pgpilot_database_xid_age", map[string]string{"datname": "template0"}, gt(0), "> 0"},
			{"pgpilot_database_conflicts_total", map[string]string{"datname": "app"}, eq(0), "0 on a primary"},
			{"pgpilot_max_connections", nil, eq(100), "100 (the default)"},
			{"pgpilot_locks_waiting", nil, gt(0), "> 0"},
			{"pgpilot_backends", map[string]string{"state": "idle in transaction"}, gt(0), "> 0"},
			{"pgpilot_backends", map[string]string{"state": "active"}, gt(0), "> 0"},
			{"pgpilot_oldest_idle_in_transaction_seconds", nil, gt(1), "> 1"},
			{"pgpilot_oldest_transaction_seconds", nil, gt(1), "> 1"},
			// The replica's clone (pg_basebackup) requested a checkpoint.
			{"pgpilot_checkpoints_total", map[string]string{"kind": "requested"}, gt(0), "> 0"},
			{"pgpilot_checkpoint_buffers_written_total", nil, gte(0), ">= 0"},
			{"pgpilot_wal_bytes_total", nil, gt(0), "> 0"},
			{"pgpilot_wal_records_total", nil, gt(0), "> 0"},
			{"pgpilot_replica_lag_seconds", map[string]string{"replica": r.pod, "kind": "replay"}, gte(0), ">= 0"},
			{"pgpilot_custom_queries_valid", nil, eq(1), "1"},
			{"app_rows_total", map[string]string{"tbl": "metrics", "datname": "app"}, eq(202), "202 (200 and the deadlock's 2)"},
			{"pgpilot_custom_query_up", map[string]string{"query": "app_rows", "datname": "app"}, eq(1), "1"},
			{"pgpilot_custom_query_up", map[string]string{"query": "divide", "datname": "postgres"}, eq(0), "0 (division by zero)"},
			{"pgpilot_custom_query_up", map[string]string{"query": "superuser_only", "datname": "postgres"}, eq(0), "0 (not the superuser)"},
			{"pgpilot_custom_query_up", map[string]string{"query": "slow", "datname": "postgres"}, eq(0), "0 (statement timeout)"},
			{"pgpilot_custom_query_duration_seconds", map[string]string{"query": "slow", "datname": "postgres"}, lt(4), "< 4 s"},
			// The instance's own series are still there.
			{"pgpilot_instance_role", map[string]string{"role": "primary"}, eq(1), "1"},
		} {
			v, found := m.value(check.name, check.labels)
			if !found {
				return fmt.Errorf("no %s%v", check.name, check.labels)
			}
			if !check.ok(v) {
				return fmt.Errorf("%s%v = %v, want %s", check.name, check.labels, v, check.want)
			}
		}
		return nil
	})
	if _, found := m.value("superuser_only_size", nil); found {
		t.Error("a query that needs the superuser gave a value")
	}
	cancel()
	if err := <-waited; err == nil {
		t.Error("the update waiting for the idle transaction's lock did not wait")
	}
	_ = tx.Rollback(context.Background())

	// Scrapes within the cache time share one batch: WAL written in between shows only
	// after it.
	before, _ := m.value("pgpilot_wal_bytes_total", nil)
	firstAsked := time.Now()
	m1, err := c.scrape(p)
	if err != nil {
		t.Fatal(err)
	}
	p.mustExec("INSERT INTO metrics SELECT i, repeat('y', 100) FROM generate_series(1001, 3000) i")
	m2, err := c.scrape(p)
	if err != nil {
		t.Fatal(err)
	}
	w1, _ := m1.value("pgpilot_wal_bytes_total", nil)
	w2, _ := m2.value("pgpilot_wal_bytes_total", nil)
	d1, _ := m1.value("pgpilot_stats_duration_seconds", nil)
	d2, _ := m2.value("pgpilot_stats_duration_seconds", nil)
	switch took := time.Since(firstAsked); {
	case took >= agentapi.DefaultStatsCacheFor:
		t.Logf("the two scrapes took %s, longer than the cache: their batches may differ", took)
	case w1 != w2 || d1 != d2:
		t.Errorf("two scrapes %s apart got different batches (WAL %v then %v, duration %v then %v)", took, w1, w2, d1, d2)
	}
	testutil.Eventually(t, 20*time.Second, func() error {
		m3, err := c.scrape(p)
		if err != nil {
			return err
		}
		if w3, _ := m3.value("pgpilot_wal_bytes_total", nil); w3 <= w2 || w3 <= before {
			return fmt.Errorf("pgpilot_wal_bytes_total %v, not above %v after 2000 rows", w3, w2)
		}
		return nil
	})

	// The standby: statistics too, and the rows of the custom query once replicated.
	testutil.Eventually(t, 30*time.Second, func() error {
		m, err := c.scrape(r)
		if err != nil {
			return err
		}
		if v, _ := m.value("pgpilot_stats_up", nil); v != 1 {
			return errors.New("pgpilot_stats_up is not 1 on the standby")
		}
		if v, ok := m.value("pgpilot_database_conflicts_total", map[string]string{"datname": "app"}); !ok || v != 0 {
			return fmt.Errorf("pgpilot_database_conflicts_total on the standby = %v, %v", v, ok)
		}
		if v, _ := m.value("app_rows_total", map[string]string{"tbl": "metrics", "datname": "app"}); v != 2202 {
			return fmt.Errorf("app_rows_total on the standby = %v, want 2202", v)
		}
		return nil
	})

	// A broken file: reported, and no custom query runs; the rest is unaffected.
	mustWrite(t, c.customQueries, []byte("app_rows: [not, a, query]\n"))
	testutil.Eventually(t, 20*time.Second, func() error {
		m, err := c.scrape(p)
		if err != nil {
			return err
		}
		if v, _ := m.value("pgpilot_custom_queries_valid", nil); v != 0 {
			return errors.New("pgpilot_custom_queries_valid is not 0 for a broken file")
		}
		if _, found := m.value("app_rows_total", map[string]string{"tbl": "metrics", "datname": "app"}); found {
			return errors.New("a custom query ran from a broken file")
		}
		if v, _ := m.value("pgpilot_stats_up", nil); v != 1 {
			return errors.New("pgpilot_stats_up is not 1")
		}
		return nil
	})
}

// deadlock makes two transactions of the application wait for each other; PostgreSQL
// cancels one after deadlock_timeout.
func deadlock(t *testing.T, in *instance) {
	t.Helper()
	in.mustExec("INSERT INTO metrics VALUES (-1, 'a'), (-2, 'b')")
	ctx := context.Background()
	a, b := mustConn(t, in), mustConn(t, in)
	defer a.Close(ctx)
	defer b.Close(ctx)
	txa, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	txb, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := txa.Exec(ctx, "UPDATE metrics SET v = 'a' WHERE id = -1"); err != nil {
		t.Fatal(err)
	}
	if _, err := txb.Exec(ctx, "UPDATE metrics SET v = 'b' WHERE id = -2"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := txa.Exec(ctx, "UPDATE metrics SET v = 'a' WHERE id = -2")
		done <- err
	}()
	_, errb := txb.Exec(ctx, "UPDATE metrics SET v = 'b' WHERE id = -1")
	erra := <-done
	if erra == nil && errb == nil {
		t.Fatal("no deadlock detected")
	}
	_ = txa.Rollback(ctx)
	_ = txb.Rollback(ctx)
}

func mustConn(t *testing.T, in *instance) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// metricFamilies is a parsed /metrics.
type metricFamilies map[string]*dto.MetricFamily

// value is the sample of name whose labels include labels.
func (m metricFamilies) value(name string, labels map[string]string) (float64, bool) {
	f, ok := m[name]
	if !ok {
		return 0, false
	}
	for _, s := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range s.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if !match {
			continue
		}
		switch {
		case s.Gauge != nil:
			return s.GetGauge().GetValue(), true
		case s.Counter != nil:
			return s.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// scrape reads in's /metrics as Prometheus does, with the metrics token.
func (c *cluster) scrape(in *instance) (metricFamilies, error) {
	req, err := http.NewRequest(http.MethodGet, "https://"+in.ip+":8008/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.agentHTTP(in.pod).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("/metrics: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var p expfmt.TextParser
	return p.TextToMetricFamilies(resp.Body)
}

func eq(want float64) func(float64) bool  { return func(v float64) bool { return v == want } }
func gt(than float64) func(float64) bool  { return func(v float64) bool { return v > than } }
func gte(than float64) func(float64) bool { return func(v float64) bool { return v >= than } }
func lt(than float64) func(float64) bool  { return func(v float64) bool { return v < than } }
