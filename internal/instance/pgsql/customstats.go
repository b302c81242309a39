package pgsql

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/customquery"
)

// customQueryTimeout bounds each custom query (statement_timeout) and its connection.
const customQueryTimeout = 2 * time.Second

// CustomQuery runs q on database db as pgconf.MonitorUser, in a read-only session, and turns
// its rows into samples.
func (d *DB) CustomQuery(ctx context.Context, q customquery.Query, db string) ([]agentapi.CustomSample, error) {
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

// EnsureMonitorUser creates pgconf.MonitorUser, the custom queries' login, with
// pg_monitor; on the primary only, standbys get it by replication.
func (d *DB) EnsureMonitorUser(ctx context.Context) error {
	conn, err := d.connect(ctx)
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
	return nil
}
