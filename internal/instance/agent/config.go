// Package agent supervises one PostgreSQL instance in its pod: it prepares the data
// directory for the role the primary Lease gives it (initdb, clone, rewind), writes the
// configuration, runs postgres as a child, and promotes, fences or demotes it.
package agent

import (
	"net"
	"strconv"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
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
	// CarriedDir holds the programs of an older major an init container carried into
	// the pod for an upgrade (package carry); absent otherwise.
	CarriedDir string
	// ListenAddress is postgres's listen_addresses.
	ListenAddress string
	// Port of postgres.
	Port int
	// SocketDir is the unix socket directory; it also holds the agent's pgpass file.
	SocketDir string
	// ClusterConfigPath is the chart's config.json (internal/protocol/clusterconfig).
	ClusterConfigPath string
	// SecretsDir holds superuser/, replication/ and app/, each with username and password.
	SecretsDir string
	// PoolerAddresses, when set, are the pooler agents' addresses (host:port) a
	// handover asks to pause, instead of those behind the pooler's headless Service
	// (tests).
	PoolerAddresses []string
	// PeerHost maps an instance's pod name to the host its postgres answers on.
	PeerHost func(pod string) string
	// PeerName maps an instance's pod name to the name its certificate is verified
	// against: <pod>.<headless Service>.<namespace>.svc.
	PeerName func(pod string) string
	// TLS are the instance's certificates.
	TLS pgconf.TLSFiles
	// ShutdownTimeout bounds a stop: fast first, then immediate.
	ShutdownTimeout time.Duration
	// AgentBinary is this program, run by postgres as archive_command and
	// restore_command.
	AgentBinary string
	// AgentPort is the other instances' agent API port.
	AgentPort int
	// pgconf.Credentials authenticate calls to this agent's API, and hold the token this
	// agent calls its peers with (failsafe).
	Credentials *agentapi.MountedCredentials
	// CustomQueriesPath is the user's custom queries file (spec.monitoring.customQueries,
	// docs/monitoring.md); "" when none is configured.
	CustomQueriesPath string
}

// PeerURL is the base URL of another instance's agent API.
func (c Config) PeerURL(pod string) string {
	return "https://" + net.JoinHostPort(c.PeerHost(pod), strconv.Itoa(c.AgentPort))
}
