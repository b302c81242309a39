// Package clusterconfig is config.json, the contract between the operator, which renders
// it, and the agent, which reads it: internal/operator/plan computes it, the chart writes it into
// the cluster's ConfigMap (helm-charts/postgrescluster/templates/configmap.yaml), and the
// agent in every pod loads it at start and again whenever the kubelet updates the file.
//
// It holds only the types, their defaults and how a field is read; what the agent does
// with them stays in internal/instance/agent. The package imports nothing from the operator or
// the agent, so both can link it without linking each other.
package clusterconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

// Config is config.json.
type Config struct {
	ClusterName string            `json:"clusterName"`
	Version     string            `json:"version"`
	Replicas    int               `json:"replicas"`
	Parameters  map[string]string `json:"parameters"`
	// SynchronousReplicas is how many standbys must confirm each commit; 0 is async.
	SynchronousReplicas int `json:"synchronousReplicas"`
	// LossBudget is spec.postgresql.lossBudget in bytes in asynchronous mode with more
	// than one instance, nil otherwise: the commit gate confirms WAL at most this far
	// beyond the most advanced standby's flush position (internal/instance/agent/lossbudget.go).
	LossBudget *int64 `json:"lossBudget,omitempty"`
	// IdleSlotTimeout is spec.postgresql.idleSlotTimeout, a Go duration: how long the
	// primary keeps WAL for an instance that does not stream. Read with SlotTimeout.
	IdleSlotTimeout string    `json:"idleSlotTimeout,omitempty"`
	Bootstrap       Bootstrap `json:"bootstrap"`
	// SuperuserNetworkAccess lets the superuser log in over the network (TLS and
	// password); otherwise only over the local socket.
	SuperuserNetworkAccess bool `json:"superuserNetworkAccess,omitempty"`
	// AllowUnsafeDurability is spec.postgresql.allowUnsafeDurability: the primary keeps
	// a database's or role's synchronous_commit = local or off instead of resetting it
	// (internal/instance/agent/durability.go).
	AllowUnsafeDurability bool   `json:"allowUnsafeDurability,omitempty"`
	PrimaryLease          string `json:"primaryLease"`
	Services              struct {
		ReadWrite string `json:"readWrite"`
		Headless  string `json:"headless"`
	} `json:"services"`
	// Backup is set when spec.backup is: WAL is archived to Backup.Store and base
	// backups go there.
	Backup *Backup `json:"backup,omitempty"`
	// Restore is set when spec.bootstrap.fromBackup is: the first primary restores
	// instead of running initdb.
	Restore *Restore `json:"restore,omitempty"`
	// CustomQueries is the path of the custom queries' file the pod mounts
	// (spec.monitoring.customQueries); empty without one.
	CustomQueries string `json:"customQueries,omitempty"`
	// MaxReadLag is spec.postgresql.maxReadLag, a Go duration: how far behind the
	// primary a standby may replay and still serve reads. Read with ReadLagBound.
	MaxReadLag string `json:"maxReadLag,omitempty"`
	// Upgrade is spec.upgrade: what a major version upgrade needs before it begins.
	Upgrade Upgrade `json:"upgrade"`
	// Resources are the postgres container's, for the settings tuned from them
	// (package tuning).
	Resources tuning.Resources `json:"resources,omitempty"`
	// Pooler is set when spec.pooler is: the primary's agent keeps the pooler's lookup
	// role and function (package poolerauth), and the pooler agents read their
	// PgBouncer settings here.
	Pooler *Pooler `json:"pooler,omitempty"`
	// Replica is set when spec.replica is: the Lease's holder follows the source
	// instead of running a primary while Replica.Enabled.
	Replica *Replica `json:"replica,omitempty"`
}

// Replica is spec.replica: the source a replica cluster follows. Its TLS files are
// mounted under the pod's TLS directory, in source/.
type Replica struct {
	Enabled bool   `json:"enabled"`
	Host    string `json:"host"`
	Port    int    `json:"port"`
	// PromotionToken is spec.replica.promotionToken: a promotion waits until the
	// position it names is replayed.
	PromotionToken string `json:"promotionToken,omitempty"`
}

// Following is the host of the source this cluster follows now; "" when it is not a
// replica cluster, or no longer (promoted).
func (c Config) Following() string {
	if c.Replica == nil || !c.Replica.Enabled {
		return ""
	}
	return c.Replica.Host
}

