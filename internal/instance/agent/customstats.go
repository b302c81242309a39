package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/customquery"
)

// customQueryTimeout bounds each custom query (statement_timeout) and its connection.
const customQueryTimeout = 2 * time.Second

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
			samples, err := a.db.customQuery(ctx, q, db)
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
	conn, err := a.db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%[1]s') THEN
			CREATE ROLE %[1]s LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
		END IF; END $$`, pgconf.MonitorUser)); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "GRANT pg_monitor TO "+pgconf.MonitorUser); err != nil {
		return err
	}
	a.custom.mu.Lock()
	a.custom.roleMade = true
	a.custom.mu.Unlock()
	return nil
}

// customQuery runs q on database db as pgconf.MonitorUser, in a read-only session, and turns
// its rows into samples.
func (d *DB) customQuery(ctx context.Context, q customquery.Query, db string) ([]agentapi.CustomSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*customQueryTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database = d.SocketDir, uint16(d.Port), pgconf.MonitorUser, db
	cfg.RuntimeParams["application_name"] = metricsApplicationName
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	cfg.RuntimeParams["statement_timeout"] = strconv.Itoa(int(customQueryTimeout.Milliseconds()))
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A role of this name made by someone else could be a superuser: refuse it.
	var super bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		return nil, err
	}
	if super {
		return nil, fmt.Errorf("role %s is a superuser: custom queries run only as a role without privileges beyond pg_monitor", pgconf.MonitorUser)
	}
	rows, err := conn.Query(ctx, q.Query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return collectSamples(rows, q, db)
}

// collectSamples turns a custom query's rows into samples: one per value column and
// row, labelled by its label columns and the database.
func collectSamples(rows pgx.Rows, q customquery.Query, db string) ([]agentapi.CustomSample, error) {
	labelNames := q.LabelNames()
	var out []agentapi.CustomSample
	var pos map[string]int
	for rows.Next() {
		if pos == nil {
			// The columns are known once a row came: an error of the query comes
			// instead of one, from rows.Err.
			var err error
			if pos, err = columns(rows, q); err != nil {
				return nil, err
			}
		}
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		var labels []string
		for _, c := range q.Columns {
			if c.Usage == customquery.Label {
				labels = append(labels, labelValue(vals[pos[c.Name]]))
			}
		}
		labels = append(labels, db)
		for _, c := range q.Columns {
			if c.Usage != customquery.Gauge && c.Usage != customquery.Counter {
				continue
			}
			v, err := floatValue(vals[pos[c.Name]])
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", c.Name, err)
			}
			help := c.Description
			if help == "" {
				help = "Custom query " + q.Name + ", column " + c.Name + "."
			}
			out = append(out, agentapi.CustomSample{Name: q.Name + "_" + c.Name, Help: help, Counter: c.Usage == customquery.Counter,
				LabelNames: labelNames, LabelValues: labels, Value: v})
		}
	}
	return out, rows.Err()
}

// columns maps the columns q uses to their positions in the result.
func columns(rows pgx.Rows, q customquery.Query) (map[string]int, error) {
	pos := map[string]int{}
	for i, f := range rows.FieldDescriptions() {
		pos[f.Name] = i
	}
	for _, c := range q.Columns {
		if _, ok := pos[c.Name]; !ok && c.Usage != customquery.Discard {
			return nil, fmt.Errorf("the result has no column %s", c.Name)
		}
	}
	return pos, nil
}

func labelValue(v any) string {
	if v == nil {
		return ""
	}
	if t, ok := v.(time.Time); ok {
		return t.UTC().Format(time.RFC3339)
	}
	return fmt.Sprint(v)
}

// floatValue is a value column's number; NULL is NaN.
func floatValue(v any) (float64, error) {
	switch x := v.(type) {
	case nil:
		return math.NaN(), nil
	case int16:
		return float64(x), nil
	case int32:
		return float64(x), nil
	case int64:
		return float64(x), nil
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case time.Time:
		return float64(x.UnixNano()) / 1e9, nil
	case pgtype.Numeric:
		f, err := x.Float64Value()
		if err != nil {
			return 0, err
		}
		return f.Float64, nil
	case string:
		return strconv.ParseFloat(x, 64)
	}
	return 0, fmt.Errorf("a %T is not a number", v)
}
