package v1

import (
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations pgpilot puts on objects.
const (
	// AnnotationSwitchoverTo on a cluster asks for a switchover to the named pod; the
	// sidecar removes it when the switchover is done or refused (with an event).
	AnnotationSwitchoverTo = "db.example.com/switchover-to"

	// AnnotationLastFailover on the primary Lease records the last failover (JSON of a
	// FailoverRecord); AnnotationFailoverBlocked says why a failover cannot happen now.
	// The failover controller writes them, the status controller shows them.
	AnnotationLastFailover    = "db.example.com/last-failover"
	AnnotationFailoverBlocked = "db.example.com/failover-blocked"

	// AnnotationBootstrapped on the primary Lease says the cluster's first primary came
	// up; from then on the agent never runs initdb over an empty volume.
	AnnotationBootstrapped = "db.example.com/bootstrapped"

	// AnnotationArchiving on the primary Lease is the primary's WAL archiving health
	// (JSON: ok, message), which the backup controller records and the status
	// controller shows as the ContinuousArchiving condition.
	AnnotationArchiving = "db.example.com/archiving"

	// AnnotationDataGuard on the primary Lease is what the agents refuse to do to their
	// data and the data directories they set aside (JSON of a DataGuard), which the
	// failover controller records and the status controller shows as the
	// DataConsistent condition and the instances' setAside.
	AnnotationDataGuard = "db.example.com/data-guard"

	// LabelScheduledAt on a PostgresBackup the sidecar created for a schedule tick is
	// the tick's time, as a Unix timestamp.
	LabelScheduledAt = "db.example.com/scheduled-at"

	// LabelCluster names the PostgresCluster an object belongs to.
	LabelCluster = "db.example.com/cluster"
	// LabelRole is primary, replica or fenced on instance pods; the Services select on it.
	LabelRole = "db.example.com/role"

	RolePrimary = "primary"
	RoleReplica = "replica"
	RoleFenced  = "fenced"
)

// Names of the credentials Secrets' roles.
const (
	SuperuserName   = "postgres"
	ReplicationUser = "pgpilot_replication"
)

// PrimaryLeaseName is the Lease whose holder is the primary pod: the single source of
// truth for who is primary.
func (c *PostgresCluster) PrimaryLeaseName() string { return c.Name + "-primary" }

// SuperuserSecretName is the Secret with the postgres superuser's credentials.
func (c *PostgresCluster) SuperuserSecretName() string { return c.Name + "-superuser" }

// ReplicationSecretName is the Secret with the replication role's credentials.
func (c *PostgresCluster) ReplicationSecretName() string { return c.Name + "-replication" }

// AppSecretName is the Secret with the application owner's credentials.
func (c *PostgresCluster) AppSecretName() string { return c.Name + "-app" }

// AgentTokenSecretName is the Secret with the bearer token of the agents' API.
func (c *PostgresCluster) AgentTokenSecretName() string { return c.Name + "-agent" }

// ReadWriteServiceName is the Service that selects the primary.
func (c *PostgresCluster) ReadWriteServiceName() string { return c.Name + "-rw" }

// InstanceName is the pod name of instance ordinal i (StatefulSet naming).
func (c *PostgresCluster) InstanceName(i int) string {
	return c.Name + "-" + strconv.Itoa(i)
}

// VolumeClaimName is the PersistentVolumeClaim of instance i: the StatefulSet's claim
// template "data" (helm-charts/postgrescluster/templates/statefulset.yaml).
func (c *PostgresCluster) VolumeClaimName(i int) string {
	return "data-" + c.InstanceName(i)
}

// ManagedParameters are the postgresql.conf settings pgpilot sets itself; the CRD
// refuses them in spec.postgresql.parameters. The CEL rule on that field lists the same
// names (a test keeps the two in step).
var ManagedParameters = []string{
	"archive_command", "archive_mode", "cluster_name", "config_file", "data_directory",
	"external_pid_file", "hba_file", "hot_standby", "ident_file", "listen_addresses",
	"logging_collector", "max_replication_slots", "max_wal_senders", "port",
	"primary_conninfo", "primary_slot_name", "promote_trigger_file", "recovery_target",
	"recovery_target_action", "recovery_target_inclusive", "recovery_target_lsn",
	"recovery_target_name", "recovery_target_time", "recovery_target_timeline",
	"recovery_target_xid", "restore_command", "synchronous_standby_names",
	"unix_socket_directories", "wal_level", "wal_log_hints",
}

// Bootstrapped reports whether the cluster has been Healthy once (its Bootstrapped
// condition is True). It is read from a condition, not from the phase: the Helm
// manager's status writes drop the phase but keep every condition.
func (c *PostgresCluster) Bootstrapped() bool {
	b := FindCondition(c.Status.Conditions, ConditionBootstrapped)
	return b != nil && b.Status == metav1.ConditionTrue
}

// FailoverEnabled is spec.failover.enabled, true when unset.
func (c *PostgresCluster) FailoverEnabled() bool {
	return c.Spec.Failover.Enabled == nil || *c.Spec.Failover.Enabled
}

// FailoverDelay is spec.failover.delay, 3 s when unset.
func (c *PostgresCluster) FailoverDelay() time.Duration {
	if c.Spec.Failover.Delay == nil {
		return 3 * time.Second
	}
	return c.Spec.Failover.Delay.Duration
}

// FailoverStartTimeout is spec.failover.startTimeout, 60 s when unset.
func (c *PostgresCluster) FailoverStartTimeout() time.Duration {
	if c.Spec.Failover.StartTimeout == nil {
		return time.Minute
	}
	return c.Spec.Failover.StartTimeout.Duration
}
