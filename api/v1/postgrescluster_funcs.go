package v1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations pgpilot puts on objects.
const (
	// AnnotationSwitchoverTo on a cluster asks for a switchover to the named pod; the
	// controller removes it when the switchover is done or refused (with an event).
	AnnotationSwitchoverTo = "db.example.com/switchover-to"
	// AnnotationRestartedAt on a cluster restarts every instance, one at a time
	// (replicas first, then a switchover), when its value changes: the chart copies it
	// into the pod template, as kubectl rollout restart does for a Deployment
	// (kubectl pgpilot restart sets it to the time).
	AnnotationRestartedAt = "db.example.com/restartedAt"
	// AnnotationReplicaConfig on an instance pod is a digest of the replica-cluster
	// settings its config.json should hold (spec.replica): the failover controller
	// sets it when they change, which has the kubelet refresh the pod's ConfigMap
	// volume at once instead of within its sync period (a minute by default).
	AnnotationReplicaConfig = "db.example.com/replica-config"
	// AnnotationRolloutPaused on a cluster, "true", holds its rolling update: no pod of
	// it is restarted for a new instance template (a new agent image after an operator
	// upgrade, say) until it is removed. A rollout that has begun stops between two
	// steps, every pod running one template or the other.
	AnnotationRolloutPaused = "db.example.com/rollout-paused"

	// AnnotationFencedInstances on a cluster fences instances: a comma-separated list
	// of pod names, or "*" for every instance. A fenced instance's postgres is stopped
	// and kept stopped (its pod stays, for inspection), and it is left out of the
	// Services and of every election; a fenced primary hands over to an instance that
	// is not fenced first. Removing a name unfences it (docs/operations.md, "Fencing").
	AnnotationFencedInstances = "db.example.com/fenced-instances"

	// AnnotationBootstrapped on the primary Lease says the cluster's first primary came
	// up; from then on the agent never runs initdb over an empty volume.
	AnnotationBootstrapped = "db.example.com/bootstrapped"

	// AnnotationHibernation on the primary Lease is where hibernation stands (JSON of a
	// primarylease.Hibernation: stopping, stopped or resuming, and the primary that
	// keeps its role), written by the failover controller and read by the agents and
	// the plan (docs/operations.md, "Hibernation").
	AnnotationHibernation = "db.example.com/hibernation"
	// AnnotationFenced on the primary Lease lists the instances whose postgres must
	// stay stopped (JSON array of pod names): the failover controller's reading of the
	// cluster's AnnotationFencedInstances, once a fenced primary has handed over.
	AnnotationFenced = "db.example.com/fenced"

	// LabelScheduledAt on a PostgresBackup the controller created for a schedule tick is
	// the tick's time, as a Unix timestamp.
	LabelScheduledAt = "db.example.com/scheduled-at"

	// LabelCluster names the PostgresCluster an object belongs to.
	LabelCluster = "db.example.com/cluster"
	// LabelRole is primary, replica or fenced on instance pods; the Services select on it.
	LabelRole = "db.example.com/role"
	// LabelVerify names the cluster whose backup a restore verification's Job, pod and
	// volume are for (spec.backup.verify). Its pods have no LabelCluster: they are no
	// instances.
	LabelVerify = "db.example.com/verify"

	RolePrimary = "primary"
	RoleReplica = "replica"
	RoleFenced  = "fenced"
)

// Names of the credentials Secrets' roles.
const (
	SuperuserName   = "postgres"
	ReplicationUser = "pgpilot_replication"
)

// Names builds the names of the objects of one PostgresCluster: the one place in Go
// they are made. The chart renders them from the plan (internal/operator/plan), the controllers
// and every test suite read them here.
// Not an API type: no DeepCopy.
// +kubebuilder:object:generate=false
type Names struct {
	// Cluster is the PostgresCluster's name (the Helm release's).
	Cluster string
}

// NamesOf is the Names of the PostgresCluster called cluster.
func NamesOf(cluster string) Names { return Names{Cluster: cluster} }

// Names are the names of c's objects.
func (c *PostgresCluster) Names() Names { return NamesOf(c.Name) }

// PrimaryLease is the Lease whose holder is the primary pod: the single source of truth
// for who is primary.
func (n Names) PrimaryLease() string { return n.Cluster + "-primary" }

// Report is the ConfigMap of the cluster's report: what the operator's controllers
// observe and tell each other (internal/protocol/report), kept off the primary Lease.
func (n Names) Report() string { return n.Cluster + "-report" }

// ReadWriteService selects the primary.
func (n Names) ReadWriteService() string { return n.Cluster + "-rw" }

// ReadOnlyService selects the replicas.
func (n Names) ReadOnlyService() string { return n.Cluster + "-ro" }

