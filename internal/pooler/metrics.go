package pooler

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
)

// The pooler's series (docs/monitoring.md, "The pooler"), read from PgBouncer's admin
// console at each scrape.
var (
	poolLabels = []string{"datname", "user"}
	dbLabels   = []string{"datname"}

	poolerUpDesc = prometheus.NewDesc("pgpilot_pooler_up",
		"Whether PgBouncer's admin console answered SHOW POOLS, SHOW STATS and SHOW LISTS at this scrape (1) or not (0, and none of their series is served).", nil, nil)
	poolerClientsDesc = prometheus.NewDesc("pgpilot_pooler_clients",
		"Client connections of a pool by state (SHOW POOLS): active (linked to a server connection, or idle between transactions), waiting (for a server connection; all of them while PgBouncer is paused).",
		[]string{"datname", "user", "state"}, nil)
	poolerMaxWaitDesc = prometheus.NewDesc("pgpilot_pooler_client_max_wait_seconds",
		"How long the pool's oldest waiting client has waited for a server connection (SHOW POOLS maxwait and maxwait_us); 0 when none waits.", poolLabels, nil)
	poolerServersDesc = prometheus.NewDesc("pgpilot_pooler_servers",
		"Server connections of a pool by state (SHOW POOLS): active (linked to a client), idle (ready for one), used (idle past server_check_delay, to be checked), tested (running the reset or check query), login (logging in).",
		[]string{"datname", "user", "state"}, nil)
	poolerModeDesc = prometheus.NewDesc("pgpilot_pooler_pool_mode",
		"The pool's pool_mode (session, transaction or statement); always 1.", []string{"datname", "user", "mode"}, nil)

	poolerTransactionsDesc = prometheus.NewDesc("pgpilot_pooler_transactions_total",
		"Transactions PgBouncer pooled for the database since it started (SHOW STATS total_xact_count).", dbLabels, nil)
	poolerQueriesDesc = prometheus.NewDesc("pgpilot_pooler_queries_total",
		"Queries PgBouncer pooled for the database since it started (SHOW STATS total_query_count).", dbLabels, nil)
	poolerReceivedDesc = prometheus.NewDesc("pgpilot_pooler_received_bytes_total",
		"Bytes PgBouncer received from the database's clients (SHOW STATS total_received).", dbLabels, nil)
	poolerSentDesc = prometheus.NewDesc("pgpilot_pooler_sent_bytes_total",
		"Bytes PgBouncer sent to the database's clients (SHOW STATS total_sent).", dbLabels, nil)
	poolerXactTimeDesc = prometheus.NewDesc("pgpilot_pooler_transaction_seconds_total",
		"Time the database's transactions took, from the client's first query, a wait for a server connection included, to the end (SHOW STATS total_xact_time).", dbLabels, nil)
	poolerQueryTimeDesc = prometheus.NewDesc("pgpilot_pooler_query_seconds_total",
		"Time the database's queries took, from the client sending one, a wait for a server connection included, to its end (SHOW STATS total_query_time).", dbLabels, nil)
	poolerWaitTimeDesc = prometheus.NewDesc("pgpilot_pooler_wait_seconds_total",
		"Time the database's clients spent waiting for a server connection (SHOW STATS total_wait_time).", dbLabels, nil)

	poolerDatabasesDesc = prometheus.NewDesc("pgpilot_pooler_databases",
		"Databases PgBouncer knows (SHOW LISTS), the admin console's pseudo-database among them.", nil, nil)
	poolerUsersDesc = prometheus.NewDesc("pgpilot_pooler_users",
		"Users PgBouncer knows (SHOW LISTS), its own among them.", nil, nil)
	poolerPoolsDesc = prometheus.NewDesc("pgpilot_pooler_pools",
		"Pools, one per database and user (SHOW LISTS), the admin console's among them.", nil, nil)
	poolerClientSlotsDesc = prometheus.NewDesc("pgpilot_pooler_client_slots",
		"PgBouncer's client connection slots (SHOW LISTS): used by a client connected (the scrape's own admin session among them), free (allocated, unused).",
		[]string{"state"}, nil)
	poolerServerSlotsDesc = prometheus.NewDesc("pgpilot_pooler_server_slots",
		"PgBouncer's server connection slots (SHOW LISTS): used by a server connection, free (allocated, unused).", []string{"state"}, nil)
)

var poolerDescs = []*prometheus.Desc{
	poolerUpDesc, poolerClientsDesc, poolerMaxWaitDesc, poolerServersDesc, poolerModeDesc,
	poolerTransactionsDesc, poolerQueriesDesc, poolerReceivedDesc, poolerSentDesc,
	poolerXactTimeDesc, poolerQueryTimeDesc, poolerWaitTimeDesc,
	poolerDatabasesDesc, poolerUsersDesc, poolerPoolsDesc, poolerClientSlotsDesc, poolerServerSlotsDesc,
}

// CollectorTimeout is the time a scrape gives PgBouncer to answer, NewCollector's timeout
// for the pooler agent: PgBouncer answers from memory within milliseconds, so one that
// needs longer is in trouble, which pgpilot_pooler_up 0 then says.
const CollectorTimeout = 2 * time.Second

// adminDatabase is the admin console's pseudo-database, which has a pool and
// statistics of its own: not the clients', so not served.
const adminDatabase = "pgbouncer"

