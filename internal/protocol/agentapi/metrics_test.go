package agentapi

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// metricHelp pins each metric's HELP text; expected texts are built from it.
var metricHelp = map[string]string{
	"pgpilot_instance_up":                    "Whether the PostgreSQL postmaster is running (1) or not (0).",
	"pgpilot_instance_ready":                 "Whether PostgreSQL accepts connections in its role (1) or not (0).",
	"pgpilot_instance_role":                  "The instance's role: 1 for the role it has now, 0 for the others.",
	"pgpilot_instance_timeline":              "The PostgreSQL timeline ID the instance is on (0 when unknown).",
	"pgpilot_instance_wal_lsn_bytes":         "WAL position as a byte offset: kind=write is a primary's write position, kind=received the last position a replica received and flushed, kind=replayed the last one it replayed.",
	"pgpilot_instance_replication_lag_bytes": "Bytes of WAL a replica has received but not replayed yet (0 on a primary).",
	"pgpilot_instance_replicas":              "Number of standbys streaming from this instance (rows of pg_stat_replication).",
	"pgpilot_replica_lag_bytes":              "Bytes a standby's flush position is behind this primary's write position, per standby.",
	"pgpilot_instance_fenced":                "Whether the agent was told to stop accepting writes (1) or not (0).",
	"pgpilot_instance_start_time_seconds":    "When the postmaster last started, in seconds since the Unix epoch.",
}

// metricNames are the names the instance collector can export, in the order of the
// expected texts.
var metricNames = []string{
	"pgpilot_instance_up", "pgpilot_instance_ready", "pgpilot_instance_role", "pgpilot_instance_timeline",
	"pgpilot_instance_wal_lsn_bytes", "pgpilot_instance_replication_lag_bytes", "pgpilot_instance_replicas",
	"pgpilot_replica_lag_bytes", "pgpilot_instance_fenced", "pgpilot_instance_start_time_seconds",
}

// exposition builds Prometheus text from metric name → sample lines; names without
// samples are left out.
func exposition(samples map[string][]string) string {
	var b strings.Builder
	for _, name := range metricNames {
		if len(samples[name]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, metricHelp[name], name)
		for _, s := range samples[name] {
			fmt.Fprintf(&b, "%s%s\n", name, s)
		}
	}
	return b.String()
}

func roleSamples(current string) []string {
	var out []string
	for _, r := range []string{RolePrimary, RoleReplica, RoleFenced, RoleStarting, RoleStopped, RoleUpgrading} {
		v := 0
		if r == current {
			v = 1
		}
		out = append(out, fmt.Sprintf(`{role=%q} %d`, r, v))
	}
	return out
}