// ReadService selects every instance, primary or replica.
func (n Names) ReadService() string { return n.Cluster + "-r" }

// HeadlessService gives each instance its DNS name (the StatefulSet's serviceName).
func (n Names) HeadlessService() string { return n.Cluster + "-headless" }

// InstanceServiceAccount is the instance pods' ServiceAccount, and its Role and
// RoleBinding.
func (n Names) InstanceServiceAccount() string { return n.Cluster + "-instance" }

// DisruptionBudget lets voluntary disruptions (evictions: node drains) take the
// instances one at a time, the primary included: its stop is a handover.
func (n Names) DisruptionBudget() string { return n.Cluster }

// SuperuserSecret holds the postgres superuser's credentials.
func (n Names) SuperuserSecret() string { return n.Cluster + "-superuser" }

// ReplicationSecret holds the replication role's credentials.
func (n Names) ReplicationSecret() string { return n.Cluster + "-replication" }

// AppSecret holds the application owner's credentials.
func (n Names) AppSecret() string { return n.Cluster + "-app" }

// AgentTokenSecret holds the operator's token of the agents' API (key token): it may
// promote, fence and demote. Only the operator reads it.
func (n Names) AgentTokenSecret() string { return n.Cluster + "-agent" }

// MetricsTokenSecret holds the token Prometheus scrapes the agents with (key token): it
// reads /metrics and /status, nothing else.
func (n Names) MetricsTokenSecret() string { return n.Cluster + "-metrics" }

// AgentAuthSecret is what the instance pods mount of the agent API's credentials: the
// digests of the operator's and Prometheus's tokens, and the token the agents call each
// other with.
func (n Names) AgentAuthSecret() string { return n.Cluster + "-agent-auth" }

// CASecret publishes the cluster's CA certificate (ca.crt), which clients verify the
// server with (sslmode=verify-full). It holds no key.
func (n Names) CASecret() string { return n.Cluster + "-ca" }

// CAKeySecret holds the cluster's CA certificate and key; only the operator reads it.
func (n Names) CAKeySecret() string { return n.Cluster + "-ca-key" }

// ServerTLSSecret holds the certificate the operator issues to the instances
// (tls.crt, tls.key, ca.crt): PostgreSQL serves it unless spec.tls.serverSecretName
// names another, and the agent API always does.
func (n Names) ServerTLSSecret() string { return n.Cluster + "-server-tls" }

// ReplicationTLSSecret holds the replication role's client certificate: standbys,
// pg_basebackup and pg_rewind log in with it, without a password.
func (n Names) ReplicationTLSSecret() string { return n.Cluster + "-replication-tls" }

// SourceTLSSecret is the operator's copy of spec.replica.source.replicationSecretName,
// which every instance pod mounts (optional: absent outside replica clusters).
func (n Names) SourceTLSSecret() string { return n.Cluster + "-source-tls" }

// PoolerReadWrite names the read-write pooler's Deployment, Service and
// PodDisruptionBudget (spec.pooler).
func (n Names) PoolerReadWrite() string { return n.Cluster + "-pooler-rw" }

// PoolerReadOnly names the read-only pooler's (spec.pooler.readOnly).
func (n Names) PoolerReadOnly() string { return n.Cluster + "-pooler-ro" }

// PoolerHeadless is the read-write pooler pods' headless Service, which publishes
// every pod's address, ready or not: the primary's agent asks each to pause before a
// handover. It also names the pooler's ServiceAccount and NetworkPolicy.
func (n Names) PoolerHeadless() string { return n.Cluster + "-pooler" }

// PoolerTLSSecret holds the certificate the pooler serves to its clients, for the
// pooler Services' names.
func (n Names) PoolerTLSSecret() string { return n.Cluster + "-pooler-tls" }

// PoolerClientTLSSecret holds the pooler's client certificate: PgBouncer logs in to
// the instances with it as the lookup role (poolerauth.Role), without a password.
func (n Names) PoolerClientTLSSecret() string { return n.Cluster + "-pooler-client-tls" }

// ConfigMap holds the agents' config.json.
func (n Names) ConfigMap() string { return n.Cluster + "-config" }

// VerifyCronJob is the CronJob of restore verifications (spec.backup.verify):
// <cluster>-verify, or, where that exceeds the 52 characters a CronJob's name may have,
// the cluster's name cut short and a digest of it.
func (n Names) VerifyCronJob() string {
	const maxCronJobName = 52
	if name := n.Cluster + "-verify"; len(name) <= maxCronJobName {
		return name
	}
	sum := sha256.Sum256([]byte(n.Cluster))
	return n.Cluster[:maxCronJobName-len("-v-")-8] + "-v-" + hex.EncodeToString(sum[:])[:8]
}

