package agentapi

import (
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// The database statistics' series (docs/monitoring.md lists them all).
var (
	dbLabels = []string{"datname"}

	dbSizeDesc = prometheus.NewDesc("pgpilot_database_size_bytes",
		"Size of the database on disk (pg_database_size).", dbLabels, nil)
	dbXIDAgeDesc = prometheus.NewDesc("pgpilot_database_xid_age",
		"Transactions since the database's oldest unfrozen transaction ID (age(datfrozenxid)); PostgreSQL stops accepting writes near 2^31.", dbLabels, nil)
	dbMXIDAgeDesc = prometheus.NewDesc("pgpilot_database_mxid_age",
		"Multixacts since the database's oldest unfrozen multixact ID (mxid_age(datminmxid)).", dbLabels, nil)
	dbCommitDesc = prometheus.NewDesc("pgpilot_database_xact_commit_total",
		"Transactions committed in the database (pg_stat_database).", dbLabels, nil)
	dbRollbackDesc = prometheus.NewDesc("pgpilot_database_xact_rollback_total",
		"Transactions rolled back in the database (pg_stat_database).", dbLabels, nil)
	dbBlocksReadDesc = prometheus.NewDesc("pgpilot_database_blocks_read_total",
		"Disk blocks read in the database (pg_stat_database.blks_read).", dbLabels, nil)
	dbBlocksHitDesc = prometheus.NewDesc("pgpilot_database_blocks_hit_total",
		"Disk blocks found in shared buffers in the database (pg_stat_database.blks_hit).", dbLabels, nil)
	dbDeadlocksDesc = prometheus.NewDesc("pgpilot_database_deadlocks_total",
		"Deadlocks detected in the database (pg_stat_database).", dbLabels, nil)
	dbTempFilesDesc = prometheus.NewDesc("pgpilot_database_temp_files_total",
		"Temporary files written by queries of the database (pg_stat_database).", dbLabels, nil)
	dbTempBytesDesc = prometheus.NewDesc("pgpilot_database_temp_bytes_total",
		"Bytes of temporary files written by queries of the database (pg_stat_database).", dbLabels, nil)
	dbConflictsDesc = prometheus.NewDesc("pgpilot_database_conflicts_total",
		"Queries canceled on this standby by conflicts with recovery (pg_stat_database).", dbLabels, nil)
	dbTuplesDesc = prometheus.NewDesc("pgpilot_database_tuples_total",
		"Rows returned, fetched, inserted, updated and deleted by queries of the database (pg_stat_database.tup_<op>).",
		[]string{"datname", "op"}, nil)

	backendsDesc = prometheus.NewDesc("pgpilot_backends",
		"Client backends by state (pg_stat_activity.state: active, idle, idle in transaction, ...).", []string{"state"}, nil)
	maxConnectionsDesc = prometheus.NewDesc("pgpilot_max_connections",
		"The max_connections setting.", nil, nil)
	locksWaitingDesc = prometheus.NewDesc("pgpilot_locks_waiting",
		"Backends waiting for a lock (pg_locks, not granted).", nil, nil)
	oldestXactDesc = prometheus.NewDesc("pgpilot_oldest_transaction_seconds",
		"Age of the oldest open transaction of a client backend; 0 when none is open.", nil, nil)
	oldestIdleXactDesc = prometheus.NewDesc("pgpilot_oldest_idle_in_transaction_seconds",
		"How long the longest idle-in-transaction client backend has been idle; 0 when none is.", nil, nil)

	checkpointsDesc = prometheus.NewDesc("pgpilot_checkpoints_total",
		"Checkpoints (restartpoints on a standby) performed: kind=timed by checkpoint_timeout, kind=requested by WAL volume or a command.",
		[]string{"kind"}, nil)
	checkpointWriteDesc = prometheus.NewDesc("pgpilot_checkpoint_write_seconds_total",
		"Time checkpoints spent writing files to disk.", nil, nil)
	checkpointSyncDesc = prometheus.NewDesc("pgpilot_checkpoint_sync_seconds_total",
		"Time checkpoints spent syncing files to disk.", nil, nil)
	checkpointBuffersDesc = prometheus.NewDesc("pgpilot_checkpoint_buffers_written_total",
		"Buffers written by checkpoints.", nil, nil)
	bgwriterCleanDesc = prometheus.NewDesc("pgpilot_bgwriter_buffers_written_total",
		"Buffers written by the background writer.", nil, nil)
	bgwriterMaxWrittenDesc = prometheus.NewDesc("pgpilot_bgwriter_maxwritten_clean_total",
		"Times the background writer stopped a cleaning scan for writing too many buffers.", nil, nil)
	buffersAllocDesc = prometheus.NewDesc("pgpilot_buffers_allocated_total",
		"Shared buffers allocated.", nil, nil)

	walBytesDesc = prometheus.NewDesc("pgpilot_wal_bytes_total",
		"Bytes of WAL this instance generated (pg_stat_wal); its rate is the write load in WAL.", nil, nil)
	walRecordsDesc = prometheus.NewDesc("pgpilot_wal_records_total",
		"WAL records this instance generated (pg_stat_wal).", nil, nil)
	walFPIDesc = prometheus.NewDesc("pgpilot_wal_full_page_images_total",
		"Full page images this instance wrote to WAL (pg_stat_wal).", nil, nil)
	walBuffersFullDesc = prometheus.NewDesc("pgpilot_wal_buffers_full_total",
		"Times WAL was written to disk because the WAL buffers were full (pg_stat_wal).", nil, nil)

	replicaLagSecondsDesc = prometheus.NewDesc("pgpilot_replica_lag_seconds",
		"How long a standby took to write, flush and replay this primary's recent WAL (pg_stat_replication's write_lag, flush_lag, replay_lag), per standby; 0 once it has caught up and no WAL is written.",
		[]string{"replica", "kind"}, nil)

	statsUpDesc = prometheus.NewDesc("pgpilot_stats_up",
		"Whether the last query batch for the database statistics succeeded (1) or not (0).", nil, nil)
	statsDurationDesc = prometheus.NewDesc("pgpilot_stats_duration_seconds",
		"How long the last query batch for the database statistics took.", nil, nil)

	customValidDesc = prometheus.NewDesc("pgpilot_custom_queries_valid",
		"Whether the custom queries' file (spec.monitoring.customQueries) is valid (1) or not (0, and none runs; the agent's log says why). Absent without custom queries.", nil, nil)
	customUpDesc = prometheus.NewDesc("pgpilot_custom_query_up",
		"Whether a custom query last succeeded on a database (1) or not (0, the agent's log says why).", []string{"query", "datname"}, nil)
	customDurationDesc = prometheus.NewDesc("pgpilot_custom_query_duration_seconds",
		"How long a custom query last took on a database.", []string{"query", "datname"}, nil)
)

var statsDescs = []*prometheus.Desc{
	dbSizeDesc, dbXIDAgeDesc, dbMXIDAgeDesc, dbCommitDesc, dbRollbackDesc, dbBlocksReadDesc, dbBlocksHitDesc,
	dbDeadlocksDesc, dbTempFilesDesc, dbTempBytesDesc, dbConflictsDesc, dbTuplesDesc,
	backendsDesc, maxConnectionsDesc, locksWaitingDesc, oldestXactDesc, oldestIdleXactDesc,
	checkpointsDesc, checkpointWriteDesc, checkpointSyncDesc, checkpointBuffersDesc,
	bgwriterCleanDesc, bgwriterMaxWrittenDesc, buffersAllocDesc,
	walBytesDesc, walRecordsDesc, walFPIDesc, walBuffersFullDesc,
	replicaLagSecondsDesc, statsUpDesc, statsDurationDesc,
	customValidDesc, customUpDesc, customDurationDesc,
}

// statsCollector exports an instance's Stats, through the cache, but for the custom
// queries' samples.
type statsCollector struct {
	cache *statsCache
	log   logr.Logger
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range statsDescs {
		ch <- d
	}
}

// emitter sends const metrics, skipping (and logging) the few a label value that is not
// UTF-8 makes invalid, so that one bad name never fails the whole scrape.
type emitter struct {
	ch  chan<- prometheus.Metric
	log logr.Logger
}

func (e emitter) send(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		e.log.Error(err, "Skipped a metric", "metric", d.String())
		return
	}
	e.ch <- m
}

