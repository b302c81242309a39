// Package customquery parses and checks the custom queries a user gives the agents in a
// ConfigMap (spec.monitoring.customQueries): the format of postgres_exporter's and
// CloudNativePG's queries files, so that existing files work as they are.
package customquery

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultKey is the ConfigMap key read when spec.monitoring.customQueries names none.
const DefaultKey = "queries.yaml"

// Limits of a queries file: every query runs at every scrape (cached for a few
// seconds), on every instance.
const (
	MaxQueries   = 50
	MaxDatabases = 10
	MaxColumns   = 32
)

// Usage is what a column of a query's result is.
type Usage string

// Column usages, as postgres_exporter names them.
const (
	Label   Usage = "LABEL"
	Gauge   Usage = "GAUGE"
	Counter Usage = "COUNTER"
	Discard Usage = "DISCARD"
)

// Column is one column of a query's result.
type Column struct {
	Name        string
	Usage       Usage
	Description string
}

// Query is one custom query.
type Query struct {
	// Name prefixes its metrics: <Name>_<column>.
	Name  string
	Query string
	// Databases it runs on; the instance's "postgres" database when none is given.
	Databases []string
	Columns   []Column
	// Primary runs it only on the primary (for queries of tables a standby may lag on).
	Primary bool
}

// rawQuery is one entry of the file.
type rawQuery struct {
	Query           string                 `json:"query"`
	Metrics         []map[string]rawColumn `json:"metrics"`
	TargetDatabases []string               `json:"target_databases"`
	Primary         bool                   `json:"primary"`
	Master          bool                   `json:"master"`
	// Accepted for files written for other exporters, and ignored: every query's
	// result is kept for the agent's own cache time, and runs on every PostgreSQL
	// version pgpilot supports.
	CacheSeconds int    `json:"cache_seconds"`
	RunOnServer  string `json:"runonserver"`
}

type rawColumn struct {
	Usage       string `json:"usage"`
	Description string `json:"description"`
}

var (
	nameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	// dbRE is what a database name may be here: no quoting games in connection strings.
	dbRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*$`)
	// reserved are the prefixes of pgpilot's own series and of the Go and process
	// collectors': a custom metric must not be mistaken for one.
	reserved = []string{"pgpilot_", "go_", "process_", "promhttp_"}
)

// Parse reads a queries file and checks every query; the error names each problem
// (query and column) so that a person can mend the file. Queries come sorted by name.
func Parse(data []byte) ([]Query, error) {
	raw := map[string]rawQuery{}
	if err := yaml.UnmarshalStrict(data, &raw); err != nil {
		return nil, fmt.Errorf("not a queries file (YAML: name: {query, metrics, target_databases}): %w", err)
	}
	if len(raw) > MaxQueries {
		return nil, fmt.Errorf("%d queries, at most %d", len(raw), MaxQueries)
	}
	names := make([]string, 0, len(raw))
	for n := range raw {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Query
	var problems []string
	metricNames := map[string]string{}
	for _, n := range names {
		q, errs := check(n, raw[n])
		problems = append(problems, errs...)
		for _, c := range q.Columns {
			if c.Usage == Label || c.Usage == Discard {
				continue
			}
			m := n + "_" + c.Name
			if other, dup := metricNames[m]; dup {
				problems = append(problems, fmt.Sprintf("%s: metric %s is also made by %s", n, m, other))
			}
			metricNames[m] = n
		}
		out = append(out, q)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return out, nil
}

func check(name string, r rawQuery) (Query, []string) {
	q := Query{Name: name, Query: strings.TrimSpace(r.Query), Databases: r.TargetDatabases, Primary: r.Primary || r.Master}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, name+": "+fmt.Sprintf(format, args...)) }
	if !nameRE.MatchString(name) {
		bad("the name must be a Prometheus metric name ([a-zA-Z_][a-zA-Z0-9_]*)")
	}
	for _, p := range reserved {
		if strings.HasPrefix(name, p) {
			bad("names starting with %s are pgpilot's own", p)
		}
	}
	if q.Query == "" {
		bad("no query")
	}
	if len(q.Databases) > MaxDatabases {
		bad("%d target_databases, at most %d", len(q.Databases), MaxDatabases)
	}
	for _, db := range q.Databases {
		if !dbRE.MatchString(db) {
			bad("target database %q is not a plain database name", db)
		}
	}
	if len(r.Metrics) == 0 || len(r.Metrics) > MaxColumns {
		bad("metrics must list 1 to %d columns", MaxColumns)
	}
	values, labels := 0, map[string]bool{}
	for _, m := range r.Metrics {
		if len(m) != 1 {
			bad("each item of metrics is one column: {column: {usage, description}}")
			continue
		}
		for col, rc := range m {
			c := Column{Name: col, Usage: Usage(strings.ToUpper(rc.Usage)), Description: rc.Description}
			if !nameRE.MatchString(col) {
				bad("column %q is not a metric or label name", col)
			}
			switch c.Usage {
			case Gauge, Counter:
				values++
			case Label:
				if labels[col] {
					bad("label %s twice", col)
				}
				labels[col] = true
			case Discard:
			default:
				bad("column %s: usage %q, want LABEL, GAUGE, COUNTER or DISCARD", col, rc.Usage)
			}
			if col == "datname" && c.Usage == Label {
				bad("column datname: the label datname is pgpilot's (the database the query ran on)")
			}
			q.Columns = append(q.Columns, c)
		}
	}
	if values == 0 && len(r.Metrics) > 0 {
		bad("no GAUGE or COUNTER column")
	}
	return q, problems
}

// LabelNames are the labels of q's metrics: its LABEL columns, then datname.
func (q Query) LabelNames() []string {
	var out []string
	for _, c := range q.Columns {
		if c.Usage == Label {
			out = append(out, c.Name)
		}
	}
	return append(out, "datname")
}
