// Package agentapi is the HTTP API of the in-pod agent: the types both sides share,
// the server the agent runs and the client the sidecar calls.
package agentapi

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"
)

// Port is the agent's HTTP port on the pod IP.
const Port = 8008

// ErrConflict is what an Instance wraps when an action is not possible in the instance's
// current state (for example promoting while postgres is still being cloned). The server
// answers it with 409 Conflict, and the Client's error for a 409 matches it with errors.Is.
var ErrConflict = errors.New("not possible in the instance's current state")

// BaseURL is the address of the agent API of the instance whose pod IP (or host name) is
// host, for NewClient.
func BaseURL(host string) string {
	return "http://" + net.JoinHostPort(host, strconv.Itoa(Port))
}

// Paths of the agent API.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathStatus  = "/status"
	PathPromote = "/promote"
	PathFence   = "/fence"
	PathDemote  = "/demote"
	PathMetrics = "/metrics"
)

// Roles an instance reports.
const (
	RolePrimary  = "primary"
	RoleReplica  = "replica"
	RoleFenced   = "fenced"   // a primary that refuses writes
	RoleStarting = "starting" // postgres is being initialised, cloned, rewound or started
	RoleStopped  = "stopped"  // postgres is not running
)

// Status is what GET /status returns: the instance as its agent sees it now.
type Status struct {
	// Pod is the instance's pod name.
	Pod string `json:"pod"`
	// Role is one of the Role* constants.
	Role string `json:"role"`
	// Running is whether the postmaster is up.
	Running bool `json:"running"`
	// Ready is whether postgres accepts connections in its role.
	Ready bool `json:"ready"`
	// Timeline is the current timeline ID (0 when unknown).
	Timeline int64 `json:"timeline"`
	// WriteLSN is the primary's current WAL write position; empty on a replica.
	WriteLSN string `json:"writeLSN,omitempty"`
	// ReceivedLSN is the last WAL position a replica received and flushed to disk.
	ReceivedLSN string `json:"receivedLSN,omitempty"`
	// ReplayedLSN is the last WAL position a replica replayed.
	ReplayedLSN string `json:"replayedLSN,omitempty"`
	// LagBytes is how far a replica's replay is behind what it received; 0 on a primary.
	LagBytes int64 `json:"lagBytes"`
	// Replicas are the standbys streaming from this primary (pg_stat_replication).
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
	// PostgresVersion is server_version_num, e.g. 150010.
	PostgresVersion int `json:"postgresVersion,omitempty"`
	// StartedAt is when the postmaster last started.
	StartedAt *time.Time `json:"startedAt,omitempty"`
	// Connections counts client backends (pg_stat_activity).
	Connections int `json:"connections"`
	// Slots are this instance's replication slots.
	Slots []SlotStatus `json:"slots,omitempty"`
	// Archiver is continuous WAL archiving; set on a primary.
	Archiver *ArchiverStatus `json:"archiver,omitempty"`
	// Fenced is whether the agent was told to stop accepting writes.
	Fenced bool `json:"fenced,omitempty"`
	// Error says what went wrong last, for a person; empty when nothing did.
	Error string `json:"error,omitempty"`
}

// ReplicaStatus is one standby as its primary sees it.
type ReplicaStatus struct {
	// Name is the standby's application_name: its pod name.
	Name string `json:"name"`
	// State is pg_stat_replication.state (streaming, catchup, ...).
	State string `json:"state"`
	// SyncState is async, potential, sync or quorum.
	SyncState string `json:"syncState"`
	SentLSN   string `json:"sentLSN,omitempty"`
	FlushLSN  string `json:"flushLSN,omitempty"`
	ReplayLSN string `json:"replayLSN,omitempty"`
	// LagBytes is how far the standby's flush position is behind the primary's write position.
	LagBytes int64 `json:"lagBytes"`
}

// SlotStatus is one replication slot.
type SlotStatus struct {
	Name   string `json:"name"`
	Active bool   `json:"active"`
	// RetainedBytes is the WAL kept for the slot: from its restart position to the
	// current write (or replay) position.
	RetainedBytes int64 `json:"retainedBytes"`
}

// Instance is what the server needs from the agent. Every method is safe to call
// concurrently and returns promptly (within ctx).
type Instance interface {
	// Status reports the instance; it never fails, errors go into Status.Error.
	Status(ctx context.Context) Status
	// Ready returns nil when postgres accepts connections in its role.
	Ready(ctx context.Context) error
	// Promote makes a replica primary. Promoting a primary is a no-op.
	Promote(ctx context.Context) error
	// Fence makes a primary stop accepting writes (and keeps it so until unfenced by a
	// restart as replica). Fencing a replica is a no-op.
	Fence(ctx context.Context) error
	// Demote stops a primary cleanly after its writes are drained, for a switchover;
	// it restarts as a replica of whichever instance the Lease names next.
	Demote(ctx context.Context) error
}
