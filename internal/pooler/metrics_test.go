package pooler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
)

func fakeCollector(s statistics, err error) *poolerCollector {
	return &poolerCollector{
		read:    func(context.Context) (statistics, error) { return s, err },
		timeout: time.Second,
		log:     logr.Discard(),
	}
}

func sampleStats() statistics {
	return statistics{
		Pools: []pgbouncer.Pool{
			{Database: "pgbouncer", User: "pgbouncer", ClientsActive: 1, Mode: pgbouncer.Statement},
			{Database: "app", User: "alice", ClientsActive: 3, ClientsWaiting: 2, ServersActive: 1, ServersIdle: 4,
				ServersUsed: 5, ServersTested: 6, ServersLogin: 7, MaxWaitMicros: 2_250_000, Mode: pgbouncer.Transaction},
			// A row twice would fail the whole scrape: the first is served.
			{Database: "app", User: "alice", ClientsWaiting: 99},
		},
		Stats: []pgbouncer.DatabaseStats{
			{Database: "pgbouncer", Transactions: 8, Queries: 8},
			{Database: "app", Transactions: 10, Queries: 30, ReceivedBytes: 4000, SentBytes: 5000,
				TransactionMicros: 1_500_000, QueryMicros: 700_000, WaitMicros: 250},
		},
		Lists: pgbouncer.Lists{Databases: 2, Users: 3, Pools: 2, FreeClients: 45, UsedClients: 5, LoginClients: 1,
			FreeServers: 6, UsedServers: 7},
	}
}

// The series of a pool, a database and the lists, in seconds where PgBouncer counts
// microseconds, without the admin console's pseudo-database.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(fakeCollector(sampleStats(), nil))
	want := `# HELP pgpilot_pooler_client_max_wait_seconds How long the pool's oldest waiting client has waited for a server connection (SHOW POOLS maxwait and maxwait_us); 0 when none waits.
# TYPE pgpilot_pooler_client_max_wait_seconds gauge
pgpilot_pooler_client_max_wait_seconds{datname="app",user="alice"} 2.25
# HELP pgpilot_pooler_clients Client connections of a pool by state (SHOW POOLS): active (linked to a server connection, or idle between transactions), waiting (for a server connection; all of them while PgBouncer is paused).
# TYPE pgpilot_pooler_clients gauge
pgpilot_pooler_clients{datname="app",state="active",user="alice"} 3
pgpilot_pooler_clients{datname="app",state="waiting",user="alice"} 2
# HELP pgpilot_pooler_pool_mode The pool's pool_mode (session, transaction or statement); always 1.
# TYPE pgpilot_pooler_pool_mode gauge
pgpilot_pooler_pool_mode{datname="app",mode="transaction",user="alice"} 1
# HELP pgpilot_pooler_servers Server connections of a pool by state (SHOW POOLS): active (linked to a client), idle (ready for one), used (idle past server_check_delay, to be checked), tested (running the reset or check query), login (logging in).
# TYPE pgpilot_pooler_servers gauge
pgpilot_pooler_servers{datname="app",state="active",user="alice"} 1
pgpilot_pooler_servers{datname="app",state="idle",user="alice"} 4
pgpilot_pooler_servers{datname="app",state="login",user="alice"} 7
pgpilot_pooler_servers{datname="app",state="tested",user="alice"} 6
pgpilot_pooler_servers{datname="app",state="used",user="alice"} 5
# HELP pgpilot_pooler_transactions_total Transactions PgBouncer pooled for the database since it started (SHOW STATS total_xact_count).
# TYPE pgpilot_pooler_transactions_total counter
pgpilot_pooler_transactions_total{datname="app"} 10
# HELP pgpilot_pooler_queries_total Queries PgBouncer pooled for the database since it started (SHOW STATS total_query_count).
# TYPE pgpilot_pooler_queries_total counter
pgpilot_pooler_queries_total{datname="app"} 30
# HELP pgpilot_pooler_received_bytes_total Bytes PgBouncer received from the database's clients (SHOW STATS total_received).
# TYPE pgpilot_pooler_received_bytes_total counter
pgpilot_pooler_received_bytes_total{datname="app"} 4000
# HELP pgpilot_pooler_sent_bytes_total Bytes PgBouncer sent to the database's clients (SHOW STATS total_sent).
# TYPE pgpilot_pooler_sent_bytes_total counter
pgpilot_pooler_sent_bytes_total{datname="app"} 5000
# HELP pgpilot_pooler_transaction_seconds_total Time the database's transactions took, from the client's first query, a wait for a server connection included, to the end (SHOW STATS total_xact_time).
# TYPE pgpilot_pooler_transaction_seconds_total counter
pgpilot_pooler_transaction_seconds_total{datname="app"} 1.5
# HELP pgpilot_pooler_query_seconds_total Time the database's queries took, from the client sending one, a wait for a server connection included, to its end (SHOW STATS total_query_time).
# TYPE pgpilot_pooler_query_seconds_total counter
pgpilot_pooler_query_seconds_total{datname="app"} 0.7
# HELP pgpilot_pooler_wait_seconds_total Time the database's clients spent waiting for a server connection (SHOW STATS total_wait_time).
# TYPE pgpilot_pooler_wait_seconds_total counter
pgpilot_pooler_wait_seconds_total{datname="app"} 0.00025
# HELP pgpilot_pooler_client_slots PgBouncer's client connection slots (SHOW LISTS): used by a client connected (the scrape's own admin session among them), free (allocated, unused).
# TYPE pgpilot_pooler_client_slots gauge
pgpilot_pooler_client_slots{state="free"} 45
pgpilot_pooler_client_slots{state="used"} 5
# HELP pgpilot_pooler_server_slots PgBouncer's server connection slots (SHOW LISTS): used by a server connection, free (allocated, unused).
# TYPE pgpilot_pooler_server_slots gauge
pgpilot_pooler_server_slots{state="free"} 6
pgpilot_pooler_server_slots{state="used"} 7
# HELP pgpilot_pooler_pools Pools, one per database and user (SHOW LISTS), the admin console's among them.
# TYPE pgpilot_pooler_pools gauge
pgpilot_pooler_pools 2
# HELP pgpilot_pooler_up Whether PgBouncer's admin console answered SHOW POOLS, SHOW STATS and SHOW LISTS at this scrape (1) or not (0, and none of their series is served).
# TYPE pgpilot_pooler_up gauge
pgpilot_pooler_up 1
`
	names := []string{"pgpilot_pooler_client_max_wait_seconds", "pgpilot_pooler_clients", "pgpilot_pooler_pool_mode", "pgpilot_pooler_servers",
		"pgpilot_pooler_transactions_total", "pgpilot_pooler_queries_total", "pgpilot_pooler_received_bytes_total", "pgpilot_pooler_sent_bytes_total",
		"pgpilot_pooler_transaction_seconds_total", "pgpilot_pooler_query_seconds_total", "pgpilot_pooler_wait_seconds_total",
		"pgpilot_pooler_client_slots", "pgpilot_pooler_server_slots", "pgpilot_pooler_pools", "pgpilot_pooler_up"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "pgpilot_pooler_databases", "pgpilot_pooler_users"); err != nil || n != 2 {
		t.Errorf("pgpilot_pooler_databases and _users: %d series, %v", n, err)
	}
}

