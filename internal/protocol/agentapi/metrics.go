package agentapi

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// roles are the values of pgpilot_instance_role's role label, one series each.
var roles = []string{RolePrimary, RoleReplica, RoleFenced, RoleStarting, RoleStopped, RoleUpgrading}

var (
	upDesc = prometheus.NewDesc("pgpilot_instance_up",
		"Whether the PostgreSQL postmaster is running (1) or not (0).", nil, nil)
	readyDesc = prometheus.NewDesc("pgpilot_instance_ready",
		"Whether PostgreSQL accepts connections in its role (1) or not (0).", nil, nil)
	roleDesc = prometheus.NewDesc("pgpilot_instance_role",
		"The instance's role: 1 for the role it has now, 0 for the others.", []string{"role"}, nil)
	timelineDesc = prometheus.NewDesc("pgpilot_instance_timeline",
		"The PostgreSQL timeline ID the instance is on (0 when unknown).", nil, nil)
	walLSNDesc = prometheus.NewDesc("pgpilot_instance_wal_lsn_bytes",
		"WAL position as a byte offset: kind=write is a primary's write position, kind=received "+
			"the last position a replica received and flushed, kind=replayed the last one it replayed.",
		[]string{"kind"}, nil)
	lagDesc = prometheus.NewDesc("pgpilot_instance_replication_lag_bytes",
		"Bytes of WAL a replica has received but not replayed yet (0 on a primary).", nil, nil)
	replicasDesc = prometheus.NewDesc("pgpilot_instance_replicas",
		"Number of standbys streaming from this instance (rows of pg_stat_replication).", nil, nil)
	replicaLagDesc = prometheus.NewDesc("pgpilot_replica_lag_bytes",
		"Bytes a standby's flush position is behind this primary's write position, per standby.",
		[]string{"replica", "sync_state"}, nil)
	exposureDesc = prometheus.NewDesc("pgpilot_instance_loss_exposure_bytes",
		"On a primary with standbys streaming, the bytes of WAL its most advanced standby has not "+
			"flushed yet: what an asynchronous failover would lose now (bounded by spec.postgresql.lossBudget when set).", nil, nil)
	fencedDesc = prometheus.NewDesc("pgpilot_instance_fenced",
		"Whether the agent was told to stop accepting writes (1) or not (0).", nil, nil)
	startTimeDesc = prometheus.NewDesc("pgpilot_instance_start_time_seconds",
		"When the postmaster last started, in seconds since the Unix epoch.", nil, nil)
	connectionsDesc = prometheus.NewDesc("pgpilot_instance_connections",
		"Client backends connected to postgres (pg_stat_activity).", nil, nil)
	slotActiveDesc = prometheus.NewDesc("pgpilot_replication_slot_active",
		"Whether a replication slot is in use (1) or not (0).", []string{"slot"}, nil)
	slotRetainedDesc = prometheus.NewDesc("pgpilot_replication_slot_retained_bytes",
		"WAL bytes a replication slot keeps on disk.", []string{"slot"}, nil)
	volumeSizeDesc = prometheus.NewDesc("pgpilot_volume_size_bytes",
		"Size of the instance's data volume.", nil, nil)
	volumeFreeDesc = prometheus.NewDesc("pgpilot_volume_free_bytes",
		"Free space of the instance's data volume; predict_linear on it says when the volume fills up.", nil, nil)
	setAsideDesc = prometheus.NewDesc("pgpilot_set_aside_bytes",
		"Bytes of the data directories the agent replaced by a new clone and kept on the volume (docs/data-safety.md).", nil, nil)
	archivedDesc = prometheus.NewDesc("pgpilot_wal_archived_total",
		"WAL files this primary archived since its statistics were reset (pg_stat_archiver).", nil, nil)
	archiveFailedDesc = prometheus.NewDesc("pgpilot_wal_archive_failed_total",
		"Failed attempts to archive a WAL file (pg_stat_archiver).", nil, nil)
	archivePendingDesc = prometheus.NewDesc("pgpilot_wal_archive_pending",
		"WAL segments waiting to be archived; they stay on the primary's volume until they are.", nil, nil)
	archivePendingBytesDesc = prometheus.NewDesc("pgpilot_wal_archive_pending_bytes",
		"Bytes of the WAL segments waiting to be archived.", nil, nil)
	volumeFullInDesc = prometheus.NewDesc("pgpilot_volume_full_in_seconds",
		"How long until the data volume is full at the rate its free space went down over the last 10 minutes; absent when it is not filling.", nil, nil)
	archiveFailingDesc = prometheus.NewDesc("pgpilot_wal_archive_failing",
		"Whether the last attempt to archive WAL failed (1) or not (0).", nil, nil)
	pendingRestartDesc = prometheus.NewDesc("pgpilot_pending_restart",
		"Settings of postgresql.conf that wait for a restart of postgres (pg_settings.pending_restart), one series each.", []string{"setting"}, nil)
	gateImpostorsDesc = prometheus.NewDesc("pgpilot_gate_impostors_terminated_total",
		"Replication connections that took the commit gate's name and that the agent terminated since it started.", nil, nil)
	lastArchivedDesc = prometheus.NewDesc("pgpilot_wal_last_archived_time_seconds",
		"When a WAL file was last archived, in seconds since the Unix epoch.", nil, nil)
)

