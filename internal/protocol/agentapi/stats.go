package agentapi

import (
	"context"
	"sync"
	"time"
)

// Stats are an instance's database statistics, which GET /metrics exports beside its
// Status: one short batch of queries, made at most once per StatsOptions.CacheFor
// however many scrapes ask (docs/monitoring.md).
type Stats struct {
	// Databases are every database of the instance (pg_database, pg_stat_database).
	Databases []DatabaseStats
	// Backends counts client backends by state (pg_stat_activity.state; "unknown" when
	// not visible).
	Backends map[string]int
	// MaxConnections is the max_connections setting.
	MaxConnections int
	// LocksWaiting counts backends waiting for a lock.
	LocksWaiting int
	// OldestTransactionSeconds is the age of the oldest open transaction of a client
	// backend; OldestIdleInTransactionSeconds how long the longest idle one has been
	// idle in a transaction. 0 when there is none.
	OldestTransactionSeconds       float64
	OldestIdleInTransactionSeconds float64
	// Checkpointer and BGWriter are pg_stat_checkpointer and pg_stat_bgwriter (one view
	// before PostgreSQL 17); nil when unknown.
	Checkpointer *CheckpointerStats
	// WAL is pg_stat_wal; nil when unknown.
	WAL *WALStats
	// ReplicaLags are a primary's standbys' lag in time (pg_stat_replication).
	ReplicaLags []ReplicaLag
	// Custom are the samples of the user's custom queries; CustomQueries says how each
	// query fared, and CustomConfigError what is wrong with the queries' file ("" when
	// it is valid or there is none).
	Custom            []CustomSample
	CustomQueries     []CustomQueryRun
	CustomConfigured  bool
	CustomConfigError string
	// Duration is how long the batch took; Error is what failed ("" when nothing did).
	Duration time.Duration
	Error    string
}

// DatabaseStats is one database.
type DatabaseStats struct {
	Name                   string
	SizeBytes              int64
	XIDAge, MXIDAge        int64
	XactCommit             int64
	XactRollback           int64
	BlocksRead, BlocksHit  int64
	Deadlocks              int64
	TempFiles, TempBytes   int64
	Conflicts              int64
	TuplesReturned         int64
	TuplesFetched          int64
	TuplesInserted         int64
	TuplesUpdated          int64
	TuplesDeleted          int64
	TransactionsInProgress int64
}

// CheckpointerStats are the checkpointer's and background writer's counters.
type CheckpointerStats struct {
	Timed, Requested int64
	WriteMillis      float64
	SyncMillis       float64
	BuffersWritten   int64
	BuffersClean     int64
	MaxWrittenClean  int64
	BuffersAllocated int64
}

// WALStats is pg_stat_wal.
type WALStats struct {
	Records, FullPageImages int64
	Bytes                   float64
	BuffersFull             int64
}

// ReplicaLag is one standby's lag in time, as its primary measured it
// (pg_stat_replication): 0 once it has caught up and no WAL is written.
type ReplicaLag struct {
	Name                                      string
	WriteSeconds, FlushSeconds, ReplaySeconds float64
}

// CustomSample is one sample of a custom query.
type CustomSample struct {
	// Name is the metric's name (<query>_<column>); Help its description.
	Name, Help string
	// Counter: a counter, else a gauge.
	Counter bool
	// LabelNames and LabelValues go together; every sample of one Name has the same
	// LabelNames.
	LabelNames, LabelValues []string
	Value                   float64
}

// CustomQueryRun is how one custom query fared on one database.
type CustomQueryRun struct {
	Query, Database string
	OK              bool
	Duration        time.Duration
	Error           string
}

// StatsInstance is an Instance that reports database statistics.
type StatsInstance interface {
	// Stats queries the statistics; it never fails, errors go into Stats.Error.
	Stats(ctx context.Context) Stats
}

// DefaultStatsCacheFor is how long one batch of statistics answers scrapes.
const DefaultStatsCacheFor = 5 * time.Second

// statsCache makes at most one Stats call per cacheFor: concurrent scrapes wait for
// the call under way and share its answer.
type statsCache struct {
	inst     StatsInstance
	cacheFor time.Duration
	timeout  time.Duration
	now      func() time.Time

	mu    sync.Mutex
	at    time.Time
	stats Stats
	calls int
}

func (c *statsCache) get() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.calls > 0 && now.Sub(c.at) < c.cacheFor {
		return c.stats
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	c.stats = c.inst.Stats(ctx)
	c.at = c.now()
	c.calls++
	return c.stats
}