func (e emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e.send(d, prometheus.GaugeValue, v, labels...)
}

func (e emitter) counter(d *prometheus.Desc, v float64, labels ...string) {
	e.send(d, prometheus.CounterValue, v, labels...)
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.cache.get()
	e := emitter{ch: ch, log: c.log}
	e.gauge(statsUpDesc, boolValue(st.Error == ""))
	e.gauge(statsDurationDesc, st.Duration.Seconds())
	collectDatabases(e, st.Databases)
	for state, n := range st.Backends {
		e.gauge(backendsDesc, float64(n), state)
	}
	if st.MaxConnections > 0 {
		e.gauge(maxConnectionsDesc, float64(st.MaxConnections))
		e.gauge(locksWaitingDesc, float64(st.LocksWaiting))
		e.gauge(oldestXactDesc, st.OldestTransactionSeconds)
		e.gauge(oldestIdleXactDesc, st.OldestIdleInTransactionSeconds)
	}
	if cp := st.Checkpointer; cp != nil {
		e.counter(checkpointsDesc, float64(cp.Timed), "timed")
		e.counter(checkpointsDesc, float64(cp.Requested), "requested")
		e.counter(checkpointWriteDesc, cp.WriteMillis/1000)
		e.counter(checkpointSyncDesc, cp.SyncMillis/1000)
		e.counter(checkpointBuffersDesc, float64(cp.BuffersWritten))
		e.counter(bgwriterCleanDesc, float64(cp.BuffersClean))
		e.counter(bgwriterMaxWrittenDesc, float64(cp.MaxWrittenClean))
		e.counter(buffersAllocDesc, float64(cp.BuffersAllocated))
	}
	if w := st.WAL; w != nil {
		e.counter(walBytesDesc, w.Bytes)
		e.counter(walRecordsDesc, float64(w.Records))
		e.counter(walFPIDesc, float64(w.FullPageImages))
		e.counter(walBuffersFullDesc, float64(w.BuffersFull))
	}
	seen := map[string]bool{}
	for _, r := range st.ReplicaLags {
		if seen[r.Name] {
			continue // an old walsender not gone yet: one series per standby
		}
		seen[r.Name] = true
		e.gauge(replicaLagSecondsDesc, r.WriteSeconds, r.Name, "write")
		e.gauge(replicaLagSecondsDesc, r.FlushSeconds, r.Name, "flush")
		e.gauge(replicaLagSecondsDesc, r.ReplaySeconds, r.Name, "replay")
	}
	collectCustomHealth(e, st)
}