// instanceCollector exports an Instance's Status, read at each scrape.
type instanceCollector struct {
	inst    Instance
	timeout time.Duration
	log     logr.Logger
}

func (c *instanceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		upDesc, readyDesc, roleDesc, timelineDesc, walLSNDesc, lagDesc,
		replicasDesc, replicaLagDesc, exposureDesc, fencedDesc, startTimeDesc,
		connectionsDesc, slotActiveDesc, slotRetainedDesc,
		volumeSizeDesc, volumeFreeDesc, setAsideDesc, gateImpostorsDesc,
		archivedDesc, archiveFailedDesc, archivePendingDesc, archivePendingBytesDesc, volumeFullInDesc, archiveFailingDesc, lastArchivedDesc,
		pendingRestartDesc,
	} {
		ch <- d
	}
	for _, d := range receiverDescs {
		ch <- d
	}
}

func (c *instanceCollector) Collect(ch chan<- prometheus.Metric) {
	// Collect gets no context from the scrape; bound the Status call ourselves.
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st := c.inst.Status(ctx)

	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			// Only label values that are not UTF-8 get here; skip that one series.
			c.log.Error(err, "Skipped a metric", "metric", d.String())
			return
		}
		ch <- m
	}

	gauge(upDesc, boolValue(st.Running))
	gauge(readyDesc, boolValue(st.Ready))
	for _, r := range roles {
		gauge(roleDesc, boolValue(st.Role == r), r)
	}
	gauge(timelineDesc, float64(st.Timeline))
	for _, w := range []struct{ kind, lsn string }{
		{"write", st.WriteLSN},
		{"received", st.ReceivedLSN},
		{"replayed", st.ReplayedLSN},
	} {
		if w.lsn == "" {
			continue
		}
		pos, err := ParseLSN(w.lsn)
		if err != nil {
			c.log.Error(err, "Skipped a WAL position metric", "kind", w.kind)
			continue
		}
		gauge(walLSNDesc, float64(pos), w.kind)
	}
	gauge(lagDesc, float64(st.LagBytes))
	gauge(replicasDesc, float64(len(st.Replicas)))

	// pg_stat_replication can briefly hold two rows for one standby (an old walsender
	// not yet gone); one series per label set, the larger lag wins.
	type key struct{ name, syncState string }
	lags := make(map[key]int64, len(st.Replicas))
	order := make([]key, 0, len(st.Replicas))
	for _, r := range st.Replicas {
		k := key{r.Name, r.SyncState}
		if old, seen := lags[k]; !seen {
			order = append(order, k)
		} else if old >= r.LagBytes {
			continue
		}
		lags[k] = r.LagBytes
	}
	for _, k := range order {
		gauge(replicaLagDesc, float64(lags[k]), k.name, k.syncState)
	}
	if st.Role == RolePrimary && len(st.Replicas) > 0 {
		exposure := st.Replicas[0].LagBytes
		for _, r := range st.Replicas[1:] {
			exposure = min(exposure, r.LagBytes)
		}
		gauge(exposureDesc, float64(max(exposure, 0)))
	}

	gauge(fencedDesc, boolValue(st.Fenced))
	ch <- prometheus.MustNewConstMetric(gateImpostorsDesc, prometheus.CounterValue, float64(st.GateImpostorsTerminated))
	gauge(connectionsDesc, float64(st.Connections))
	seen := map[string]bool{}
	for _, sl := range st.Slots {
		if seen[sl.Name] {
			continue // a duplicate would fail the whole scrape
		}
		seen[sl.Name] = true
		gauge(slotActiveDesc, boolValue(sl.Active), sl.Name)
		gauge(slotRetainedDesc, float64(sl.RetainedBytes), sl.Name)
	}
	if st.VolumeBytes > 0 {
		gauge(volumeSizeDesc, float64(st.VolumeBytes))
		gauge(volumeFreeDesc, float64(st.VolumeFreeBytes))
	}
	if st.VolumeFullInSeconds > 0 {
		gauge(volumeFullInDesc, float64(st.VolumeFullInSeconds))
	}
	var aside int64
	for _, a := range st.SetAside {
		aside += a.Bytes
	}
	gauge(setAsideDesc, float64(aside))
	for _, p := range st.PendingRestart {
		gauge(pendingRestartDesc, 1, p.Name)
	}
	if st.StartedAt != nil {
		gauge(startTimeDesc, float64(st.StartedAt.UnixNano())/1e9)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	collectReceiver(st, gauge, counter)
	if a := st.Archiver; a != nil && a.Enabled {
		counter(archivedDesc, float64(a.ArchivedCount))
		counter(archiveFailedDesc, float64(a.FailedCount))
		gauge(archivePendingDesc, float64(a.Pending))
		gauge(archivePendingBytesDesc, float64(a.PendingBytes))
		gauge(archiveFailingDesc, boolValue(a.Failing()))
		if a.LastArchivedAt != nil {
			gauge(lastArchivedDesc, float64(a.LastArchivedAt.UnixNano())/1e9)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
