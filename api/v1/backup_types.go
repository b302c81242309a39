package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackupSpec configures a cluster's backups. Setting it turns continuous WAL archiving
// on: the primary's agent copies every completed WAL segment to the store, so any point
// in time since the oldest kept base backup can be restored.
type BackupSpec struct {
	// store is where base backups and archived WAL are kept.
	Store BackupStore `json:"store"`

	// schedule of base backups, in cron format ("0 3 * * *", "@daily"), evaluated in
	// UTC. Without it, backups are only taken when a PostgresBackup is created by hand.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^ *(?:@(?:yearly|annually|monthly|weekly|daily|midnight|hourly)|@every +(?:[0-9]+(?:[.][0-9]+)?(?:ns|us|ms|s|m|h))+|(?:[*?]|(?:[0-5]?[0-9])(?:-(?:[0-5]?[0-9]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:[0-5]?[0-9])(?:-(?:[0-5]?[0-9]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:[01]?[0-9]|2[0-3])(?:-(?:[01]?[0-9]|2[0-3]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:[01]?[0-9]|2[0-3])(?:-(?:[01]?[0-9]|2[0-3]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[1-9]|[12][0-9]|3[01])(?:-(?:0?[1-9]|[12][0-9]|3[01]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[1-9]|[12][0-9]|3[01])(?:-(?:0?[1-9]|[12][0-9]|3[01]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(?:-(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(?:-(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(?:-(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(?:-(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(?:/0*[1-9][0-9]*)?)*) *$')",message="schedule must be a cron expression: five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT; each *, a value, a range a-b, a step /n, or a list of them), e.g. '0 3 * * *'; or @hourly, @daily, @weekly, @monthly, @yearly, or @every <duration> such as @every 6h"
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// retention says which completed base backups are kept; older ones are deleted with
	// the WAL that only they needed. The newest completed backup is never deleted.
	// +kubebuilder:default={count: 7}
	// +optional
	Retention *RetentionSpec `json:"retention,omitempty"`

	// target is the instance a backup is taken from: prefer-replica (the most caught-up
	// healthy replica, else the primary) or primary.
	// +kubebuilder:validation:Enum=prefer-replica;primary
	// +kubebuilder:default=prefer-replica
	// +optional
	Target BackupTarget `json:"target,omitempty"`

	// compression of new base backups: zstd (about 9:1 on table data, some 700 MB/s per
	// core), s2 (about half that ratio at three times the speed, for instances whose CPU
	// rather than their network bounds a backup) or none (for stores that compress or
	// deduplicate). Archived WAL is zstd-compressed whatever this says.
	// +kubebuilder:validation:Enum=zstd;s2;none
	// +kubebuilder:default=zstd
	// +optional
	Compression string `json:"compression,omitempty"`

	// verify restores the newest base backup into a throw-away PostgreSQL on a schedule
	// and checks it; the outcome is in status.lastBackupVerification. Without it, no
	// backup is verified.
	// +optional
	Verify *BackupVerifySpec `json:"verify,omitempty"`
}

