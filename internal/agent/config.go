// Package agent supervises one PostgreSQL instance in its pod: it prepares the data
// directory for the role the primary Lease gives it (initdb, clone, rewind), writes the
// configuration, runs postgres as a child, and promotes, fences or demotes it.
package agent

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config is how one agent is set up: from the pod's environment and flags.
type Config struct {
	// PodName is this instance's pod name; also its application_name and slot owner.
	PodName string
	// Namespace of the pod and the Lease.
	Namespace string
	// PGData is the data directory.
	PGData string
	// BinDir holds initdb, postgres, pg_ctl, pg_basebackup, pg_rewind, pg_controldata.
	BinDir string
	// ListenAddress is postgres's listen_addresses.
	ListenAddress string
	// Port of postgres.
	Port int
	// SocketDir is the unix socket directory; it also holds the agent's pgpass file.
	SocketDir string
	// ClusterConfigPath is the chart's config.json.
	ClusterConfigPath string
	// SecretsDir holds superuser/, replication/ and app/, each with username and password.
	SecretsDir string
	// PeerHost maps an instance's pod name to the host its postgres answers on.
	PeerHost func(pod string) string
	// PeerName maps an instance's pod name to the name its certificate is verified
	// against: <pod>.<headless Service>.<namespace>.svc.
	PeerName func(pod string) string
	// TLS are the instance's certificates.
	TLS TLSFiles
	// ShutdownTimeout bounds a stop: fast first, then immediate.
	ShutdownTimeout time.Duration
	// AgentBinary is this program, run by postgres as archive_command and
	// restore_command.
	AgentBinary string
	// AgentPort is the other instances' agent API port.
	AgentPort int
	// Credentials authenticate calls to this agent's API, and hold the token this
	// agent calls its peers with (failsafe).
	Credentials *APICredentials
	// CustomQueriesPath is the user's custom queries file (spec.monitoring.customQueries,
	// docs/monitoring.md); "" when none is configured.
	CustomQueriesPath string
}

// PeerURL is the base URL of another instance's agent API.
func (c Config) PeerURL(pod string) string {
	return "https://" + net.JoinHostPort(c.PeerHost(pod), strconv.Itoa(c.AgentPort))
}

// ClusterConfig is config.json, made by internal/plan and rendered by the chart (helm-charts/postgrescluster/templates/configmap.yaml).
type ClusterConfig struct {
	ClusterName string            `json:"clusterName"`
	Version     string            `json:"version"`
	Replicas    int               `json:"replicas"`
	Parameters  map[string]string `json:"parameters"`
	// SynchronousReplicas is how many standbys must confirm each commit; 0 is async.
	SynchronousReplicas int `json:"synchronousReplicas"`
	// LossBudget is spec.postgresql.lossBudget in bytes in asynchronous mode with more
	// than one instance, nil otherwise: the commit gate confirms WAL at most this far
	// beyond the most advanced standby's flush position (lossbudget.go).
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
	// (durability.go).
	AllowUnsafeDurability bool   `json:"allowUnsafeDurability,omitempty"`
	PrimaryLease          string `json:"primaryLease"`
	Services              struct {
		ReadWrite string `json:"readWrite"`
		Headless  string `json:"headless"`
	} `json:"services"`
	// Backup is set when spec.backup is: WAL is archived to Backup.Store and base
	// backups go there.
	Backup *BackupConfig `json:"backup,omitempty"`
	// Restore is set when spec.bootstrap.fromBackup is: the first primary restores
	// instead of running initdb.
	Restore *RestoreConfig `json:"restore,omitempty"`
	// CustomQueries is the path of the custom queries' file the pod mounts
	// (spec.monitoring.customQueries); empty without one.
	CustomQueries string `json:"customQueries,omitempty"`
	// MaxReadLag is spec.postgresql.maxReadLag, a Go duration: how far behind the
	// primary a standby may replay and still serve reads. Read with ReadLagBound.
	MaxReadLag string `json:"maxReadLag,omitempty"`
}

// DefaultIdleSlotTimeout is spec.postgresql.idleSlotTimeout's default.
const DefaultIdleSlotTimeout = 30 * time.Minute

// SlotTimeout is IdleSlotTimeout; the default when it is unset or not a duration (the
// CRD validates it, so only a hand-made config can be wrong), 0 for none.
func (c ClusterConfig) SlotTimeout() time.Duration {
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
func (c ClusterConfig) ReadLagBound() time.Duration {
	d, err := time.ParseDuration(c.MaxReadLag)
	if err != nil || d <= 0 {
		return DefaultMaxReadLag
	}
	return d
}

// BackupConfig is where this cluster's backups and archived WAL go.
type BackupConfig struct {
	Store StoreConfig `json:"store"`
}

// RestoreConfig is the backup a new cluster starts from.
type RestoreConfig struct {
	// Store holds the source cluster's backups (its Prefix ends in the source's name).
	Store StoreConfig `json:"store"`
	// BackupID picks a base backup; empty picks the newest that suits the target.
	BackupID string `json:"backupID,omitempty"`
	// TargetTime (RFC 3339) or TargetLSN stop recovery; neither replays all WAL.
	TargetTime string `json:"targetTime,omitempty"`
	TargetLSN  string `json:"targetLSN,omitempty"`
}

// StoreConfig locates a backup store inside the pod: exactly one of S3 or Directory
// (a mounted volume). Secrets are files under CredentialsDir, never in config.json.
type StoreConfig struct {
	S3        *S3StoreConfig `json:"s3,omitempty"`
	Directory string         `json:"directory,omitempty"`
	// Prefix is <spec path>/<cluster name>.
	Prefix string `json:"prefix"`
}

// S3StoreConfig is an S3 bucket; the access key pair is in CredentialsDir/ACCESS_KEY_ID
// and CredentialsDir/SECRET_ACCESS_KEY (the mounted Secret's keys, renamed).
type S3StoreConfig struct {
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

// LoadClusterConfig reads and checks config.json.
func LoadClusterConfig(path string) (ClusterConfig, error) {
	var c ClusterConfig
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

// Credential is a role's name and password, read from a mounted Secret.
type Credential struct {
	Username string
	Password string
}

// Credentials are the three roles the agent manages.
type Credentials struct {
	Superuser, Replication, App Credential
}

// LoadCredentials reads dir/{superuser,replication,app}/{username,password}.
func LoadCredentials(dir string) (Credentials, error) {
	read := func(name string) (Credential, error) {
		var c Credential
		for key, dst := range map[string]*string{"username": &c.Username, "password": &c.Password} {
			b, err := os.ReadFile(filepath.Join(dir, name, key))
			if err != nil {
				return c, fmt.Errorf("reading the %s credentials: %w (is the Secret mounted?)", name, err)
			}
			*dst = strings.TrimRight(string(b), "\r\n")
			if *dst == "" {
				return c, fmt.Errorf("the %s credentials have an empty %s", name, key)
			}
		}
		return c, nil
	}
	var cs Credentials
	var err error
	if cs.Superuser, err = read("superuser"); err != nil {
		return cs, err
	}
	if cs.Replication, err = read("replication"); err != nil {
		return cs, err
	}
	cs.App, err = read("app")
	return cs, err
}
