package agentapi

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// statsInstance is a fakeInstance with statistics, counting the Stats calls.
type statsInstance struct {
	*fakeInstance
	stats Stats
	calls atomic.Int32
	// hold, when set, keeps each Stats call until it is closed.
	hold chan struct{}
}

func (s *statsInstance) Stats(context.Context) Stats {
	s.calls.Add(1)
	if s.hold != nil {
		<-s.hold
	}
	return s.stats
}

func sampleStats() Stats {
	return Stats{
		Databases: []DatabaseStats{{Name: "app", SizeBytes: 8 << 20, XIDAge: 1234, MXIDAge: 1, XactCommit: 10, XactRollback: 2,
			BlocksRead: 5, BlocksHit: 95, Deadlocks: 1, TempFiles: 3, TempBytes: 4096, Conflicts: 0, TuplesInserted: 7}},
		Backends:       map[string]int{"active": 2, "idle in transaction": 1},
		MaxConnections: 100, LocksWaiting: 1, OldestTransactionSeconds: 12.5, OldestIdleInTransactionSeconds: 3,
		Checkpointer: &CheckpointerStats{Timed: 4, Requested: 1, WriteMillis: 1500, SyncMillis: 250, BuffersWritten: 9,
			BuffersClean: 2, MaxWrittenClean: 0, BuffersAllocated: 100},
		WAL:         &WALStats{Records: 50, FullPageImages: 5, Bytes: 65536, BuffersFull: 0},
		ReplicaLags: []ReplicaLag{{Name: "my-db-1", WriteSeconds: 0.001, FlushSeconds: 0.002, ReplaySeconds: 0.003}, {Name: "my-db-1"}},
		Duration:    20 * time.Millisecond,
	}
}

func TestStatsMetrics(t *testing.T) {
	inst := &statsInstance{fakeInstance: newFakeInstance(primaryStatus()), stats: sampleStats()}
	reg := prometheus.NewRegistry()
	NewServer(inst, ServerOptions{Registry: reg})
	want := `# HELP pgpilot_backends Client backends by state (pg_stat_activity.state: active, idle, idle in transaction, ...).
# TYPE pgpilot_backends gauge
pgpilot_backends{state="active"} 2
pgpilot_backends{state="idle in transaction"} 1
# HELP pgpilot_checkpoint_write_seconds_total Time checkpoints spent writing files to disk.
# TYPE pgpilot_checkpoint_write_seconds_total counter
pgpilot_checkpoint_write_seconds_total 1.5
# HELP pgpilot_checkpoints_total Checkpoints (restartpoints on a standby) performed: kind=timed by checkpoint_timeout, kind=requested by WAL volume or a command.
# TYPE pgpilot_checkpoints_total counter
pgpilot_checkpoints_total{kind="requested"} 1
pgpilot_checkpoints_total{kind="timed"} 4
# HELP pgpilot_database_blocks_hit_total Disk blocks found in shared buffers in the database (pg_stat_database.blks_hit).
# TYPE pgpilot_database_blocks_hit_total counter
pgpilot_database_blocks_hit_total{datname="app"} 95
# HELP pgpilot_database_size_bytes Size of the database on disk (pg_database_size).
# TYPE pgpilot_database_size_bytes gauge
pgpilot_database_size_bytes{datname="app"} 8.388608e+06
# HELP pgpilot_database_xid_age Transactions since the database's oldest unfrozen transaction ID (age(datfrozenxid)); PostgreSQL stops accepting writes near 2^31.
# TYPE pgpilot_database_xid_age gauge
pgpilot_database_xid_age{datname="app"} 1234
# HELP pgpilot_max_connections The max_connections setting.
# TYPE pgpilot_max_connections gauge
pgpilot_max_connections 100
# HELP pgpilot_oldest_transaction_seconds Age of the oldest open transaction of a client backend; 0 when none is open.
# TYPE pgpilot_oldest_transaction_seconds gauge
pgpilot_oldest_transaction_seconds 12.5
# HELP pgpilot_replica_lag_seconds How long a standby took to write, flush and replay this primary's recent WAL (pg_stat_replication's write_lag, flush_lag, replay_lag), per standby; 0 once it has caught up and no WAL is written.
# TYPE pgpilot_replica_lag_seconds gauge
pgpilot_replica_lag_seconds{kind="flush",replica="my-db-1"} 0.002
pgpilot_replica_lag_seconds{kind="replay",replica="my-db-1"} 0.003
pgpilot_replica_lag_seconds{kind="write",replica="my-db-1"} 0.001
# HELP pgpilot_stats_up Whether the last query batch for the database statistics succeeded (1) or not (0).
# TYPE pgpilot_stats_up gauge
pgpilot_stats_up 1
# HELP pgpilot_wal_bytes_total Bytes of WAL this instance generated (pg_stat_wal); its rate is the write load in WAL.
# TYPE pgpilot_wal_bytes_total counter
pgpilot_wal_bytes_total 65536
`
	names := []string{"pgpilot_backends", "pgpilot_checkpoint_write_seconds_total", "pgpilot_checkpoints_total",
		"pgpilot_database_blocks_hit_total", "pgpilot_database_size_bytes", "pgpilot_database_xid_age", "pgpilot_max_connections",
		"pgpilot_oldest_transaction_seconds", "pgpilot_replica_lag_seconds", "pgpilot_stats_up", "pgpilot_wal_bytes_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// No custom queries configured: none of their series.
	if n, err := testutil.GatherAndCount(reg, "pgpilot_custom_queries_valid", "pgpilot_custom_query_up"); err != nil || n != 0 {
		t.Errorf("custom query series without custom queries: %d, %v", n, err)
	}
}

// A failed batch says so and exports what it has; the instance's series stay.
func TestStatsFailed(t *testing.T) {
	inst := &statsInstance{fakeInstance: newFakeInstance(primaryStatus()), stats: Stats{Error: "timeout"}}
	reg := prometheus.NewRegistry()
	NewServer(inst, ServerOptions{Registry: reg})
	want := "# HELP pgpilot_stats_up Whether the last query batch for the database statistics succeeded (1) or not (0).\n# TYPE pgpilot_stats_up gauge\npgpilot_stats_up 0\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_stats_up"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "pgpilot_instance_up", "pgpilot_max_connections"); n != 1 {
		t.Errorf("%d series of pgpilot_instance_up and pgpilot_max_connections, want only the first", n)
	}
}

