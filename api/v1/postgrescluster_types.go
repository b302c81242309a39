package v1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PostgresClusterSpec is what a user asks for. It is also, verbatim, the values of the
// postgrescluster Helm chart, so every field here has a key of the same name in
// helm-charts/postgrescluster/values.yaml and values.schema.json.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.replica) || has(self.replica)",message="replica cannot be removed: set replica.enabled to false to promote the cluster"
// +kubebuilder:validation:XValidation:rule="!has(self.postgresql) || !has(self.postgresql.synchronousReplicas) || self.postgresql.synchronousReplicas < self.replicas",message="postgresql.synchronousReplicas must be less than replicas: a commit can only wait for instances other than the primary"
// +kubebuilder:validation:XValidation:rule="!has(self.roles) || !has(self.bootstrap) || !has(self.bootstrap.owner) || self.roles.all(r, r.name != self.bootstrap.owner)",message="roles cannot name the bootstrap owner: its password is the Secret <cluster>-app's, set by pgpilot"
// +kubebuilder:validation:XValidation:rule="!has(self.roles) || !(self.version in ['14', '15']) || self.roles.all(r, !has(r.createrole) || !r.createrole)",message="roles cannot have createrole with PostgreSQL 14 or 15: there a CREATEROLE role can grant itself pg_execute_server_program and run programs in the database container; grant what the role needs instead, or use version 16 or later, where CREATEROLE is limited to the roles it made"
// +kubebuilder:validation:XValidation:rule="!has(self.databases) || !has(self.bootstrap) || !has(self.bootstrap.database) || self.databases.all(d, d.name != self.bootstrap.database || !has(d.ensure) || d.ensure != 'absent')",message="the bootstrap database cannot be ensured absent"
type PostgresClusterSpec struct {
	// replicas is the number of PostgreSQL instances in total: one primary and
	// replicas-1 streaming replicas.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +kubebuilder:default=3
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// version is the PostgreSQL major version. It selects the default image
	// (postgres:<version>.<minor>). Once the cluster has data, a newer major upgrades
	// it in place with pg_upgrade (docs/operations.md, "Major version upgrades"), and
	// an older one is refused but the data's own (status.dataVersion), which stops an
	// upgrade that has not finished.
	// +kubebuilder:validation:Enum="14";"15";"16";"17";"18"
	Version string `json:"version"`

	// image overrides the PostgreSQL container image chosen from version. It must run
	// the same major version as version.
	// +kubebuilder:validation:MinLength=1
	// +optional
	Image string `json:"image,omitempty"`

	// imagePullPolicy of the PostgreSQL container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// storage of each instance's data directory.
	// +kubebuilder:default={}
	// +optional
	Storage StorageSpec `json:"storage,omitempty"`

	// resources of the PostgreSQL container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// postgresql holds PostgreSQL server settings.
	// +kubebuilder:default={}
	// +optional
	PostgreSQL PostgreSQLSpec `json:"postgresql,omitempty"`

	// bootstrap says how a new cluster's first instance is initialised.
	// +kubebuilder:default={}
	// +optional
	Bootstrap BootstrapSpec `json:"bootstrap,omitempty"`

	// roles are PostgreSQL roles kept as written, without a restart, besides the
	// bootstrap owner: attributes, a password from a Secret, memberships. No superuser:
	// see docs/operations.md, "Roles and databases".
	// +kubebuilder:validation:MaxItems=100
	// +listType=map
	// +listMapKey=name
	// +optional
	Roles []RoleSpec `json:"roles,omitempty"`

	// databases are databases kept as written, without a restart: owner and
	// extensions. The bootstrap database may be listed, to manage its extensions.
	// +kubebuilder:validation:MaxItems=100
	// +listType=map
	// +listMapKey=name
	// +optional
	Databases []DatabaseSpec `json:"databases,omitempty"`

	// affinity of the instance pods. When unset, instances prefer to run on
	// different nodes.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// tolerations of the instance pods.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// nodeSelector of the instance pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// failover configures automatic failover.
	// +kubebuilder:default={}
	// +optional
	Failover FailoverSpec `json:"failover,omitempty"`

	// stopped hibernates the cluster: the primary stops first, cleanly, and keeps the
	// primary role; once the standbys have its final WAL every pod goes. The volumes,
	// the Secrets, the Services and the primary Lease stay. Set it back to false to
	// resume: the same primary starts again and the replicas follow it, nothing
	// replayed or cloned (docs/operations.md, "Hibernation").
	// +optional
	Stopped bool `json:"stopped,omitempty"`

	// upgrade is how a major version upgrade (a newer version) may begin.
	// +optional
	Upgrade UpgradeSpec `json:"upgrade,omitempty"`

	// monitoring configures Prometheus scraping of the instances.
	// +kubebuilder:default={}
	// +optional
	Monitoring MonitoringSpec `json:"monitoring,omitempty"`

	// networkPolicy limits who may connect to the instances.
	// +kubebuilder:default={}
	// +optional
	NetworkPolicy NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// backup configures continuous WAL archiving, scheduled base backups and their
	// retention.
	// +optional
	Backup *BackupSpec `json:"backup,omitempty"`

	// tls chooses the certificate PostgreSQL serves; by default the operator issues one
	// from a CA of the cluster's own, published in the Secret <cluster>-ca (ca.crt).
	// +optional
	TLS TLSSpec `json:"tls,omitempty"`

	// pooler puts PgBouncer in front of the cluster: the Services <cluster>-pooler-rw
	// (and <cluster>-pooler-ro with readOnly), which hold clients' queries while the
	// primary moves in a switchover, a rolling update or a drain instead of failing
	// them (docs/pooler.md). None when unset.
	// +optional
	Pooler *PoolerSpec `json:"pooler,omitempty"`

	// replica makes this a replica cluster: its first instance clones another pgpilot
	// cluster (the source) over TLS and follows its WAL; the other instances follow it.
	// It serves reads only, until replica.enabled is set to false, which promotes it
	// (docs/replica-cluster.md). It is given when the cluster is created.
	// +optional
	Replica *ReplicaSpec `json:"replica,omitempty"`
}