func collectDatabases(e emitter, dbs []DatabaseStats) {
	for _, d := range dbs {
		e.gauge(dbSizeDesc, float64(d.SizeBytes), d.Name)
		e.gauge(dbXIDAgeDesc, float64(d.XIDAge), d.Name)
		e.gauge(dbMXIDAgeDesc, float64(d.MXIDAge), d.Name)
		e.counter(dbCommitDesc, float64(d.XactCommit), d.Name)
		e.counter(dbRollbackDesc, float64(d.XactRollback), d.Name)
		e.counter(dbBlocksReadDesc, float64(d.BlocksRead), d.Name)
		e.counter(dbBlocksHitDesc, float64(d.BlocksHit), d.Name)
		e.counter(dbDeadlocksDesc, float64(d.Deadlocks), d.Name)
		e.counter(dbTempFilesDesc, float64(d.TempFiles), d.Name)
		e.counter(dbTempBytesDesc, float64(d.TempBytes), d.Name)
		e.counter(dbConflictsDesc, float64(d.Conflicts), d.Name)
		for _, t := range []struct {
			op string
			n  int64
		}{{"returned", d.TuplesReturned}, {"fetched", d.TuplesFetched}, {"inserted", d.TuplesInserted},
			{"updated", d.TuplesUpdated}, {"deleted", d.TuplesDeleted}} {
			e.counter(dbTuplesDesc, float64(t.n), d.Name, t.op)
		}
	}
}

// collectCustomHealth exports how the custom queries fared.
func collectCustomHealth(e emitter, st Stats) {
	if !st.CustomConfigured {
		return
	}
	e.gauge(customValidDesc, boolValue(st.CustomConfigError == ""))
	for _, q := range st.CustomQueries {
		e.gauge(customUpDesc, boolValue(q.OK), q.Query, q.Database)
		e.gauge(customDurationDesc, q.Duration.Seconds(), q.Query, q.Database)
	}
}

// customCollector exports the custom queries' samples. Their names come from the
// user's file, so it is an unchecked collector: Describe sends nothing.
type customCollector struct {
	cache *statsCache
	log   logr.Logger
}

func (c *customCollector) Describe(chan<- *prometheus.Desc) {}

// Collect drops a sample whose name and labels repeat one already sent: a duplicate
// would fail the scrape.
func (c *customCollector) Collect(ch chan<- prometheus.Metric) {
	e := emitter{ch: ch, log: c.log}
	descs := map[string]*prometheus.Desc{}
	seen := map[string]bool{}
	for _, s := range c.cache.get().Custom {
		key := s.Name + "\xff" + joinNUL(s.LabelValues)
		if seen[key] {
			continue
		}
		seen[key] = true
		d, ok := descs[s.Name]
		if !ok {
			d = prometheus.NewDesc(s.Name, s.Help, s.LabelNames, nil)
			descs[s.Name] = d
		}
		if s.Counter {
			e.counter(d, s.Value, s.LabelValues...)
		} else {
			e.gauge(d, s.Value, s.LabelValues...)
		}
	}
}

func joinNUL(ss []string) string {
	var n int
	for _, s := range ss {
		n += len(s) + 1
	}
	b := make([]byte, 0, n)
	for _, s := range ss {
		b = append(append(b, s...), 0)
	}
	return string(b)
}
