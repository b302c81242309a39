// Package dashboard builds pgpilot's Grafana dashboard: one cluster's instances,
// replication, activity, WAL, storage, archiving and backups, and the operator. The
// chart ships it in a ConfigMap for Grafana's dashboard sidecar (helm-charts/
// postgrescluster/dashboards/pgpilot.json; make manifests writes it, and a test checks
// it is current).
package dashboard

import (
	"encoding/json"
	"strings"
)

// Placeholders the chart replaces with the cluster's namespace and name: each cluster
// gets a dashboard of its own (uid pgpilot-<namespace>-<name>).
const (
	NamespacePlaceholder = "PGPILOT_NAMESPACE"
	ClusterPlaceholder   = "PGPILOT_CLUSTER"
)

// sel selects the cluster's series; extra matchers follow it.
func sel(extra ...string) string {
	return `{` + strings.Join(append([]string{`namespace="$namespace"`, `cluster="$cluster"`}, extra...), ", ") + `}`
}

// m is a metric selected for the cluster.
func m(name string, extra ...string) string { return name + sel(extra...) }

type target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat,omitempty"`
	RefID        string `json:"refId"`
	Instant      bool   `json:"instant,omitempty"`
}

type panel struct {
	ID          int               `json:"id"`
	Type        string            `json:"type"`
	Title       string            `json:"title"`
	Description string            `json:"description,omitempty"`
	GridPos     map[string]int    `json:"gridPos"`
	Datasource  map[string]string `json:"datasource,omitempty"`
	Targets     []target          `json:"targets,omitempty"`
	FieldConfig map[string]any    `json:"fieldConfig,omitempty"`
	Options     map[string]any    `json:"options,omitempty"`
	Collapsed   *bool             `json:"collapsed,omitempty"`
	Panels      []panel           `json:"panels,omitempty"`
}

// builder lays panels out on Grafana's 24-column grid.
type builder struct {
	panels []panel
	x, y   int
	id     int
}

func (b *builder) row(title string) {
	if b.x > 0 {
		b.x, b.y = 0, b.y+8
	}
	b.id++
	no := false
	b.panels = append(b.panels, panel{ID: b.id, Type: "row", Title: title, Collapsed: &no, GridPos: map[string]int{"x": 0, "y": b.y, "w": 24, "h": 1}})
	b.y++
}

// add lays out a panel w columns wide (8 high, or 4 for a stat).
func (b *builder) add(kind, title, unit, description string, w int, targets ...target) {
	h := 8
	if kind == "stat" {
		h = 4
	}
	if b.x+w > 24 {
		b.x, b.y = 0, b.y+8
	}
	b.id++
	for i := range targets {
		targets[i].RefID = string(rune('A' + i))
		targets[i].Instant = kind == "stat" || kind == "table"
	}
	p := panel{ID: b.id, Type: kind, Title: title, Description: description, Targets: targets,
		GridPos:     map[string]int{"x": b.x, "y": b.y, "w": w, "h": h},
		Datasource:  map[string]string{"type": "prometheus", "uid": "${datasource}"},
		FieldConfig: map[string]any{"defaults": map[string]any{"unit": unit}, "overrides": []any{}},
	}
	if kind == "timeseries" {
		p.Options = map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom"}, "tooltip": map[string]any{"mode": "multi"}}
	}
	b.panels = append(b.panels, p)
	b.x += w
}

func t(expr, legend string) target { return target{Expr: expr, LegendFormat: legend} }

