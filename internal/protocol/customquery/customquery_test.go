package customquery

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string
		want    []Query
		wantErr []string
	}{
		{
			name: "postgres_exporter's format",
			file: `
pg_app_orders:
  query: "SELECT status, count(*) AS orders, 1 AS ignored FROM orders GROUP BY status"
  target_databases: [app]
  cache_seconds: 30
  metrics:
    - status: {usage: LABEL, description: Order status}
    - orders: {usage: GAUGE, description: Orders in the status}
    - ignored: {usage: DISCARD}
backends_total:
  query: SELECT count(*) AS backends FROM pg_stat_activity
  master: true
  metrics:
    - backends: {usage: counter}
`,
			want: []Query{
				{Name: "backends_total", Query: "SELECT count(*) AS backends FROM pg_stat_activity", Primary: true,
					Columns: []Column{{Name: "backends", Usage: Counter}}},
				{Name: "pg_app_orders", Query: "SELECT status, count(*) AS orders, 1 AS ignored FROM orders GROUP BY status",
					Databases: []string{"app"}, Columns: []Column{
						{Name: "status", Usage: Label, Description: "Order status"},
						{Name: "orders", Usage: Gauge, Description: "Orders in the status"},
						{Name: "ignored", Usage: Discard},
					}},
			},
		},
		{name: "not YAML", file: "{", wantErr: []string{"not a queries file"}},
		{name: "unknown key", file: "q:\n  query: SELECT 1 AS a\n  metrics: [{a: {usage: GAUGE}}]\n  typo: 1\n", wantErr: []string{"typo"}},
		{
			name: "every problem named",
			file: `
pgpilot_mine:
  query: SELECT 1 AS a
  metrics: [{a: {usage: GAUGE}}]
bad-name:
  query: ""
  metrics: [{a: {usage: SUMMARY}}, {datname: {usage: LABEL}}]
onlylabels:
  query: SELECT 'x' AS l
  target_databases: ["app; drop"]
  metrics: [{l: {usage: LABEL}}]
nometrics:
  query: SELECT 1
`,
			wantErr: []string{
				"pgpilot_mine: names starting with pgpilot_ are pgpilot's own",
				"bad-name: the name must be a Prometheus metric name",
				"bad-name: no query",
				`bad-name: column a: usage "SUMMARY"`,
				"bad-name: column datname: the label datname is pgpilot's",
				`onlylabels: target database "app; drop" is not a plain database name`,
				"onlylabels: no GAUGE or COUNTER column",
				"nometrics: metrics must list 1 to 32 columns",
			},
		},
		{
			name:    "one metric from two queries",
			file:    "a:\n  query: SELECT 1 AS b_c\n  metrics: [{b_c: {usage: GAUGE}}]\na_b:\n  query: SELECT 1 AS c\n  metrics: [{c: {usage: GAUGE}}]\n",
			wantErr: []string{"a_b: metric a_b_c is also made by a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.file))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Parse = %v, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLabelNames(t *testing.T) {
	q := Query{Columns: []Column{{Name: "a", Usage: Label}, {Name: "v", Usage: Gauge}, {Name: "b", Usage: Label}}}
	if diff := cmp.Diff([]string{"a", "b", "datname"}, q.LabelNames()); diff != "" {
		t.Error(diff)
	}
}