// Upgrade is spec.upgrade.
type Upgrade struct {
	// BackupMaxAge is how old the newest base backup may be, a Go duration.
	BackupMaxAge string `json:"backupMaxAge,omitempty"`
	// WithoutBackup lets an upgrade begin with no recent base backup.
	WithoutBackup bool `json:"withoutBackup,omitempty"`
}

// DefaultUpgradeBackupMaxAge is spec.upgrade.backupMaxAge's default.
const DefaultUpgradeBackupMaxAge = 24 * time.Hour

// BackupAgeBound is Upgrade.BackupMaxAge, DefaultUpgradeBackupMaxAge when unset or
// unreadable.
func (u Upgrade) BackupAgeBound() time.Duration {
	if d, err := time.ParseDuration(u.BackupMaxAge); err == nil && d > 0 {
		return d
	}
	return DefaultUpgradeBackupMaxAge
}

// DefaultIdleSlotTimeout is spec.postgresql.idleSlotTimeout's default.
const DefaultIdleSlotTimeout = 30 * time.Minute

// SlotTimeout is IdleSlotTimeout; the default when it is unset or not a duration (the
// CRD validates it, so only a hand-made config can be wrong), 0 for none.
func (c Config) SlotTimeout() time.Duration {
	d, err := time.ParseDuration(c.IdleSlotTimeout)
	if err != nil || d < 0 {
		return DefaultIdleSlotTimeout
	}
	return d
}

// DefaultMaxReadLag is spec.postgresql.maxReadLag's default.
const DefaultMaxReadLag = 30 * time.Second

// ReadLagBound is MaxReadLag; the default when it is unset, not a duration or not
// positive (the CRD validates it, so only a hand-made config can be wrong).
func (c Config) ReadLagBound() time.Duration {
	d, err := time.ParseDuration(c.MaxReadLag)
	if err != nil || d <= 0 {
		return DefaultMaxReadLag
	}
	return d
}

// Backup is where this cluster's backups and archived WAL go.
type Backup struct {
	Store Store `json:"store"`
	// Compression of new base backups: zstd (also when empty), s2 or none.
	Compression string `json:"compression,omitempty"`
}

// Restore is the backup a new cluster starts from.
type Restore struct {
	// Store holds the source cluster's backups (its Prefix ends in the source's name).
	Store Store `json:"store"`
	// BackupID picks a base backup; empty picks the newest that suits the target.
	BackupID string `json:"backupID,omitempty"`
	// TargetTime (RFC 3339) or TargetLSN stop recovery; neither replays all WAL.
	TargetTime string `json:"targetTime,omitempty"`
	TargetLSN  string `json:"targetLSN,omitempty"`
}

// Store locates a backup store inside the pod: exactly one of S3 or Directory (a
// mounted volume). Secrets are files under CredentialsDir, never in config.json.
type Store struct {
	S3        *S3Store `json:"s3,omitempty"`
	Directory string   `json:"directory,omitempty"`
	// Prefix is <spec path>/<cluster name>.
	Prefix string `json:"prefix"`
}

// S3Store is an S3 bucket; the access key pair is in CredentialsDir/ACCESS_KEY_ID and
// CredentialsDir/SECRET_ACCESS_KEY (the mounted Secret's keys, renamed).
type S3Store struct {
	Endpoint           string `json:"endpoint"`
	Bucket             string `json:"bucket"`
	Region             string `json:"region,omitempty"`
	CredentialsDir     string `json:"credentialsDir"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
	CAFile             string `json:"caFile,omitempty"`
}

// Bootstrap is what initdb creates besides the superuser.
type Bootstrap struct {
	Database string `json:"database"`
	Owner    string `json:"owner"`
}

// ParametersHash identifies Parameters (the settings the agent writes into
// postgresql.conf): instances that report the same have taken the same settings.
func (c Config) ParametersHash() string {
	b, _ := json.Marshal(c.Parameters) // a map's keys are marshalled sorted
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Load reads and checks config.json.
func Load(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading the cluster configuration: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("the cluster configuration %s is not valid JSON: %w", path, err)
	}
	var missing []string
	for name, v := range map[string]string{"clusterName": c.ClusterName, "primaryLease": c.PrimaryLease,
		"bootstrap.database": c.Bootstrap.Database, "bootstrap.owner": c.Bootstrap.Owner} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if c.Replicas < 1 {
		missing = append(missing, "replicas")
	}
	if len(missing) > 0 {
		return c, fmt.Errorf("the cluster configuration %s lacks %s", path, strings.Join(missing, ", "))
	}
	return c, nil
}