func TestMetrics(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status Status
		want   map[string][]string
	}{
		{
			name:   "primary with replicas",
			status: primaryStatus(),
			want: map[string][]string{
				"pgpilot_instance_up":                    {" 1"},
				"pgpilot_instance_ready":                 {" 1"},
				"pgpilot_instance_role":                  roleSamples(RolePrimary),
				"pgpilot_instance_timeline":              {" 4"},
				"pgpilot_instance_wal_lsn_bytes":         {`{kind="write"} 4294967296`},
				"pgpilot_instance_replication_lag_bytes": {" 0"},
				"pgpilot_instance_replicas":              {" 2"},
				"pgpilot_replica_lag_bytes": {
					`{replica="my-db-1",sync_state="sync"} 256`,
					`{replica="my-db-2",sync_state="async"} 268435456`,
				},
				"pgpilot_instance_fenced":             {" 0"},
				"pgpilot_instance_start_time_seconds": {" 1741064767"},
			},
		},
		{
			name:   "replica",
			status: replicaStatus(),
			want: map[string][]string{
				"pgpilot_instance_up":       {" 1"},
				"pgpilot_instance_ready":    {" 1"},
				"pgpilot_instance_role":     roleSamples(RoleReplica),
				"pgpilot_instance_timeline": {" 3"},
				"pgpilot_instance_wal_lsn_bytes": {
					`{kind="received"} 97500059720`,
					`{kind="replayed"} 97500004352`,
				},
				"pgpilot_instance_replication_lag_bytes": {" 55368"},
				"pgpilot_instance_replicas":              {" 0"},
				"pgpilot_instance_fenced":                {" 0"},
				"pgpilot_instance_start_time_seconds":    {" 1741064767.8"},
			},
		},
		{
			name:   "stopped",
			status: Status{Pod: "my-db-2", Role: RoleStopped, Error: "postgres exited"},
			want: map[string][]string{
				"pgpilot_instance_up":                    {" 0"},
				"pgpilot_instance_ready":                 {" 0"},
				"pgpilot_instance_role":                  roleSamples(RoleStopped),
				"pgpilot_instance_timeline":              {" 0"},
				"pgpilot_instance_replication_lag_bytes": {" 0"},
				"pgpilot_instance_replicas":              {" 0"},
				"pgpilot_instance_fenced":                {" 0"},
			},
		},
		{
			name: "fenced, a malformed LSN and a standby listed twice",
			status: Status{
				Role: RoleFenced, Running: true, Fenced: true, Timeline: 2, WriteLSN: "not an LSN",
				Replicas: []ReplicaStatus{
					{Name: "my-db-1", SyncState: "async", LagBytes: 10},
					{Name: "my-db-1", SyncState: "async", LagBytes: 30},
					{Name: "my-db-1", SyncState: "async", LagBytes: 20},
					{Name: "my-db-2", SyncState: "async", LagBytes: 5},
				},
			},
			want: map[string][]string{
				"pgpilot_instance_up":                    {" 1"},
				"pgpilot_instance_ready":                 {" 0"},
				"pgpilot_instance_role":                  roleSamples(RoleFenced),
				"pgpilot_instance_timeline":              {" 2"},
				"pgpilot_instance_replication_lag_bytes": {" 0"},
				"pgpilot_instance_replicas":              {" 4"},
				"pgpilot_replica_lag_bytes": {
					`{replica="my-db-1",sync_state="async"} 30`,
					`{replica="my-db-2",sync_state="async"} 5`,
				},
				"pgpilot_instance_fenced": {" 1"},
			},
		},
		{
			name:   "unknown role",
			status: Status{Role: "rewinding"},
			want: map[string][]string{
				"pgpilot_instance_up":                    {" 0"},
				"pgpilot_instance_ready":                 {" 0"},
				"pgpilot_instance_role":                  roleSamples(""),
				"pgpilot_instance_timeline":              {" 0"},
				"pgpilot_instance_replication_lag_bytes": {" 0"},
				"pgpilot_instance_replicas":              {" 0"},
				"pgpilot_instance_fenced":                {" 0"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			NewServer(newFakeInstance(tc.status), ServerOptions{Registry: reg})
			if err := testutil.GatherAndCompare(reg, strings.NewReader(exposition(tc.want)), metricNames...); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestMetricsReadStatusAtScrape(t *testing.T) {
	inst := newFakeInstance(replicaStatus())
	reg := prometheus.NewRegistry()
	NewServer(inst, ServerOptions{Registry: reg})

	want := func(role string) string {
		return exposition(map[string][]string{"pgpilot_instance_role": roleSamples(role)})
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(RoleReplica)), "pgpilot_instance_role"); err != nil {
		t.Error(err)
	}
	inst.mu.Lock()
	inst.status.Role = RolePrimary
	inst.mu.Unlock()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(RolePrimary)), "pgpilot_instance_role"); err != nil {
		t.Error(err)
	}
}

func TestMetricsLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(&instanceCollector{inst: newFakeInstance(primaryStatus()), timeout: DefaultRequestTimeout})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	// Prometheus scrapes with the metrics token.
	creds := Tokens(map[Purpose]string{Metrics: "scrape-token"})
	h := NewServer(newFakeInstance(primaryStatus()), ServerOptions{Credentials: creds}).Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer scrape-token")
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	url := ts.URL + PathMetrics
	want := exposition(map[string][]string{
		"pgpilot_instance_up":       {" 1"},
		"pgpilot_instance_replicas": {" 2"},
	})
	if err := testutil.ScrapeAndCompare(url, strings.NewReader(want), "pgpilot_instance_up", "pgpilot_instance_replicas"); err != nil {
		t.Error(err)
	}

	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(string(body), "\n"+name+" ") {
			t.Errorf("no %s in /metrics", name)
		}
	}
}

func TestRegistryWithRuntimeCollectors(t *testing.T) {
	// A registry that already has the Go and process collectors (as controller-runtime's
	// does) is fine.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	NewServer(newFakeInstance(Status{}), ServerOptions{Registry: reg})
	if n, err := testutil.GatherAndCount(reg, "pgpilot_instance_up", "go_goroutines"); err != nil || n != 2 {
		t.Errorf("GatherAndCount = %d, %v; want 2", n, err)
	}

	// A second Server on the same registry is a programming error.
	defer func() {
		if recover() == nil {
			t.Error("a second Server on one registry did not panic")
		}
	}()
	NewServer(newFakeInstance(Status{}), ServerOptions{Registry: reg})
}