// ReplicaSpec is what a replica cluster follows.
type ReplicaSpec struct {
	// enabled: the cluster follows its source. Set it to false to promote the cluster:
	// its designated primary stops following the source and becomes a primary on a new
	// timeline, with what it had received; without promotionToken, anything the
	// source committed after that is not in it (status.replica says how far behind it
	// was). Added to, or set true on, a cluster that runs a primary, it demotes that
	// primary: writes stop, it shuts down cleanly, and it follows the source, its
	// final position given in status.replica.demotionToken (docs/replica-cluster.md).
	// +kubebuilder:default=true
	Enabled bool `json:"enabled"`

	// source is the cluster followed.
	Source ReplicaSource `json:"source"`

	// promotionToken is the source's status.replica.demotionToken, after it was
	// demoted to follow this cluster: with it, enabled false promotes only once this
	// cluster has replayed all the source wrote (the planned switch of roles, which
	// loses nothing).
	// +kubebuilder:validation:Pattern=`^[0-9]+:[0-9]+:[0-9A-F]{1,8}/[0-9A-F]{1,8}$`
	// +kubebuilder:validation:MaxLength=64
	// +optional
	PromotionToken string `json:"promotionToken,omitempty"`
}

// ReplicaSource is how a replica cluster reaches its source: as the source's
// replication role, by its client certificate, verifying the source's server
// certificate for host.
type ReplicaSource struct {
	// host is the source's read-write Service as this cluster's pods reach it, such as
	// my-db-rw.prod.svc. The source's server certificate must name it: pgpilot's names
	// <cluster>-rw.<namespace>.svc; for another Kubernetes cluster, expose the source
	// and give it a certificate for that name (spec.tls.serverSecretName).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Host string `json:"host"`

	// port of the source's PostgreSQL.
	// +kubebuilder:default=5432
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// replicationSecretName is a Secret in this namespace with the source's replication
	// client certificate (tls.crt, tls.key: a copy of the source's
	// <cluster>-replication-tls) and ca.crt, the CA that verifies the source's server
	// certificate. Whoever holds it can read every row of the source: keep it as
	// guarded as the source's own Secrets.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ReplicationSecretName string `json:"replicationSecretName"`
}