// BackupVerifySpec schedules restore verifications: each runs in a Job of its own, whose
// pod restores the newest base backup onto a volume of spec.storage's size and class,
// starts PostgreSQL on it reaching no one and archiving nothing, opens every database
// and, with amcheck, checks every table and B-tree index.
type BackupVerifySpec struct {
	// schedule of verifications, in cron format, evaluated in UTC: "0 5 * * 0" is
	// Sundays at 05:00.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^ *(?:@(?:yearly|annually|monthly|weekly|daily|midnight|hourly)|@every +(?:[0-9]+(?:[.][0-9]+)?(?:ns|us|ms|s|m|h))+|(?:[*?]|(?:[0-5]?[0-9])(?:-(?:[0-5]?[0-9]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:[0-5]?[0-9])(?:-(?:[0-5]?[0-9]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:[01]?[0-9]|2[0-3])(?:-(?:[01]?[0-9]|2[0-3]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:[01]?[0-9]|2[0-3])(?:-(?:[01]?[0-9]|2[0-3]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[1-9]|[12][0-9]|3[01])(?:-(?:0?[1-9]|[12][0-9]|3[01]))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[1-9]|[12][0-9]|3[01])(?:-(?:0?[1-9]|[12][0-9]|3[01]))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(?:-(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(?:-(?:0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(?:/0*[1-9][0-9]*)?)* +(?:[*?]|(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(?:-(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(?:/0*[1-9][0-9]*)?(?:,(?:[*?]|(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(?:-(?:0?[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(?:/0*[1-9][0-9]*)?)*) *$')",message="schedule must be a cron expression: five fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT; each *, a value, a range a-b, a step /n, or a list of them), e.g. '0 3 * * *'; or @hourly, @daily, @weekly, @monthly, @yearly, or @every <duration> such as @every 6h"
	Schedule string `json:"schedule"`

	// amcheck also checks every table and B-tree index with pg_amcheck, which reads the
	// whole database.
	// +kubebuilder:default=true
	// +optional
	Amcheck *bool `json:"amcheck,omitempty"`

	// timeout fails a verification that has not finished in this long.
	// +kubebuilder:default="6h"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="timeout must be a duration of at least 1m, such as 6h"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// BackupVerification is the outcome of the last restore verification.
type BackupVerification struct {
	// job is the Job that ran it.
	Job string `json:"job"`
	// backup is the base backup it restored (its PostgresBackup's name), when it got as far
	// as choosing one.
	// +optional
	Backup string `json:"backup,omitempty"`
	// result is Succeeded or Failed.
	Result VerificationResult `json:"result"`
	// startedAt and finishedAt bound the verification.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// message says what was verified, how long each step took, or what failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// VerificationResult is how a restore verification ended.
type VerificationResult string

const (
	// VerificationSucceeded is a backup that restored, opened and passed every check.
	VerificationSucceeded VerificationResult = "Succeeded"
	// VerificationFailed is one that did not; the message says where.
	VerificationFailed VerificationResult = "Failed"
)

// BackupTarget chooses the instance a base backup is taken from.
type BackupTarget string

const (
	// BackupTargetPreferReplica backs up from a healthy replica when there is one.
	BackupTargetPreferReplica BackupTarget = "prefer-replica"
	// BackupTargetPrimary always backs up from the primary.
	BackupTargetPrimary BackupTarget = "primary"
)

// RetentionSpec says which base backups are kept. A backup is deleted only when it is
// outside every rule that is set: beyond the newest count and older than maxAge.
// +kubebuilder:validation:XValidation:rule="has(self.count) || has(self.maxAge)",message="retention needs count, maxAge or both"
type RetentionSpec struct {
	// count of the newest completed base backups to keep.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Count *int32 `json:"count,omitempty"`

	// maxAge keeps every completed base backup younger than this ("168h" for a week).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="maxAge must be a duration of at least 1m, such as 168h"
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
}

// BackupStore is where backups go: exactly one of volume or s3. Inside it, a cluster's
// backups live under <path>/<cluster name>/.
// +kubebuilder:validation:XValidation:rule="has(self.volume) != has(self.s3)",message="a backup store needs exactly one of volume or s3"
type BackupStore struct {
	// volume is a directory on a PersistentVolumeClaim that every instance pod mounts.
	// On more than one node the claim must be ReadWriteMany.
	// +optional
	Volume *VolumeStore `json:"volume,omitempty"`

	// s3 is an S3-compatible object store.
	// +optional
	S3 *S3Store `json:"s3,omitempty"`

	// path is a prefix inside the store, under which each cluster has a directory.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(s, s == '..' || s == '.')",message="path cannot contain . or .. segments"
	// +kubebuilder:validation:MaxLength=200
	// +optional
	Path string `json:"path,omitempty"`
}

// VolumeStore is a directory on an existing PersistentVolumeClaim.
type VolumeStore struct {
	// claimName of a PersistentVolumeClaim in the cluster's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClaimName string `json:"claimName"`
}

// S3Store is a bucket of an S3-compatible object store.
type S3Store struct {
	// endpoint URL, such as https://s3.eu-west-1.amazonaws.com or http://minio.minio:9000.
	// +kubebuilder:validation:Pattern=`^https?://[^/\s]+/?$`
	Endpoint string `json:"endpoint"`

	// bucket name; it must exist.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`

	// region of the bucket.
	// +kubebuilder:default=us-east-1
	// +optional
	Region string `json:"region,omitempty"`

	// credentials name the Secret that holds the access key.
	Credentials S3Credentials `json:"credentials"`

	// tls settings for an https endpoint.
	// +optional
	TLS *S3TLS `json:"tls,omitempty"`
}

// S3Credentials is a Secret in the cluster's namespace holding an access key pair. The
// instance pods mount it; it never appears in the chart's rendered manifest.
type S3Credentials struct {
	// secretName of the Secret.
	// +kubebuilder:validation:MinLength=1
	SecretName string `json:"secretName"`

	// accessKeyIDKey is the Secret's key holding the access key ID.
	// +kubebuilder:default=AWS_ACCESS_KEY_ID
	// +optional
	AccessKeyIDKey string `json:"accessKeyIDKey,omitempty"`

	// secretAccessKeyKey is the Secret's key holding the secret access key.
	// +kubebuilder:default=AWS_SECRET_ACCESS_KEY
	// +optional
	SecretAccessKeyKey string `json:"secretAccessKeyKey,omitempty"`
}

// S3TLS configures how an https endpoint is trusted.
type S3TLS struct {
	// caSecret names a Secret key holding PEM certificates to trust besides the
	// system's.
	// +optional
	CASecret *SecretKey `json:"caSecret,omitempty"`

	// insecureSkipVerify turns certificate verification off. For tests only.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// SecretKey is one key of a Secret in the cluster's namespace.
type SecretKey struct {
	// name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// key in the Secret.
	// +kubebuilder:default=ca.crt
	// +optional
	Key string `json:"key,omitempty"`
}

// FromBackup restores a new cluster from a base backup and the archived WAL after it.
// +kubebuilder:validation:XValidation:rule="has(self.backupName) != has(self.store)",message="fromBackup needs exactly one of backupName or store"
// +kubebuilder:validation:XValidation:rule="!has(self.store) || has(self.clusterName)",message="fromBackup.store needs clusterName: the name of the cluster whose backups are in the store"
// +kubebuilder:validation:XValidation:rule="!(has(self.targetTime) && has(self.targetLSN))",message="set at most one of targetTime and targetLSN"
type FromBackup struct {
	// backupName of a Completed PostgresBackup in this namespace.
	// +kubebuilder:validation:MinLength=1
	// +optional
	BackupName string `json:"backupName,omitempty"`

	// store to restore from when the PostgresBackup object is gone (another namespace
	// or Kubernetes cluster, or after the source cluster was deleted).
	// +optional
	Store *BackupStore `json:"store,omitempty"`

	// clusterName is the source cluster's name: its directory in store.
	// +kubebuilder:validation:MinLength=1
	// +optional
	ClusterName string `json:"clusterName,omitempty"`

	// backupID chooses one base backup in store. Without it, the newest one that ended
	// before the target (or the newest) is used.
	// +kubebuilder:validation:MinLength=1
	// +optional
	BackupID string `json:"backupID,omitempty"`

	// targetTime is the point in time to recover to (RFC 3339). Without a target, all
	// archived WAL is replayed.
	// +optional
	TargetTime *metav1.Time `json:"targetTime,omitempty"`

	// targetLSN is the WAL position to recover to, such as 0/3000060.
	// +kubebuilder:validation:Pattern=`^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$`
	// +optional
	TargetLSN string `json:"targetLSN,omitempty"`
}

// PostgresBackupSpec asks for one base backup of a cluster.
type PostgresBackupSpec struct {
	// cluster is the PostgresCluster to back up, in this namespace. It needs
	// spec.backup.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="cluster cannot change: create another PostgresBackup"
	Cluster LocalObjectReference `json:"cluster"`

	// method of the backup: basebackup (pg_basebackup, with the WAL that makes it
	// consistent on its own).
	// +kubebuilder:validation:Enum=basebackup
	// +kubebuilder:default=basebackup
	// +optional
	Method string `json:"method,omitempty"`

	// target overrides the cluster's spec.backup.target for this backup.
	// +kubebuilder:validation:Enum=prefer-replica;primary
	// +optional
	Target BackupTarget `json:"target,omitempty"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// name of the object.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// BackupPhase is where a backup is in its life.
type BackupPhase string

// The phases of a backup.
const (
	BackupPending   BackupPhase = "Pending"
	BackupRunning   BackupPhase = "Running"
	BackupCompleted BackupPhase = "Completed"
	BackupFailed    BackupPhase = "Failed"
)

// PostgresBackupStatus is what the controller observed of a backup.
type PostgresBackupStatus struct {
	// phase: Pending, Running, Completed or Failed.
	// +optional
	Phase BackupPhase `json:"phase,omitempty"`
	// instance is the pod the backup was taken from.
	// +optional
	Instance string `json:"instance,omitempty"`
	// backupID names the backup in the store.
	// +optional
	BackupID string `json:"backupID,omitempty"`
	// location of the backup in the store, for people.
	// +optional
	Location string `json:"location,omitempty"`
	// store the backup went to, as the cluster's spec.backup.store said then.
	// +optional
	Store *BackupStore `json:"store,omitempty"`
	// startedAt is when the backup started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// stoppedAt is when it completed or failed.
	// +optional
	StoppedAt *metav1.Time `json:"stoppedAt,omitempty"`
	// size of the stored backup, compressed.
	// +optional
	Size string `json:"size,omitempty"`
	// sizeBytes is size in bytes.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// beginLSN is where WAL replay starts when restoring it.
	// +optional
	BeginLSN string `json:"beginLSN,omitempty"`
	// endLSN is the earliest point the backup is consistent at.
	// +optional
	EndLSN string `json:"endLSN,omitempty"`
	// timeline of the backup.
	// +optional
	Timeline int64 `json:"timeline,omitempty"`
	// error says why the backup failed.
	// +optional
	Error string `json:"error,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pgb,categories=pgpilot
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.cluster.name`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Instance",type=string,JSONPath=`.status.instance`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Started",type=date,JSONPath=`.status.startedAt`
// +kubebuilder:printcolumn:name="Error",type=string,JSONPath=`.status.error`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// PostgresBackup is one physical base backup of a PostgresCluster.
type PostgresBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PostgresBackupSpec   `json:"spec"`
	Status PostgresBackupStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PostgresBackupList is a list of PostgresBackup.
type PostgresBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PostgresBackup `json:"items"`
}

func init() {
	SchemeBuilder.Register(&PostgresBackup{}, &PostgresBackupList{})
}
