// Package opmetrics is the controller's own metrics, beside controller-runtime's
// reconcile metrics: failovers and switchovers with their durations, clusters by phase,
// and each cluster's backups (docs/monitoring.md).
package opmetrics

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// moveBuckets span a handover (about a second) to a failover held by a slow API server
// or an unreachable primary (tens of seconds).
var moveBuckets = []float64{0.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89}

var (
	failovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_failovers_total",
		Help: "Automatic failovers: the primary Lease moved to a standby because the primary failed or handed over (docs/failover.md).",
	}, []string{"namespace", "cluster"})
	switchovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_switchovers_total",
		Help: "Switchovers requested with the db.example.com/switchover-to annotation (by a person, a rolling update, a restart or a scale-down) that moved the primary.",
	}, []string{"namespace", "cluster"})
	moveSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgpilot_primary_move_duration_seconds",
		Help:    "How long the primary's move took: for a failover from the first observation of the failure, for a switchover from the old primary's release of the Lease, to the Lease naming the new primary.",
		Buckets: moveBuckets,
	}, []string{"namespace", "cluster", "kind"})
	observations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_failover_observations_total",
		Help: "The failover controller's observations of a cluster's agents, by what was asked: every agent (full), the holder alone for a settled cluster (quiet), or the holder first and then the standbys it did not vouch for (unvouched). docs/failover.md, \"Quiet cycles\".",
	}, []string{"kind"})
	unsettled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_failover_unsettled_cycles_total",
		Help: "The failover controller's cycles that found a cluster not settled, by the first reason (lease, deciding, instances, pod, unreachable, not-ready, agent, term, primary, standby, renewal, error); such a cluster is asked again within a second. docs/failover.md, \"Quiet cycles\".",
	}, []string{"reason"})

	registerOnce sync.Once
)

// Register adds the failover and switchover metrics and a collector of the clusters'
// and backups' state (read from c, the manager's cache, while the replica leads:
// elected closes then) to reg, once per process.
func Register(reg prometheus.Registerer, c client.Reader, elected <-chan struct{}, log logr.Logger) {
	registerOnce.Do(func() {
		reg.MustRegister(failovers, switchovers, moveSeconds, observations, unsettled, &clusterCollector{reader: c, elected: elected, log: log})
	})
}

// Move kinds, the kind label of pgpilot_primary_move_duration_seconds.
const (
	KindFailover   = "failover"
	KindSwitchover = "switchover"
)

// RecordMove counts one move of a cluster's primary and its duration.
func RecordMove(cluster client.Object, kind string, took time.Duration) {
	ns, name := cluster.GetNamespace(), cluster.GetName()
	switch kind {
	case KindFailover:
		failovers.WithLabelValues(ns, name).Inc()
	case KindSwitchover:
		switchovers.WithLabelValues(ns, name).Inc()
	default:
		return
	}
	moveSeconds.WithLabelValues(ns, name, kind).Observe(took.Seconds())
}

// Observation kinds, the kind label of pgpilot_failover_observations_total.
const (
	ObservedFull      = "full"
	ObservedQuiet     = "quiet"
	ObservedUnvouched = "unvouched"
)

// CountObservation counts one observation of a cluster's agents of kind.
func CountObservation(kind string) { observations.WithLabelValues(kind).Inc() }

// CountUnsettled counts one cycle that found a cluster not settled, for reason.
func CountUnsettled(reason string) { unsettled.WithLabelValues(reason).Inc() }

// Forget drops a deleted cluster's series.
func Forget(namespace, cluster string) {
	labels := prometheus.Labels{"namespace": namespace, "cluster": cluster}
	failovers.DeletePartialMatch(labels)
	switchovers.DeletePartialMatch(labels)
	moveSeconds.DeletePartialMatch(labels)
}

var phases = []dbv1.Phase{dbv1.PhaseCreating, dbv1.PhaseHealthy, dbv1.PhaseDegraded, dbv1.PhaseUnavailable, dbv1.PhaseFailed}