// Build returns the dashboard as JSON, with the placeholders for the chart to replace.
func Build() ([]byte, error) {
	b := &builder{}
	b.row("Cluster")
	b.add("stat", "Phase", "", "status.phase, from the operator.", 4,
		t(`max by (phase) (`+m("pgpilot_cluster_phase")+` == 1)`, "{{phase}}"))
	b.add("stat", "Ready instances", "", "Instances whose pod is Ready, of spec.replicas.", 4,
		t(m("pgpilot_cluster_ready_instances"), "ready"), t(m("pgpilot_cluster_instances"), "wanted"))
	b.add("stat", "Primary", "", "The instance that is a ready primary.", 4,
		t(m("pgpilot_instance_role", `role="primary"`)+` * on (namespace, pod) `+m("pgpilot_instance_ready")+` == 1`, "{{pod}}"))
	b.add("stat", "Failovers and switchovers (24h)", "", "Moves of the primary the operator made.", 4,
		t(`sum(increase(`+m("pgpilot_failovers_total")+`[24h]))`, "failovers"), t(`sum(increase(`+m("pgpilot_switchovers_total")+`[24h]))`, "switchovers"))
	b.add("stat", "Last failover", "dateTimeFromNow", "status.lastFailover.time.", 4,
		t(m("pgpilot_cluster_last_failover_timestamp_seconds")+` * 1000`, "last failover"))
	b.add("stat", "Primary move p90 (24h)", "s", "How long failovers and switchovers took.", 4,
		t(`histogram_quantile(0.9, sum by (le, kind) (increase(`+m("pgpilot_primary_move_duration_seconds_bucket")+`[24h])))`, "{{kind}}"))
	b.add("timeseries", "Instances ready, by role", "short", "pgpilot_instance_ready per instance, labelled with its role.", 12,
		t(m("pgpilot_instance_ready")+` * on (namespace, pod) group_left (role) (`+m("pgpilot_instance_role")+` == 1)`, "{{pod}} {{role}}"))
	b.add("timeseries", "Timeline", "short", "The PostgreSQL timeline each instance is on: it rises at each promotion.", 12,
		t(m("pgpilot_instance_timeline"), "{{pod}}"))

	b.row("Replication")
	b.add("timeseries", "Standby lag (bytes)", "bytes", "How far each standby's flush position is behind the primary's write position.", 8,
		t(m("pgpilot_replica_lag_bytes"), "{{replica}} ({{sync_state}})"))
	b.add("timeseries", "Standby lag (time)", "s", "write_lag, flush_lag and replay_lag of pg_stat_replication; 0 once caught up with no WAL written.", 8,
		t(m("pgpilot_replica_lag_seconds"), "{{replica}} {{kind}}"))
	b.add("timeseries", "WAL kept by replication slots", "bytes", "WAL each slot holds on the primary's volume.", 8,
		t(m("pgpilot_replication_slot_retained_bytes"), "{{pod}} {{slot}}"))

	b.row("Activity")
	b.add("timeseries", "Transactions", "ops", "Commits and rollbacks per second, per database.", 8,
		t(`sum by (datname) (rate(`+m("pgpilot_database_xact_commit_total")+`[5m]))`, "{{datname}} commits"),
		t(`sum by (datname) (rate(`+m("pgpilot_database_xact_rollback_total")+`[5m]))`, "{{datname}} rollbacks"))
	b.add("timeseries", "Backends by state", "short", "Client backends per instance and state, and max_connections.", 8,
		t(m("pgpilot_backends"), "{{pod}} {{state}}"), t(m("pgpilot_max_connections"), "{{pod}} max_connections"))
	b.add("timeseries", "Cache hit ratio", "percentunit", "Blocks found in shared buffers, of blocks read.", 8,
		t(`sum by (pod) (rate(`+m("pgpilot_database_blocks_hit_total")+`[5m])) / (sum by (pod) (rate(`+m("pgpilot_database_blocks_hit_total")+`[5m])) + sum by (pod) (rate(`+m("pgpilot_database_blocks_read_total")+`[5m])))`, "{{pod}}"))
	b.add("timeseries", "Oldest transactions", "s", "The oldest open transaction, and the longest idle one in a transaction, per instance.", 8,
		t(m("pgpilot_oldest_transaction_seconds"), "{{pod}} oldest"), t(m("pgpilot_oldest_idle_in_transaction_seconds"), "{{pod}} idle in transaction"))
	b.add("timeseries", "Locks waiting, deadlocks", "short", "Backends waiting for a lock; deadlocks per minute.", 8,
		t(m("pgpilot_locks_waiting"), "{{pod}} waiting"), t(`sum by (pod) (rate(`+m("pgpilot_database_deadlocks_total")+`[5m])) * 60`, "{{pod}} deadlocks/min"))
	b.add("timeseries", "Rows and temporary files", "short", "Rows written per second; temporary bytes per second (queries larger than work_mem).", 8,
		t(`sum by (op) (rate(`+m("pgpilot_database_tuples_total", `op=~"inserted|updated|deleted"`)+`[5m]))`, "{{op}}"),
		t(`sum(rate(`+m("pgpilot_database_temp_bytes_total")+`[5m]))`, "temp bytes/s"))

	b.row("WAL and checkpoints")
	b.add("timeseries", "WAL written", "Bps", "Bytes of WAL each instance generates per second (pg_stat_wal).", 8,
		t(`rate(`+m("pgpilot_wal_bytes_total")+`[5m])`, "{{pod}}"))
	b.add("timeseries", "Checkpoints", "short", "Checkpoints per hour by cause: many requested ones mean max_wal_size is small for the load.", 8,
		t(`sum by (kind) (rate(`+m("pgpilot_checkpoints_total")+`[1h])) * 3600`, "{{kind}}"))
	b.add("timeseries", "Checkpoint and background writes", "Bps", "Buffers written per second by checkpoints and the background writer (8 KiB each).", 8,
		t(`sum(rate(`+m("pgpilot_checkpoint_buffers_written_total")+`[5m])) * 8192`, "checkpoints"),
		t(`sum(rate(`+m("pgpilot_bgwriter_buffers_written_total")+`[5m])) * 8192`, "background writer"))

	b.row("Storage")
	b.add("timeseries", "Volume used", "percentunit", "Used part of each instance's data volume.", 8,
		t(`1 - `+m("pgpilot_volume_free_bytes")+` / `+m("pgpilot_volume_size_bytes"), "{{pod}}"))
	b.add("timeseries", "Volume full in", "s", "At the last 10 minutes' rate (the agent's estimate), and at the last hour's (predict_linear); empty while the volume is not filling.", 8,
		t(m("pgpilot_volume_full_in_seconds"), "{{pod}} (agent)"),
		t(m("pgpilot_volume_free_bytes")+` / clamp_min(-deriv(`+m("pgpilot_volume_free_bytes")+`[1h]), 1e-9) > 0`, "{{pod}} (1h trend)"))
	b.add("timeseries", "Database sizes and xid age", "bytes", "Size of each database (left) and its oldest unfrozen transaction's age (right axis, wraparound at 2^31).", 8,
		t(`max by (datname) (`+m("pgpilot_database_size_bytes")+`)`, "{{datname}}"),
		t(`max by (datname) (`+m("pgpilot_database_xid_age")+`)`, "{{datname}} xid age"))

	b.row("Archiving and backups")
	b.add("stat", "Archiving failing", "", "1 while the primary's last attempt to archive WAL failed.", 6,
		t(`max(`+m("pgpilot_wal_archive_failing")+`)`, "failing"))
	b.add("stat", "WAL waiting to be archived", "bytes", "Segments stay on the primary's volume until archived.", 6,
		t(`max(`+m("pgpilot_wal_archive_pending_bytes")+`)`, "pending"))
	b.add("stat", "Last backup", "dateTimeFromNow", "When the newest completed base backup finished.", 6,
		t(m("pgpilot_backup_last_success_timestamp_seconds")+` * 1000`, "last backup"))
	b.add("stat", "Next backup due", "dateTimeFromNow", "By spec.backup.schedule: PgpilotBackupOverdue fires an hour after it.", 6,
		t(m("pgpilot_backup_next_due_timestamp_seconds")+` * 1000`, "due"))
	b.add("timeseries", "WAL archived", "short", "WAL files archived per minute, and failed attempts.", 8,
		t(`sum(rate(`+m("pgpilot_wal_archived_total")+`[5m])) * 60`, "archived/min"),
		t(`sum(rate(`+m("pgpilot_wal_archive_failed_total")+`[5m])) * 60`, "failed/min"))
	b.add("timeseries", "Backup size and duration", "bytes", "The newest completed base backup's size and how long it took.", 8,
		t(m("pgpilot_backup_last_size_bytes"), "size"), t(m("pgpilot_backup_last_duration_seconds"), "duration (s)"))
	b.add("timeseries", "Backups by phase", "short", "The cluster's PostgresBackups.", 8,
		t(m("pgpilot_backups"), "{{phase}}"))

	b.row("Operator")
	b.add("timeseries", "Reconciles", "ops", "Reconciles per second by controller and result (controller-runtime's metrics, both managers).", 12,
		t(`sum by (controller, result) (rate(controller_runtime_reconcile_total[5m]))`, "{{controller}} {{result}}"))
	b.add("timeseries", "Reconcile latency p99", "s", "By controller.", 12,
		t(`histogram_quantile(0.99, sum by (le, controller) (rate(controller_runtime_reconcile_time_seconds_bucket[5m])))`, "{{controller}}"))

	d := map[string]any{
		"uid":           "pgpilot-" + NamespacePlaceholder + "-" + ClusterPlaceholder,
		"title":         "pgpilot / " + NamespacePlaceholder + " / " + ClusterPlaceholder,
		"tags":          []string{"pgpilot", "postgresql"},
		"schemaVersion": 39,
		"editable":      false,
		"refresh":       "30s",
		"time":          map[string]string{"from": "now-6h", "to": "now"},
		"timezone":      "utc",
		"panels":        b.panels,
		"templating": map[string]any{"list": []any{
			map[string]any{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
			map[string]any{"name": "namespace", "type": "constant", "hide": 2, "query": NamespacePlaceholder},
			map[string]any{"name": "cluster", "type": "constant", "hide": 2, "query": ClusterPlaceholder},
		}},
		"annotations": map[string]any{"list": []any{}},
		"links":       []any{},
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// Exprs are the queries of every panel, for tests.
func Exprs() ([]string, error) {
	raw, err := Build()
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out, nil
}