// PoolerSpec is a cluster's PgBouncer pooler.
type PoolerSpec struct {
	// instances is how many PgBouncer pods serve each of the pooler's Services; they
	// prefer different nodes, and a drain keeps all but one.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +kubebuilder:default=2
	// +optional
	Instances int32 `json:"instances,omitempty"`

	// mode is PgBouncer's pool_mode: when a server connection goes back to the pool
	// for another client. transaction (the default) at the end of each transaction;
	// session when the client disconnects (session state such as SET, LISTEN, advisory
	// locks and temporary tables needs it); statement after each statement.
	// +kubebuilder:validation:Enum=session;transaction;statement
	// +kubebuilder:default=transaction
	// +optional
	Mode string `json:"mode,omitempty"`

	// poolSize is how many server connections each pooler pod opens per user and
	// database (default_pool_size).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=20
	// +optional
	PoolSize int32 `json:"poolSize,omitempty"`

	// maxClientConnections is how many client connections each pooler pod accepts
	// (max_client_conn).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=1000
	// +optional
	MaxClientConnections int32 `json:"maxClientConnections,omitempty"`

	// readOnly adds the Service <cluster>-pooler-ro, pooling connections to the
	// replicas that serve reads (<cluster>-ro).
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`

	// parameters are other pgbouncer.ini settings. What pgpilot sets itself (where it
	// listens, authentication, TLS, the admin users, the pool sizes and mode above,
	// logging targets) is refused by the API server; values must be one line without
	// '"' or '%', which the operator checks before it renders anything and says in the
	// Ready condition (a CEL rule over every value exceeds the API server's cost budget).
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z_][a-z0-9_]*$'))",message="pooler parameters are PgBouncer settings' names: lower case letters, digits and _"
	// +kubebuilder:validation:XValidation:rule="self.all(k, !(k in ['admin_users', 'auth_dbname', 'auth_file', 'auth_hba_file', 'auth_query', 'auth_type', 'auth_user', 'client_tls_ca_file', 'client_tls_cert_file', 'client_tls_key_file', 'client_tls_sslmode', 'conffile', 'default_pool_size', 'listen_addr', 'listen_port', 'logfile', 'max_client_conn', 'peer_id', 'pidfile', 'pool_mode', 'server_tls_ca_file', 'server_tls_cert_file', 'server_tls_key_file', 'server_login_retry', 'server_tls_sslmode', 'service_name', 'so_reuseport', 'stats_users', 'syslog', 'syslog_facility', 'syslog_ident', 'unix_socket_dir', 'unix_socket_group', 'unix_socket_mode', 'user']))",message="pooler parameters set by pgpilot cannot be given: admin_users, auth_dbname, auth_file, auth_hba_file, auth_query, auth_type, auth_user, client_tls_*, conffile, default_pool_size (use poolSize), listen_addr, listen_port, logfile, max_client_conn (use maxClientConnections), peer_id, pidfile, pool_mode (use mode), server_tls_*, server_login_retry, service_name, so_reuseport, stats_users, syslog*, unix_socket_*, user"
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`

	// resources of the PgBouncer container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// StorageSpec is the persistent volume of each instance.
// +kubebuilder:validation:XValidation:rule="has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",message="storageClassName cannot be changed after creation: existing volumes cannot move to another class"
// +kubebuilder:validation:XValidation:rule="!has(self.autoGrow) || !has(self.size) || quantity(string(self.autoGrow.maxSize)).compareTo(quantity(string(self.size))) >= 0",message="autoGrow.maxSize must be at least size"
type StorageSpec struct {
	// size of each instance's volume. It can never shrink. A larger size expands every
	// instance's PersistentVolumeClaim online, where the StorageClass allows volume
	// expansion (the StorageResized condition says when it does not); instances added
	// later get it too.
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="size must be greater than zero"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",messageExpression="'size cannot shrink from ' + string(oldSelf) + ' to ' + string(self) + ': a volume cannot be made smaller without losing data'"
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// storageClassName of the instances' volumes; the cluster's default class when
	// unset. Fixed at creation.
	// +kubebuilder:validation:MinLength=1
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// autoGrow expands every instance's volume before it fills up, up to maxSize.
	// +optional
	AutoGrow *AutoGrowSpec `json:"autoGrow,omitempty"`
}

// AutoGrowSpec grows the volumes when one is fuller than threshold: each time by
// increment percent of their size, never beyond maxSize. The claims' requests hold the
// grown size; spec.storage.size is left as written.
type AutoGrowSpec struct {
	// maxSize is the largest the volumes may grow to.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="maxSize must be greater than zero"
	MaxSize resource.Quantity `json:"maxSize"`

	// threshold is the percentage of a volume in use above which the volumes grow.
	// +kubebuilder:validation:Minimum=50
	// +kubebuilder:validation:Maximum=95
	// +kubebuilder:default=80
	// +optional
	Threshold int32 `json:"threshold,omitempty"`

	// increment is how much the volumes grow each time, in percent of their size
	// (at least 1Gi).
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=25
	// +optional
	Increment int32 `json:"increment,omitempty"`
}

// PostgreSQLSpec holds PostgreSQL server settings.
type PostgreSQLSpec struct {
	// parameters are postgresql.conf settings. Settings that pgpilot manages itself
	// (replication, archiving, listening addresses, file locations) and settings that
	// run a shell command are refused, in any case (PostgreSQL's names are
	// case-insensitive). Names must be setting names, values one line. fsync and
	// full_page_writes must stay on, and synchronous_commit must wait for the commit gate
	// (on, remote_write or remote_apply), unless allowUnsafeDurability is. Libraries
	// (shared_preload_libraries, session_preload_libraries, local_preload_libraries,
	// jit_provider) are named without '/', and dynamic_library_path stays $libdir. The
	// API server refuses the managed names and the library paths as written here; the operator checks the rest before it renders
	// anything, and says what is wrong in the Ready condition (CEL rules over every key
	// and value exceed the API server's cost budget).
	// +kubebuilder:validation:MaxProperties=256
	// +kubebuilder:validation:XValidation:rule="self.all(k, !(k in ['archive_cleanup_command', 'archive_command', 'archive_library', 'archive_mode', 'cluster_name', 'config_file', 'data_directory', 'external_pid_file', 'hba_file', 'hot_standby', 'ident_file', 'listen_addresses', 'logging_collector', 'max_replication_slots', 'max_wal_senders', 'port', 'primary_conninfo', 'primary_slot_name', 'promote_trigger_file', 'recovery_end_command', 'recovery_target', 'recovery_target_action', 'recovery_target_inclusive', 'recovery_target_lsn', 'recovery_target_name', 'recovery_target_time', 'recovery_target_timeline', 'recovery_target_xid', 'restore_command', 'ssl', 'ssl_ca_file', 'ssl_cert_file', 'ssl_key_file', 'ssl_passphrase_command', 'synchronous_standby_names', 'unix_socket_directories', 'wal_level', 'wal_log_hints']))",message="parameters managed by pgpilot or that run shell commands cannot be set: archive_cleanup_command, archive_command, archive_library, archive_mode, cluster_name, config_file, data_directory, external_pid_file, hba_file, hot_standby, ident_file, listen_addresses, logging_collector, max_replication_slots, max_wal_senders, port, primary_conninfo, primary_slot_name, promote_trigger_file, recovery_end_command, recovery_target, recovery_target_action, recovery_target_inclusive, recovery_target_lsn, recovery_target_name, recovery_target_time, recovery_target_timeline, recovery_target_xid, restore_command, ssl, ssl_ca_file, ssl_cert_file, ssl_key_file, ssl_passphrase_command, synchronous_standby_names, unix_socket_directories, wal_level, wal_log_hints"
	// +kubebuilder:validation:XValidation:rule="['jit_provider', 'local_preload_libraries', 'session_preload_libraries', 'shared_preload_libraries'].all(k, !(k in self) || !self[k].contains('/')) && (!('dynamic_library_path' in self) || self['dynamic_library_path'].matches('^([$]libdir(:[$]libdir)*)?$'))",message="libraries must come from PostgreSQL's own library directory: shared_preload_libraries, session_preload_libraries, local_preload_libraries and jit_provider name libraries without '/' (pg_stat_statements, auto_explain), and dynamic_library_path can only be $libdir, its default; a library elsewhere could be written by a database login and would run as the database's OS user"
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`

	// synchronousReplicas is how many replicas must confirm each commit before it is
	// acknowledged (the primary's synchronous_standby_names is FIRST n+1 over its
	// commit gate, which confirms only while the primary holds its Lease, and the
	// replicas of the synchronous set the Lease records). 0, the default, is
	// asynchronous replication. With n > 0 no acknowledged write is lost in a
	// failover, and writes wait while fewer than n replicas are streaming.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=15
	// +kubebuilder:default=0
	// +optional
	SynchronousReplicas int32 `json:"synchronousReplicas,omitempty"`

	// lossBudget bounds what a failover can lose in asynchronous mode
	// (synchronousReplicas 0): the primary acknowledges a commit only while some standby
	// has flushed all the WAL before it but at most this much (bytes, such as 1Mi), so a
	// crash or an isolation of the primary never loses more acknowledged WAL than this.
	// Writes wait while no standby is that close (all of them away, or too far behind),
	// as they wait in synchronous mode while too few replicas stream. Unset, the default:
	// no bound (a failover loses what the most advanced standby had not received). It
	// has no effect with a single instance or in synchronous mode (which loses nothing).
	// +optional
	LossBudget *resource.Quantity `json:"lossBudget,omitempty"`

	// idleSlotTimeout is how long the primary keeps WAL for a replica that is not
	// streaming (its pod down, its node drained, its network cut). Past it the replica's
	// replication slot stops holding WAL, and the replica, when it returns, catches up
	// from the WAL archive or is cloned again. Before it, the WAL a slot keeps is bounded
	// by a quarter of the volume (max_slot_wal_keep_size) whatever the time. 0s keeps WAL
	// up to that bound only.
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('168h')",message="idleSlotTimeout must be a duration between 0s and 168h, such as 30m"
	// +optional
	IdleSlotTimeout *metav1.Duration `json:"idleSlotTimeout,omitempty"`

	// maxReadLag is how far behind the primary a replica may be and still serve reads:
	// a replica is ready (in the -ro and -r Services) only while its WAL receiver
	// streams from the current primary and it has replayed what the primary had
	// maxReadLag ago. One that does not stream, or lags more, is not ready and makes
	// the cluster Degraded (condition ReplicasStreaming) until it catches up.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="maxReadLag must be a duration between 1s and 24h, such as 30s"
	// +optional
	MaxReadLag *metav1.Duration `json:"maxReadLag,omitempty"`

	// allowUnsafeDurability lets parameters turn fsync or full_page_writes off, or
	// synchronous_commit off or local, and keeps a database's or role's
	// synchronous_commit = local or off (ALTER DATABASE/ROLE ... SET), which the primary
	// otherwise resets. A crash can then corrupt the data, a failover lose acknowledged
	// writes, and a primary cut off from the cluster acknowledge writes after a replica
	// took over: for disposable test clusters only.
	// +optional
	AllowUnsafeDurability bool `json:"allowUnsafeDurability,omitempty"`

	// superuserNetworkAccess lets the postgres superuser log in over the network (TLS
	// and its password, from the superuser Secret). Off by default: the superuser logs in
	// only over the instance's local socket (kubectl exec), so its password is worth
	// nothing to anyone who reaches port 5432.
	// +optional
	SuperuserNetworkAccess bool `json:"superuserNetworkAccess,omitempty"`
}

// TLSSpec says which certificate PostgreSQL serves. TLS is always on: network
// connections must use it (hostssl), with TLS 1.2 or later.
type TLSSpec struct {
	// serverSecretName names a kubernetes.io/tls Secret in the cluster's namespace, with
	// tls.crt, tls.key and ca.crt, that PostgreSQL serves instead of the certificate the
	// operator issues from the cluster's own CA. A cert-manager Certificate writes such
	// a Secret: set its secretName here. Its names must include the -rw, -ro and -r
	// Services (and *.<cluster>-headless.<namespace>.svc, which replicas verify the primary
	// with); ca.crt must verify it. Renewals of the Secret are picked up without a restart.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServerSecretName string `json:"serverSecretName,omitempty"`
}

// BootstrapSpec says how the first instance of a new cluster is initialised.
// +kubebuilder:validation:XValidation:rule="has(self.fromBackup) == has(oldSelf.fromBackup)",message="fromBackup cannot be added or removed: it only matters when the cluster is created"
type BootstrapSpec struct {
	// database is the application database created at initialisation.
	// +kubebuilder:default=app
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="!(self in ['postgres', 'template0', 'template1'])",message="database cannot be a PostgreSQL system database (postgres, template0, template1)"
	// +optional
	Database string `json:"database,omitempty"`

	// owner is the role that owns the application database; its credentials are in
	// the Secret <cluster>-app.
	// +kubebuilder:default=app
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="!(self in ['postgres', 'pgpilot_replication']) && !self.startsWith('pg_')",message="owner cannot be postgres, pgpilot_replication or start with pg_: those roles are reserved"
	// +optional
	Owner string `json:"owner,omitempty"`

	// fromBackup creates the cluster from a backup instead of an empty database,
	// optionally to a point in time. The restored database keeps its roles; their
	// passwords are set from this cluster's Secrets.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="fromBackup cannot change: it only matters when the cluster is created"
	// +optional
	FromBackup *FromBackup `json:"fromBackup,omitempty"`
}

// UpgradeSpec is how a major version upgrade may begin (docs/operations.md, "Major
// version upgrades").
type UpgradeSpec struct {
	// backupMaxAge is how old the newest base backup of the data may be when an upgrade
	// stops the primary, such as 24h (the default): an older one, or none, holds the
	// upgrade in its checks (condition MajorUpgrade, reason UpgradeChecking) until a
	// backup is taken.
	// +optional
	BackupMaxAge *metav1.Duration `json:"backupMaxAge,omitempty"`
	// withoutBackup lets an upgrade begin without a recent base backup, or on a cluster
	// with no backup store. The old data is still kept on the volumes (set aside).
	// +optional
	WithoutBackup bool `json:"withoutBackup,omitempty"`
}

// FailoverSpec configures automatic failover.
type FailoverSpec struct {
	// enabled lets the operator promote a replica when the primary fails.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// delay is how long the primary must be failed (its agent unreachable, or postgres
	// not ready) before a replica is promoted: long enough to ride out a blip, short
	// enough that writes do not wait long.
	// +kubebuilder:default="3s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('10m')",message="delay must be a duration between 0s and 10m, such as 3s"
	// +optional
	Delay *metav1.Duration `json:"delay,omitempty"`

	// startTimeout is, with asynchronous replication, how long a primary that is
	// restarting after a crash (recovering) may take before a replica is promoted in its
	// place: restarting in place keeps the commits it had not sent to the replicas. A
	// primary that crashes three times within a minute is replaced after delay, and so
	// is any failed primary with synchronous replication, which loses nothing.
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="startTimeout must be a duration between 0s and 1h, such as 60s"
	// +optional
	StartTimeout *metav1.Duration `json:"startTimeout,omitempty"`
}

// MonitoringSpec configures Prometheus scraping.
type MonitoringSpec struct {
	// enabled renders a PodMonitor for the instances' metrics endpoint, a
	// PrometheusRule with pgpilot's alerts and a Grafana dashboard ConfigMap when the
	// Prometheus Operator's CRDs are installed; the MonitoringReady condition says
	// when they are not (docs/monitoring.md).
	// +kubebuilder:default=false
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// customQueries names a ConfigMap in the cluster's namespace holding custom
	// queries in postgres_exporter's format, which every instance runs at each scrape
	// as a role with pg_monitor's privileges and no more (docs/monitoring.md). A bad
	// file or query is reported in the metrics, never fails a scrape. Setting or
	// clearing it restarts the instances one at a time.
	// +optional
	CustomQueries *CustomQueriesSource `json:"customQueries,omitempty"`
}

// CustomQueriesSource is a key of a ConfigMap.
type CustomQueriesSource struct {
	// name of the ConfigMap.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// key of the queries file in the ConfigMap.
	// +kubebuilder:default="queries.yaml"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
}

// PostgresClusterStatus is what pgpilot observes. The controller writes every field here
// but conditions of the Helm types and deployedRelease, which the Helm manager writes.
type PostgresClusterStatus struct {
	// conditions: Ready, Bootstrapped, CredentialsReady and RolesReconciled (controller); Initialized, Deployed,
	// ReleaseFailed and Irreconcilable (Helm manager).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`

	// phase is a one-word summary: Creating, Healthy, Degraded, Unavailable, Failed,
	// Stopping or Stopped (spec.stopped).
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// currentPrimary is the name of the pod that holds the primary role.
	// +optional
	CurrentPrimary string `json:"currentPrimary,omitempty"`

	// dataVersion is the PostgreSQL major version of the cluster's data, as its primary
	// runs it. spec.version can be set to it or to a newer major (an upgrade), never
	// to an older one.
	// +optional
	DataVersion string `json:"dataVersion,omitempty"`

	// readyInstances counts instance pods that are Ready.
	// +optional
	ReadyInstances int32 `json:"readyInstances"`

	// instances lists every instance pod with its role and readiness.
	// +listType=map
	// +listMapKey=name
	// +optional
	Instances []InstanceStatus `json:"instances,omitempty"`

	// roles are spec.roles as last reconciled in PostgreSQL, and the roles removed from
	// the spec since (Unmanaged).
	// +listType=map
	// +listMapKey=name
	// +optional
	Roles []ManagedStatus `json:"roles,omitempty"`

	// databases are spec.databases as last reconciled in PostgreSQL, and the databases
	// removed from the spec since (Unmanaged).
	// +listType=map
	// +listMapKey=name
	// +optional
	Databases []ManagedStatus `json:"databases,omitempty"`

	// lastBackup is the newest Completed PostgresBackup.
	// +optional
	LastBackup string `json:"lastBackup,omitempty"`

	// lastBackupVerification is the outcome of the last restore verification
	// (spec.backup.verify).
	// +optional
	LastBackupVerification *BackupVerification `json:"lastBackupVerification,omitempty"`

	// replica is where a replica cluster stands (spec.replica): what it follows and
	// how far behind, or when it was promoted.
	// +optional
	Replica *ReplicaStatus `json:"replica,omitempty"`

	// pooler is the pooler's state (spec.pooler); absent without one.
	// +optional
	Pooler *PoolerStatus `json:"pooler,omitempty"`

	// lastFailover is the last automatic failover.
	// +optional
	LastFailover *FailoverRecord `json:"lastFailover,omitempty"`

	// observedGeneration is the generation the controller last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// operatorVersion is the version of the pgpilot operator that manages the cluster
	// now: the one whose controller last wrote this status. An operator upgrade changes it
	// as soon as the new operator runs; its rolling update of the instances follows.
	// +optional
	OperatorVersion string `json:"operatorVersion,omitempty"`

	// deployedRelease is written by the Helm manager: the Helm release that renders
	// this cluster.
	// +optional
	DeployedRelease *DeployedRelease `json:"deployedRelease,omitempty"`
}

// InstanceStatus is one instance pod as the controller last saw it.
type InstanceStatus struct {
	// name of the pod.
	Name string `json:"name"`
	// role is primary, replica, fenced (a former primary not yet rejoined, or an
	// instance fenced by the annotation db.example.com/fenced-instances), or empty
	// before the controller assigned one.
	// +optional
	Role string `json:"role,omitempty"`
	// ready is the pod's Ready condition.
	Ready bool `json:"ready"`
	// message says why an instance that is not ready does not run, when its pod, the
	// kubelet, the StatefulSet or its agent says: an image that cannot be pulled, a
	// pod that cannot be scheduled or created, a container that keeps exiting (killed
	// for memory, say), or the error postgres or the agent met starting it, in their
	// own words.
	// +optional
	Message string `json:"message,omitempty"`
	// node the pod is scheduled on.
	// +optional
	Node string `json:"node,omitempty"`
	// volume is the instance's data volume claim: what it requests and what it has.
	// +optional
	Volume *VolumeStatus `json:"volume,omitempty"`
	// setAside lists the data directories the instance's agent replaced by a new clone
	// and kept on its volume instead of deleting them ("name: reason"); a superseded
	// one is removed when the volume needs the space.
	// +optional
	SetAside []string `json:"setAside,omitempty"`
	// pendingRestart lists the settings postgres on this instance takes only at a
	// restart and runs with another value of until then ("name: running → new"); the
	// operator restarts the instances one at a time (the PendingRestart condition).
	// +optional
	PendingRestart []string `json:"pendingRestart,omitempty"`
}

// PoolerStatus is the pooler as last seen.
type PoolerStatus struct {
	// instances is how many pooler pods the read-write pool asks for, readyInstances
	// how many of them are ready to take clients.
	Instances      int32 `json:"instances"`
	ReadyInstances int32 `json:"readyInstances"`
	// message says what keeps the pooler from serving, when something does.
	// +optional
	Message string `json:"message,omitempty"`
}

// VolumeStatus is an instance's PersistentVolumeClaim as last seen.
type VolumeStatus struct {
	// claim is the PersistentVolumeClaim's name.
	Claim string `json:"claim"`
	// requested is the size the claim requests.
	// +optional
	Requested string `json:"requested,omitempty"`
	// capacity is the size the volume has; below requested while it is expanded.
	// +optional
	Capacity string `json:"capacity,omitempty"`
	// resizing says where an expansion stands (the claim's Resizing or
	// FileSystemResizePending condition); empty when none is under way.
	// +optional
	Resizing string `json:"resizing,omitempty"`
}

// FailoverRecord is one failover.
type FailoverRecord struct {
	// from is the failed primary's pod.
	From string `json:"from"`
	// to is the promoted replica's pod.
	To string `json:"to"`
	// time is when the primary Lease moved.
	Time metav1.Time `json:"time"`
	// duration is from the first observation of the failure to the promotion.
	// +optional
	Duration string `json:"duration,omitempty"`
	// reason says why, for a person.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// DeployedRelease is the Helm release of the cluster, as the Helm manager writes it.
type DeployedRelease struct {
	// name of the Helm release.
	// +optional
	Name string `json:"name,omitempty"`
	// manifest is not written: the rendered chart is kept in the Helm release (helm get
	// manifest <name>), not copied into every cluster's status, its cache and its
	// watch events. A status written by an earlier version loses it at the next write.
	// +optional
	Manifest string `json:"manifest,omitempty"`
}

// Phase is a one-word summary of a cluster's health.
type Phase string

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pgc,categories=pgpilot
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Instances",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyInstances`
// +kubebuilder:printcolumn:name="Primary",type=string,JSONPath=`.status.currentPrimary`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Pooler",type=string,JSONPath=`.status.pooler.readyInstances`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.spec.version == oldSelf.spec.version || !has(self.status) || !has(self.status.dataVersion) || int(self.spec.version) >= int(self.status.dataVersion)",messageExpression="'spec.version cannot change from ' + oldSelf.spec.version + ' to ' + self.spec.version + ': the data is PostgreSQL ' + self.status.dataVersion + ' (status.dataVersion), and PostgreSQL cannot move data to an older major; keep ' + self.status.dataVersion + ' or a newer major (docs/operations.md, Major version upgrades)'"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be at most 50 characters of lowercase letters, digits and '-', start with a letter and end with a letter or digit: it names the cluster's Services and pods"

// PostgresCluster is a highly available PostgreSQL cluster: one primary and streaming
// replicas behind a read-write and a read-only Service.
type PostgresCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PostgresClusterSpec   `json:"spec"`
	Status PostgresClusterStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PostgresClusterList is a list of PostgresCluster.
type PostgresClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PostgresCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&PostgresCluster{}, &PostgresClusterList{})
}