// statistics are what one scrape reads from PgBouncer.
type statistics struct {
	Pools []pgbouncer.Pool
	Stats []pgbouncer.DatabaseStats
	Lists pgbouncer.Lists
}

// readStatistics reads SHOW POOLS, SHOW STATS and SHOW LISTS on a.
func readStatistics(ctx context.Context, a *pgbouncer.Admin) (statistics, error) {
	var s statistics
	var err error
	if s.Pools, err = a.Pools(ctx); err != nil {
		return s, err
	}
	if s.Stats, err = a.Stats(ctx); err != nil {
		return s, err
	}
	s.Lists, err = a.Lists(ctx)
	return s, err
}

// NewCollector is a prometheus.Collector of PgBouncer's statistics, the pgpilot_pooler_
// series: at each scrape it opens an admin session with dial, reads the statistics
// within timeout, and closes it. A PgBouncer that does not answer in time is
// pgpilot_pooler_up 0 and none of the others.
func NewCollector(dial func(context.Context) (*pgbouncer.Admin, error), timeout time.Duration, log logr.Logger) prometheus.Collector {
	return &poolerCollector{
		read: func(ctx context.Context) (statistics, error) {
			a, err := dial(ctx)
			if err != nil {
				return statistics{}, err
			}
			defer func() { _ = a.Close(ctx) }() // closes the socket even past ctx's deadline
			return readStatistics(ctx, a)
		},
		timeout: timeout,
		log:     log,
	}
}

// poolerCollector serves what read returns, read at each scrape.
type poolerCollector struct {
	read    func(context.Context) (statistics, error)
	timeout time.Duration
	log     logr.Logger

	// mu guards down, which is whether the last scrape failed: a failure is logged
	// when PgBouncer stops answering, not at every scrape after.
	mu   sync.Mutex
	down bool
}

func (c *poolerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range poolerDescs {
		ch <- d
	}
}

func (c *poolerCollector) Collect(ch chan<- prometheus.Metric) {
	// Collect gets no context from the scrape; bound the admin session ourselves.
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s, err := c.read(ctx)
	c.logChange(err)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(poolerUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(poolerUpDesc, prometheus.GaugeValue, 1)
	writeStatistics(s, ch)
}

func (c *poolerCollector) logChange(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil && !c.down:
		c.log.Error(err, "PgBouncer's statistics could not be read; pgpilot_pooler_up is 0 until they are")
	case err == nil && c.down:
		c.log.Info("PgBouncer's statistics are read again")
	}
	c.down = err != nil
}

// writeStatistics sends s's series, but for pgpilot_pooler_up. A name that is not
// UTF-8 (a database's, in SQL_ASCII) is served with U+FFFD for its bad bytes: as it
// is, it would fail the whole scrape.
func writeStatistics(s statistics, ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	// One series per label set: a duplicate would fail the whole scrape too.
	seen := map[[2]string]bool{}
	for _, p := range s.Pools {
		db, user := validUTF8(p.Database), validUTF8(p.User)
		key := [2]string{db, user}
		if p.Database == adminDatabase || seen[key] {
			continue
		}
		seen[key] = true
		gauge(poolerClientsDesc, float64(p.ClientsActive), db, user, "active")
		gauge(poolerClientsDesc, float64(p.ClientsWaiting), db, user, "waiting")
		gauge(poolerMaxWaitDesc, float64(p.MaxWaitMicros)/1e6, db, user)
		for _, sv := range []struct {
			state string
			n     int64
		}{
			{"active", p.ServersActive}, {"idle", p.ServersIdle}, {"used", p.ServersUsed},
			{"tested", p.ServersTested}, {"login", p.ServersLogin},
		} {
			gauge(poolerServersDesc, float64(sv.n), db, user, sv.state)
		}
		if p.Mode != "" {
			gauge(poolerModeDesc, 1, db, user, validUTF8(string(p.Mode)))
		}
	}

	seenDB := map[string]bool{}
	for _, d := range s.Stats {
		db := validUTF8(d.Database)
		if d.Database == adminDatabase || seenDB[db] {
			continue
		}
		seenDB[db] = true
		for _, v := range []struct {
			desc  *prometheus.Desc
			value float64
		}{
			{poolerTransactionsDesc, float64(d.Transactions)},
			{poolerQueriesDesc, float64(d.Queries)},
			{poolerReceivedDesc, float64(d.ReceivedBytes)},
			{poolerSentDesc, float64(d.SentBytes)},
			{poolerXactTimeDesc, float64(d.TransactionMicros) / 1e6},
			{poolerQueryTimeDesc, float64(d.QueryMicros) / 1e6},
			{poolerWaitTimeDesc, float64(d.WaitMicros) / 1e6},
		} {
			ch <- prometheus.MustNewConstMetric(v.desc, prometheus.CounterValue, v.value, db)
		}
	}

	l := s.Lists
	gauge(poolerDatabasesDesc, float64(l.Databases))
	gauge(poolerUsersDesc, float64(l.Users))
	gauge(poolerPoolsDesc, float64(l.Pools))
	gauge(poolerClientSlotsDesc, float64(l.UsedClients), "used")
	gauge(poolerClientSlotsDesc, float64(l.FreeClients), "free")
	gauge(poolerServerSlotsDesc, float64(l.UsedServers), "used")
	gauge(poolerServerSlotsDesc, float64(l.FreeServers), "free")
}

// validUTF8 is s with each run of bytes that is not UTF-8 replaced by U+FFFD.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
