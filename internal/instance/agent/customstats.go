package agent

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/customquery"
)

// customQueries is the custom queries' file as last read, read again when it changed
// (the kubelet updates a mounted ConfigMap in place).
type customQueries struct {
	mu      sync.Mutex
	modTime time.Time
	size    int64
	read    bool
	queries []customquery.Query
	err     error
	// roleMade: this agent made sure pgconf.MonitorUser exists, as a primary.
	roleMade bool
	// reported is the last failure logged per query and database ("" for the file):
	// a failure is logged when it starts or changes, not at every scrape.
	reported map[string]string
}

// changed records msg as key's last failure ("" for none) and reports whether it is new.
func (c *customQueries) changed(key, msg string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reported == nil {
		c.reported = map[string]string{}
	}
	if c.reported[key] == msg {
		return false
	}
	c.reported[key] = msg
	return msg != ""
}

func (c *customQueries) load(path string) ([]customquery.Query, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(path)
	if err != nil {
		c.read = false
		if errors.Is(err, os.ErrNotExist) {
			return nil, errors.New("the custom queries' ConfigMap or its key does not exist (spec.monitoring.customQueries)")
		}
		return nil, err
	}
	if c.read && fi.ModTime().Equal(c.modTime) && fi.Size() == c.size {
		return c.queries, c.err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c.modTime, c.size, c.read = fi.ModTime(), fi.Size(), true
	c.queries, c.err = customquery.Parse(data)
	return c.queries, c.err
}

// customStats runs the custom queries, if any, into st. Each failure is reported for
// its query and database alone; none fails the scrape.
func (a *Agent) customStats(ctx context.Context, st *agentapi.Stats, primary bool) {
	if a.cfg.CustomQueriesPath == "" {
		return
	}
	st.CustomConfigured = true
	queries, err := a.custom.load(a.cfg.CustomQueriesPath)
	if err != nil {
		st.CustomConfigError = err.Error()
		if a.custom.changed("", err.Error()) {
			a.log.Info("Custom queries not run", "file", a.cfg.CustomQueriesPath, "reason", err.Error())
		}
		return
	}
	a.custom.changed("", "")
	if st.Error != "" && st.Databases == nil {
		return // postgres does not answer
	}
	if primary {
		if err := a.ensureMonitorUser(ctx); err != nil {
			a.log.Error(err, "Failed to create the custom queries' role", "role", pgconf.MonitorUser)
		}
	}
	for _, q := range queries {
		if q.Primary && !primary {
			continue
		}
		dbs := q.Databases
		if len(dbs) == 0 {
			dbs = []string{"postgres"}
		}
		for _, db := range dbs {
			start := time.Now()
			samples, err := a.db.CustomQuery(ctx, q, db)
			run := agentapi.CustomQueryRun{Query: q.Name, Database: db, OK: err == nil, Duration: time.Since(start)}
			if err != nil {
				run.Error = err.Error()
			}
			if a.custom.changed(q.Name+"\x00"+db, run.Error) {
				a.log.Info("Custom query failed", "query", q.Name, "database", db, "reason", run.Error)
			}
			st.CustomQueries = append(st.CustomQueries, run)
			st.Custom = append(st.Custom, samples...)
		}
	}
}

// ensureMonitorUser creates pgconf.MonitorUser on the primary, once per agent; standbys get it
// by replication.
func (a *Agent) ensureMonitorUser(ctx context.Context) error {
	a.custom.mu.Lock()
	done := a.custom.roleMade
	a.custom.mu.Unlock()
	if done {
		return nil
	}
	if err := a.db.EnsureMonitorUser(ctx); err != nil {
		return err
	}
	a.custom.mu.Lock()
	a.custom.roleMade = true
	a.custom.mu.Unlock()
	return nil
}