var (
	clusterLabels = []string{"namespace", "cluster"}

	clustersDesc = prometheus.NewDesc("pgpilot_clusters",
		"PostgresClusters by phase (status.phase; \"\" before the first status).", []string{"phase"}, nil)
	phaseDesc = prometheus.NewDesc("pgpilot_cluster_phase",
		"The cluster's phase: 1 for the phase it is in, 0 for the others.", []string{"namespace", "cluster", "phase"}, nil)
	instancesDesc = prometheus.NewDesc("pgpilot_cluster_instances",
		"Instances the cluster wants (spec.replicas).", clusterLabels, nil)
	readyDesc = prometheus.NewDesc("pgpilot_cluster_ready_instances",
		"Instances whose pod is Ready (status.readyInstances).", clusterLabels, nil)
	lastFailoverDesc = prometheus.NewDesc("pgpilot_cluster_last_failover_timestamp_seconds",
		"When the cluster last failed over (status.lastFailover.time), in seconds since the Unix epoch.", clusterLabels, nil)
	backupsDesc = prometheus.NewDesc("pgpilot_backups",
		"The cluster's PostgresBackups by phase.", []string{"namespace", "cluster", "phase"}, nil)
	lastBackupDesc = prometheus.NewDesc("pgpilot_backup_last_success_timestamp_seconds",
		"When the newest completed base backup of the cluster finished, in seconds since the Unix epoch.", clusterLabels, nil)
	lastBackupSizeDesc = prometheus.NewDesc("pgpilot_backup_last_size_bytes",
		"Size of the newest completed base backup in the store (compressed).", clusterLabels, nil)
	lastBackupDurationDesc = prometheus.NewDesc("pgpilot_backup_last_duration_seconds",
		"How long the newest completed base backup took.", clusterLabels, nil)
	backupDueDesc = prometheus.NewDesc("pgpilot_backup_next_due_timestamp_seconds",
		"When a base backup newer than the last completed one is due by spec.backup.schedule: its first tick after that backup started (or after the cluster was created), in seconds since the Unix epoch. Absent without a schedule.",
		clusterLabels, nil)
	verificationDesc = prometheus.NewDesc("pgpilot_backup_verification_succeeded",
		"1 when the last restore verification of the cluster's backups (status.lastBackupVerification) succeeded, 0 when it failed. Absent before the first.",
		clusterLabels, nil)
	verificationTimeDesc = prometheus.NewDesc("pgpilot_backup_verification_last_timestamp_seconds",
		"When the last restore verification finished, in seconds since the Unix epoch.", clusterLabels, nil)
)

// clusterCollector reads the clusters and backups from the cache at each scrape, in the
// replica that leads only: every replica has them in its cache, and a sum over the
// operator's pods would count each cluster once per replica.
type clusterCollector struct {
	reader client.Reader
	// elected is closed once this replica leads; nil for always.
	elected <-chan struct{}
	log     logr.Logger
}

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{clustersDesc, phaseDesc, instancesDesc, readyDesc, lastFailoverDesc,
		backupsDesc, lastBackupDesc, lastBackupSizeDesc, lastBackupDurationDesc, backupDueDesc, verificationDesc, verificationTimeDesc} {
		ch <- d
	}
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	if c.elected != nil {
		select {
		case <-c.elected:
		default:
			return // a standby replica
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var clusters dbv1.PostgresClusterList
	if err := c.reader.List(ctx, &clusters); err != nil {
		c.log.Error(err, "Failed to list clusters for metrics")
		return
	}
	var backups dbv1.PostgresBackupList
	if err := c.reader.List(ctx, &backups); err != nil {
		c.log.Error(err, "Failed to list backups for metrics")
	}
	byCluster := map[[2]string][]dbv1.PostgresBackup{}
	for _, b := range backups.Items {
		k := [2]string{b.Namespace, b.Spec.Cluster.Name}
		byCluster[k] = append(byCluster[k], b)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	count := map[dbv1.Phase]int{}
	for _, p := range phases {
		count[p] = 0
	}
	for i := range clusters.Items {
		cl := &clusters.Items[i]
		count[cl.Status.Phase]++
		ns, name := cl.Namespace, cl.Name
		for _, p := range phases {
			gauge(phaseDesc, boolValue(cl.Status.Phase == p), ns, name, string(p))
		}
		gauge(instancesDesc, float64(cl.Spec.Replicas), ns, name)
		gauge(readyDesc, float64(cl.Status.ReadyInstances), ns, name)
		if f := cl.Status.LastFailover; f != nil && !f.Time.IsZero() {
			gauge(lastFailoverDesc, unix(f.Time.Time), ns, name)
		}
		s := SummarizeBackups(cl, byCluster[[2]string{ns, name}])
		for _, p := range []dbv1.BackupPhase{dbv1.BackupPending, dbv1.BackupRunning, dbv1.BackupCompleted, dbv1.BackupFailed} {
			gauge(backupsDesc, float64(s.ByPhase[p]), ns, name, string(p))
		}
		if !s.LastSuccess.IsZero() {
			gauge(lastBackupDesc, unix(s.LastSuccess), ns, name)
			gauge(lastBackupSizeDesc, float64(s.LastSizeBytes), ns, name)
			gauge(lastBackupDurationDesc, s.LastDuration.Seconds(), ns, name)
		}
		if !s.NextDue.IsZero() {
			gauge(backupDueDesc, unix(s.NextDue), ns, name)
		}
		if v := cl.Status.LastBackupVerification; v != nil {
			gauge(verificationDesc, boolValue(v.Result == dbv1.VerificationSucceeded), ns, name)
			if v.FinishedAt != nil {
				gauge(verificationTimeDesc, unix(v.FinishedAt.Time), ns, name)
			}
		}
	}
	for p, n := range count {
		gauge(clustersDesc, float64(n), string(p))
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