// Connections and replication slots are exported, one series per slot even when the
// status lists a slot twice.
func TestMetricsConnectionsAndSlots(t *testing.T) {
	st := primaryStatus()
	st.Connections = 7
	st.Slots = []SlotStatus{
		{Name: "pgpilot_db_1", Active: true, RetainedBytes: 4096},
		{Name: "pgpilot_db_2", Active: false, RetainedBytes: 1 << 30},
		{Name: "pgpilot_db_2", Active: false, RetainedBytes: 1},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&instanceCollector{inst: newFakeInstance(st), timeout: DefaultRequestTimeout})
	want := `# HELP pgpilot_instance_connections Client backends connected to postgres (pg_stat_activity).
# TYPE pgpilot_instance_connections gauge
pgpilot_instance_connections 7
# HELP pgpilot_replication_slot_active Whether a replication slot is in use (1) or not (0).
# TYPE pgpilot_replication_slot_active gauge
pgpilot_replication_slot_active{slot="pgpilot_db_1"} 1
pgpilot_replication_slot_active{slot="pgpilot_db_2"} 0
# HELP pgpilot_replication_slot_retained_bytes WAL bytes a replication slot keeps on disk.
# TYPE pgpilot_replication_slot_retained_bytes gauge
pgpilot_replication_slot_retained_bytes{slot="pgpilot_db_1"} 4096
pgpilot_replication_slot_retained_bytes{slot="pgpilot_db_2"} 1.073741824e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"pgpilot_instance_connections", "pgpilot_replication_slot_active", "pgpilot_replication_slot_retained_bytes"); err != nil {
		t.Error(err)
	}
}

func TestMetricsPendingRestart(t *testing.T) {
	st := replicaStatus()
	st.PendingRestart = []PendingSetting{{Name: "max_connections", Value: "100", Pending: "200"}, {Name: "shared_buffers", Value: "128MB", Pending: "160MB"}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&instanceCollector{inst: newFakeInstance(st), timeout: DefaultRequestTimeout})
	want := `# HELP pgpilot_pending_restart Settings of postgresql.conf that wait for a restart of postgres (pg_settings.pending_restart), one series each.
# TYPE pgpilot_pending_restart gauge
pgpilot_pending_restart{setting="max_connections"} 1
pgpilot_pending_restart{setting="shared_buffers"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_pending_restart"); err != nil {
		t.Error(err)
	}
}

func TestMetricsArchiver(t *testing.T) {
	archived := time.Date(2026, 11, 21, 14, 0, 0, 0, time.UTC)
	failed := archived.Add(time.Minute)
	st := primaryStatus()
	st.Archiver = &ArchiverStatus{Enabled: true, ArchivedCount: 12, LastArchivedAt: &archived,
		FailedCount: 3, LastFailedAt: &failed, Pending: 2, PendingBytes: 32 << 20}
	st.VolumeBytes, st.VolumeFreeBytes, st.VolumeFullInSeconds = 1<<30, 256<<20, 1500
	reg := prometheus.NewRegistry()
	reg.MustRegister(&instanceCollector{inst: newFakeInstance(st), timeout: DefaultRequestTimeout})
	want := `# HELP pgpilot_wal_archive_failed_total Failed attempts to archive a WAL file (pg_stat_archiver).
# TYPE pgpilot_wal_archive_failed_total counter
pgpilot_wal_archive_failed_total 3
# HELP pgpilot_wal_archive_failing Whether the last attempt to archive WAL failed (1) or not (0).
# TYPE pgpilot_wal_archive_failing gauge
pgpilot_wal_archive_failing 1
# HELP pgpilot_wal_archive_pending WAL segments waiting to be archived; they stay on the primary's volume until they are.
# TYPE pgpilot_wal_archive_pending gauge
pgpilot_wal_archive_pending 2
# HELP pgpilot_wal_archive_pending_bytes Bytes of the WAL segments waiting to be archived.
# TYPE pgpilot_wal_archive_pending_bytes gauge
pgpilot_wal_archive_pending_bytes 3.3554432e+07
# HELP pgpilot_wal_archived_total WAL files this primary archived since its statistics were reset (pg_stat_archiver).
# TYPE pgpilot_wal_archived_total counter
pgpilot_wal_archived_total 12
# HELP pgpilot_wal_last_archived_time_seconds When a WAL file was last archived, in seconds since the Unix epoch.
# TYPE pgpilot_wal_last_archived_time_seconds gauge
pgpilot_wal_last_archived_time_seconds 1.7952696e+09
# HELP pgpilot_volume_full_in_seconds How long until the data volume is full at the rate its free space went down over the last 10 minutes; absent when it is not filling.
# TYPE pgpilot_volume_full_in_seconds gauge
pgpilot_volume_full_in_seconds 1500
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_wal_archive_failed_total",
		"pgpilot_wal_archive_failing", "pgpilot_wal_archive_pending", "pgpilot_wal_archive_pending_bytes", "pgpilot_wal_archived_total",
		"pgpilot_wal_last_archived_time_seconds", "pgpilot_volume_full_in_seconds"); err != nil {
		t.Error(err)
	}
}

// The walsenders that took the commit gate's name, terminated, are a counter.
func TestGateImpostorsMetric(t *testing.T) {
	st := primaryStatus()
	st.GateImpostorsTerminated = 2
	reg := prometheus.NewRegistry()
	NewServer(newFakeInstance(st), ServerOptions{Registry: reg})
	want := "# HELP pgpilot_gate_impostors_terminated_total Replication connections that took the commit gate's name and that the agent terminated since it started.\n" +
		"# TYPE pgpilot_gate_impostors_terminated_total counter\npgpilot_gate_impostors_terminated_total 2\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_gate_impostors_terminated_total"); err != nil {
		t.Error(err)
	}
}