// StatefulSet runs the instances.
func (n Names) StatefulSet() string { return n.Cluster }

// NetworkPolicy says who may connect to the instances.
func (n Names) NetworkPolicy() string { return n.Cluster }

// Instance is the pod name of instance ordinal i (StatefulSet naming).
func (n Names) Instance(i int) string { return n.Cluster + "-" + strconv.Itoa(i) }

// Ordinal is the ordinal of instance pod, false when pod is not an instance's name.
func (n Names) Ordinal(pod string) (int, bool) {
	digits, ok := strings.CutPrefix(pod, n.Cluster+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || strconv.Itoa(i) != digits {
		return 0, false
	}
	return i, true
}

// VolumeClaim is the PersistentVolumeClaim of instance i: the StatefulSet's claim
// template "data" (helm-charts/postgrescluster/templates/statefulset.yaml).
func (n Names) VolumeClaim(i int) string { return VolumeClaimOf(n.Instance(i)) }

// VolumeClaimOf is the PersistentVolumeClaim of instance pod: the claim template's
// name and the pod's, as the StatefulSet names it.
func VolumeClaimOf(pod string) string { return "data-" + pod }

// PrimaryLeaseName is Names().PrimaryLease().
func (c *PostgresCluster) PrimaryLeaseName() string { return c.Names().PrimaryLease() }

// ReportName is Names().Report().
func (c *PostgresCluster) ReportName() string { return c.Names().Report() }

// SuperuserSecretName is Names().SuperuserSecret().
func (c *PostgresCluster) SuperuserSecretName() string { return c.Names().SuperuserSecret() }

// ReplicationSecretName is Names().ReplicationSecret().
func (c *PostgresCluster) ReplicationSecretName() string { return c.Names().ReplicationSecret() }

// AppSecretName is Names().AppSecret().
func (c *PostgresCluster) AppSecretName() string { return c.Names().AppSecret() }

// AgentTokenSecretName is Names().AgentTokenSecret().
func (c *PostgresCluster) AgentTokenSecretName() string { return c.Names().AgentTokenSecret() }

// ReadWriteServiceName is Names().ReadWriteService().
func (c *PostgresCluster) ReadWriteServiceName() string { return c.Names().ReadWriteService() }

// InstanceName is Names().Instance(i).
func (c *PostgresCluster) InstanceName(i int) string { return c.Names().Instance(i) }

// VolumeClaimName is Names().VolumeClaim(i).
func (c *PostgresCluster) VolumeClaimName(i int) string { return c.Names().VolumeClaim(i) }

// ManagedParameters are the postgresql.conf settings pgpilot sets itself; the CRD
// refuses them in spec.postgresql.parameters. The CEL rule on that field lists the same
// names (a test keeps the two in step).
// Names are compared case-insensitively, as PostgreSQL does. The ones that run a shell
// command (archive_command, archive_cleanup_command, recovery_end_command,
// restore_command, ssl_passphrase_command) or load a module to archive with
// (archive_library) are among them: a parameter must never run code.
var ManagedParameters = []string{
	"archive_cleanup_command", "archive_command", "archive_library", "archive_mode",
	"cluster_name", "config_file", "data_directory",
	"external_pid_file", "hba_file", "hot_standby", "ident_file", "listen_addresses",
	"logging_collector", "max_replication_slots", "max_wal_senders", "port",
	"primary_conninfo", "primary_slot_name", "promote_trigger_file", "recovery_end_command",
	"recovery_target",
	"recovery_target_action", "recovery_target_inclusive", "recovery_target_lsn",
	"recovery_target_name", "recovery_target_time", "recovery_target_timeline",
	"recovery_target_xid", "restore_command",
	"ssl", "ssl_ca_file", "ssl_cert_file", "ssl_key_file", "ssl_passphrase_command",
	"synchronous_standby_names",
	"unix_socket_directories", "wal_level", "wal_log_hints",
}

// LibraryParameters are the settings whose values name shared libraries postgres
// loads (into the postmaster or a session) or the directories it loads them from.
// A library is code run as the database's OS user, which can read the pod's
// credentials: each must come from PostgreSQL's own library directory ($libdir, in
// the image, not writable), never from a path a database login or a volume could
// write (a file written by COPY TO, a tablespace, the data directory).
var LibraryParameters = []string{"dynamic_library_path", "jit_provider", "local_preload_libraries",
	"session_preload_libraries", "shared_preload_libraries"}

// DynamicLibraryPath is what dynamic_library_path may be: empty, or $libdir (as often
// as written, colon-separated). The CRD's rule on parameters uses the same expression.
var DynamicLibraryPath = regexp.MustCompile(`^([$]libdir(:[$]libdir)*)?$`)

// UnsafeLibraryValue says why the value of setting name could load a library from
// outside $libdir, "" when it cannot (or name loads none; names in any case). Library
// names must not hold '/': a name without one is looked up in dynamic_library_path,
// and that must be exactly $libdir (PostgreSQL's default).
func UnsafeLibraryValue(name, value string) string {
	switch setting := strings.ToLower(name); {
	case !slices.Contains(LibraryParameters, setting):
		return ""
	case setting == "dynamic_library_path":
		if DynamicLibraryPath.MatchString(value) {
			return ""
		}
		return fmt.Sprintf("%s = %q loads libraries from outside PostgreSQL's library directory, code that would run as the database's OS user: "+
			"remove it (the default, $libdir, is the only value allowed)", name, value)
	case strings.Contains(value, "/"):
		return fmt.Sprintf("%s = %q names a library by path, code that would run as the database's OS user from a place that may be writable: "+
			"name libraries without '/' (pg_stat_statements, auto_explain), which PostgreSQL loads from its own library directory", name, value)
	}
	return ""
}

// ParameterName is the syntax of a PostgreSQL setting's name: an identifier, or a
// module's prefix, a dot and an identifier (pg_stat_statements.max). The CRD's rule on
// spec.postgresql.parameters uses the same expression.
var ParameterName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*([.][A-Za-z_][A-Za-z0-9_$]*)*$`)

// CheckParameters says what is wrong with spec.postgresql.parameters beyond what the CRD
// checks: every name is a setting's name and none is managed in another case, every
// value is one line, and none weakens durability unless AllowUnsafeDurability. Nil when
// nothing is.
func (pg PostgreSQLSpec) CheckParameters() error {
	names := slices.Sorted(maps.Keys(pg.Parameters))
	var problems []string
	for _, name := range names {
		value := pg.Parameters[name]
		setting := strings.ToLower(name)
		on := strings.ToLower(strings.TrimSpace(value))
		switch {
		case !ParameterName.MatchString(name):
			problems = append(problems, fmt.Sprintf("%q is not a setting name: a letter or _, then letters, digits, _ or $; "+
				"a module's settings after its name and a dot (pg_stat_statements.max)", name))
		case IsManagedParameter(name):
			problems = append(problems, fmt.Sprintf("%s is managed by pgpilot or runs a shell command, in any case: remove it", name))
		case strings.ContainsAny(value, "\r\n"):
			problems = append(problems, fmt.Sprintf("the value of %s must be one line: remove its line breaks", name))
		case UnsafeLibraryValue(name, value) != "":
			problems = append(problems, UnsafeLibraryValue(name, value))
		case setting == "ssl_min_protocol_version" && !slices.Contains([]string{"tlsv1.2", "tlsv1.3"}, on):
			problems = append(problems, fmt.Sprintf("%s = %q allows TLS versions with known weaknesses: use TLSv1.2 or TLSv1.3", name, value))
		case pg.AllowUnsafeDurability:
		case (setting == "fsync" || setting == "full_page_writes") && !slices.Contains([]string{"on", "true", "yes", "1"}, on):
			problems = append(problems, fmt.Sprintf("%s = %q can corrupt the data directory in a crash: remove it, "+
				"or set spec.postgresql.allowUnsafeDurability: true for a disposable test cluster", name, value))
		case setting == "synchronous_commit" && !slices.Contains([]string{"on", "remote_apply", "remote_write", "true", "yes", "1"}, on):
			problems = append(problems, fmt.Sprintf("%s = %q acknowledges commits without the primary's commit gate: a primary cut off "+
				"from the cluster would keep acknowledging them after a replica took over, and a failover loses them: use on, "+
				"remote_write or remote_apply, or set spec.postgresql.allowUnsafeDurability: true for a disposable test cluster", name, value))
		}
	}
	if b := pg.LossBudget; b != nil && b.Sign() < 0 {
		problems = append(problems, fmt.Sprintf("lossBudget %s is negative: set a size such as 1Mi, 0 to wait for a standby "+
			"to have every commit, or remove it for no bound", b.String()))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("spec.postgresql.parameters: %s", strings.Join(problems, "; "))
}

// IsManagedParameter reports whether name is one of ManagedParameters, in any case.
func IsManagedParameter(name string) bool {
	return slices.Contains(ManagedParameters, strings.ToLower(name))
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

// FollowedSource is the host of the source a replica cluster follows now; "" when it
// is not a replica cluster, or was promoted.
func (c *PostgresCluster) FollowedSource() string {
	if r := c.Spec.Replica; r != nil && r.Enabled {
		return r.Source.Host
	}
	return ""
}