// Scrapes within the cache time share one query batch, concurrent ones included.
func TestStatsCache(t *testing.T) {
	inst := &statsInstance{fakeInstance: newFakeInstance(primaryStatus()), stats: sampleStats(), hold: make(chan struct{})}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	cache := &statsCache{inst: inst, cacheFor: 5 * time.Second, timeout: time.Second, now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&statsCollector{cache: cache}, &customCollector{cache: cache})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = reg.Gather() }()
	}
	time.Sleep(50 * time.Millisecond) // let every scrape reach the cache
	close(inst.hold)
	wg.Wait()
	if n := inst.calls.Load(); n != 1 {
		t.Errorf("%d Stats calls for 4 concurrent scrapes, want 1", n)
	}
	mu.Lock()
	now = now.Add(4 * time.Second)
	mu.Unlock()
	_, _ = reg.Gather()
	if n := inst.calls.Load(); n != 1 {
		t.Errorf("%d Stats calls after a scrape within the cache time, want 1", n)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	_, _ = reg.Gather()
	if n := inst.calls.Load(); n != 2 {
		t.Errorf("%d Stats calls after the cache time, want 2", n)
	}
}

// Custom queries: their health, their samples, a duplicate dropped rather than failing
// the scrape, and a bad file reported.
func TestCustomMetrics(t *testing.T) {
	st := sampleStats()
	st.CustomConfigured = true
	st.CustomQueries = []CustomQueryRun{{Query: "orders", Database: "app", OK: true, Duration: time.Millisecond},
		{Query: "broken", Database: "postgres", Error: "syntax error"}}
	sample := CustomSample{Name: "orders_total", Help: "Orders.", LabelNames: []string{"status", "datname"}, LabelValues: []string{"new", "app"}, Value: 3}
	dup := sample
	dup.Value = 4
	st.Custom = []CustomSample{sample, dup,
		{Name: "orders_amount", Help: "Amount.", Counter: true, LabelNames: []string{"status", "datname"}, LabelValues: []string{"new", "app"}, Value: 99.5}}
	inst := &statsInstance{fakeInstance: newFakeInstance(primaryStatus()), stats: st}
	reg := prometheus.NewRegistry()
	NewServer(inst, ServerOptions{Registry: reg})
	want := `# HELP orders_amount Amount.
# TYPE orders_amount counter
orders_amount{datname="app",status="new"} 99.5
# HELP orders_total Orders.
# TYPE orders_total gauge
orders_total{datname="app",status="new"} 3
# HELP pgpilot_custom_queries_valid Whether the custom queries' file (spec.monitoring.customQueries) is valid (1) or not (0, and none runs; the agent's log says why). Absent without custom queries.
# TYPE pgpilot_custom_queries_valid gauge
pgpilot_custom_queries_valid 1
# HELP pgpilot_custom_query_up Whether a custom query last succeeded on a database (1) or not (0, the agent's log says why).
# TYPE pgpilot_custom_query_up gauge
pgpilot_custom_query_up{datname="app",query="orders"} 1
pgpilot_custom_query_up{datname="postgres",query="broken"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"orders_amount", "orders_total", "pgpilot_custom_queries_valid", "pgpilot_custom_query_up"); err != nil {
		t.Error(err)
	}

	inst.stats = Stats{CustomConfigured: true, CustomConfigError: "bad YAML"}
	reg = prometheus.NewRegistry()
	NewServer(inst, ServerOptions{Registry: reg})
	invalid := "# HELP pgpilot_custom_queries_valid Whether the custom queries' file (spec.monitoring.customQueries) is valid (1) or not (0, and none runs; the agent's log says why). Absent without custom queries.\n# TYPE pgpilot_custom_queries_valid gauge\npgpilot_custom_queries_valid 0\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(invalid), "pgpilot_custom_queries_valid"); err != nil {
		t.Error(err)
	}
}

func TestStatsMetricsLint(t *testing.T) {
	inst := &statsInstance{fakeInstance: newFakeInstance(primaryStatus()), stats: sampleStats()}
	cache := &statsCache{inst: inst, cacheFor: time.Second, timeout: time.Second, now: time.Now}
	problems, err := testutil.CollectAndLint(&statsCollector{cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