// A PgBouncer that does not answer: up 0 and nothing else, not a failed scrape.
func TestMetricsDown(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(fakeCollector(sampleStats(), errors.New("connection refused")))
	got, err := testutil.GatherAndCount(reg)
	if err != nil || got != 1 {
		t.Fatalf("%d series (%v), want pgpilot_pooler_up alone", got, err)
	}
	want := "# HELP pgpilot_pooler_up Whether PgBouncer's admin console answered SHOW POOLS, SHOW STATS and SHOW LISTS at this scrape (1) or not (0, and none of their series is served).\n" +
		"# TYPE pgpilot_pooler_up gauge\npgpilot_pooler_up 0\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_pooler_up"); err != nil {
		t.Error(err)
	}
}

// A name that is not UTF-8 (a database's, in SQL_ASCII) is served with U+FFFD, not
// failing the scrape; two that differ only there are one series.
func TestMetricsBadName(t *testing.T) {
	s := sampleStats()
	s.Pools = append(s.Pools, pgbouncer.Pool{Database: "caf\xe9", User: "alice", ClientsWaiting: 1},
		pgbouncer.Pool{Database: "caf\xe8", User: "alice", ClientsWaiting: 2})
	s.Stats = append(s.Stats, pgbouncer.DatabaseStats{Database: "caf\xe9", Transactions: 1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(fakeCollector(s, nil))
	want := `# HELP pgpilot_pooler_transactions_total Transactions PgBouncer pooled for the database since it started (SHOW STATS total_xact_count).
# TYPE pgpilot_pooler_transactions_total counter
pgpilot_pooler_transactions_total{datname="app"} 10
pgpilot_pooler_transactions_total{datname="caf` + "\uFFFD" + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_pooler_transactions_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "pgpilot_pooler_clients"); err != nil || n != 4 {
		t.Errorf("pgpilot_pooler_clients: %d series (%v), want app's 2 and caf\uFFFD's 2", n, err)
	}
}

func TestMetricsLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(fakeCollector(sampleStats(), nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