// ReplicaStatus is where a replica cluster stands.
type ReplicaStatus struct {
	// source is spec.replica.source.host.
	Source string `json:"source"`
	// designatedPrimary is the instance that streams from the source; the others
	// stream from it.
	// +optional
	DesignatedPrimary string `json:"designatedPrimary,omitempty"`
	// streaming: the designated primary streams from the source and replays within
	// spec.postgresql.maxReadLag of it.
	Streaming bool `json:"streaming"`
	// lagSeconds is how long ago, in whole seconds, the source had the oldest WAL the
	// designated primary has not replayed yet: 0 when it replays what it is sent as it
	// comes (the agents' metrics have it to the millisecond).
	// +optional
	LagSeconds int64 `json:"lagSeconds,omitempty"`
	// message says why it does not stream, or how the promotion went.
	// +optional
	Message string `json:"message,omitempty"`
	// promotedAt is when the cluster was promoted (spec.replica.enabled false); from
	// then on it is a cluster of its own.
	// +optional
	PromotedAt *metav1.Time `json:"promotedAt,omitempty"`
	// demotionToken is, once a primary of this cluster was demoted to follow the
	// source, where it stopped: <system identifier>:<timeline>:<final LSN>. Give it
	// to the source as spec.replica.promotionToken.
	// +optional
	DemotionToken string `json:"demotionToken,omitempty"`
}
