// Package agentapi is the HTTP API of the in-pod agent: the types both sides share,
// the server the agent runs and the client the controller calls.
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
	return "https://" + net.JoinHostPort(host, strconv.Itoa(Port))
}

// Paths of the agent API.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathStatus  = "/status"
	PathPromote = "/promote"
	PathFence   = "/fence"
	PathDemote  = "/demote"
	PathFreeze  = "/freeze"
	PathRestart = "/restart"
	PathConfirm = "/confirm"
	PathMetrics = "/metrics"
)

// Roles an instance reports.
const (
	RolePrimary  = "primary"
	RoleReplica  = "replica"
	RoleFenced   = "fenced"   // a primary that refuses writes
	RoleStarting = "starting" // postgres is being initialised, cloned, rewound or started
	RoleStopped  = "stopped"  // postgres is not running
	// RoleUpgrading is a primary whose agent stopped postgres to run pg_upgrade on its
	// data; it keeps the primary Lease, and starts again on the old or the new major.
	RoleUpgrading = "upgrading"
)

// Status is what GET /status returns: the instance as its agent sees it now.
type Status struct {
	// Pod is the instance's pod name.
	Pod string `json:"pod"`
	// Upgrade is the last major version upgrade this agent ran or checked, while the
	// cluster's spec.version is newer than the data it started with; nil otherwise.
	Upgrade *Upgrade `json:"upgrade,omitempty"`
	// UpgradedFrom is the database the data was made from by pg_upgrade (its data
	// directory's record), nil for data never upgraded: a standby of the older major
	// with that system identifier may set its data aside and clone this one's.
	UpgradedFrom *UpgradedFrom `json:"upgradedFrom,omitempty"`
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
	// ConnectionLimit is how many sessions postgres admits of roles that are not
	// superusers: max_connections less superuser_reserved_connections and
	// reserved_connections.
	ConnectionLimit int `json:"connectionLimit,omitempty"`
	// OldestXIDAge is the largest age(datfrozenxid) of the databases, in transactions,
	// and OldestXIDDatabase the database it is of: PostgreSQL refuses new transaction
	// IDs before the age reaches 2^31 (wraparound), and VACUUM freezing is what lowers it.
	OldestXIDAge      int64  `json:"oldestXIDAge,omitempty"`
	OldestXIDDatabase string `json:"oldestXIDDatabase,omitempty"`
	// Slots are this instance's replication slots.
	Slots []SlotStatus `json:"slots,omitempty"`
	// Archiver is continuous WAL archiving; set on a primary.
	Archiver *ArchiverStatus `json:"archiver,omitempty"`
	// Fenced is whether the agent was told to stop accepting writes.
	Fenced bool `json:"fenced,omitempty"`
	// Term is the primary Lease's term the agent last saw.
	Term int32 `json:"term"`
	// Holder is the primary the Lease named when the agent last read it ("" when none,
	// or before the first read). With Term, what a deleted Lease is recreated from.
	Holder string `json:"holder,omitempty"`
	// Position is where this instance's WAL ends, for choosing a failover target: the
	// write position of a primary; the furthest of received and replayed on a standby;
	// the last checkpoint of a stopped data directory. Empty when unknown.
	Position string `json:"position,omitempty"`
	// CheckpointTimeline is the timeline of a primary's last checkpoint: a promoted
	// primary's equals Timeline once its first checkpoint after the promotion is done,
	// and pg_rewind can read the divergence from its control file.
	CheckpointTimeline int64 `json:"checkpointTimeline,omitempty"`
	// Frozen: a standby told to stop receiving WAL until the Lease names a primary again.
	Frozen bool `json:"frozen,omitempty"`
	// Gate is a primary's commit gate: GateAcking, GateWithholding, GateDraining or
	// GateDisconnected; empty on a standby.
	Gate string `json:"gate,omitempty"`
	// GateImpostorsTerminated counts the replication connections that took the commit
	// gate's name (application_name pgpilot_gate) and that this agent terminated since
	// it started: a client holding the replication certificate trying to acknowledge
	// commits in the gate's place (docs/security.md).
	GateImpostorsTerminated int64 `json:"gateImpostorsTerminated,omitempty"`
	// Confirmation is a primary's right to acknowledge commits (docs/failover.md).
	Confirmation *Confirmation `json:"confirmation,omitempty"`
	// FailsafeConfirmed is the last time this standby confirmed its primary to it while
	// that primary could not reach the API server.
	FailsafeConfirmed *FailsafeConfirmation `json:"failsafeConfirmed,omitempty"`
	// RenewalSeen is when this agent first saw the primary Lease's current renewal
	// time, on its own clock: set once it saw that time change, not for the first read
	// after it started. An operator that has not watched the Lease itself (a replica
	// that just took over or restarted) bounds the holder's last renewal by it
	// (docs/failover.md, "The operator's own availability").
	RenewalSeen *RenewalSeen `json:"renewalSeen,omitempty"`
	// RecentCrashes counts postmaster exits and failed starts in the last minute, in
	// the Lease's current term (Term): crashes in an earlier role do not count.
	RecentCrashes int `json:"recentCrashes,omitempty"`
	// FirstRecentCrashMillisAgo is how long ago the oldest of RecentCrashes happened:
	// how long a crash loop has lasted.
	FirstRecentCrashMillisAgo int64 `json:"firstRecentCrashMillisAgo,omitempty"`
	// DownForMillis is how long postgres has not been ready in a role; 0 when it is.
	DownForMillis int64 `json:"downForMillis,omitempty"`
	// PromotingForMillis is, on a primary not yet ready since it became primary in the
	// Lease's current term (Term), promoted or started as the primary, how long ago that
	// was; 0 otherwise. It confirms its Lease, starts its commit gate and lets clients in
	// before it is ready (docs/failover.md, "Failover", step 1).
	PromotingForMillis int64 `json:"promotingForMillis,omitempty"`
	// SystemIdentifier is the database system identifier of the instance's data
	// directory; empty when the volume holds no data. The operator reads it to tell a
	// new cluster from one whose record was lost (docs/failover.md, "The cluster's
	// record").
	SystemIdentifier string `json:"systemIdentifier,omitempty"`
	// Handover is this instance's last clean stop as primary: its final WAL position.
	Handover *Handover `json:"handover,omitempty"`
	// DemotionToken is, on a primary demoted to follow a replica cluster's source,
	// where it stopped: <system identifier>:<timeline>:<final LSN> (the source's
	// promotion waits for it); empty once it streams from the source.
	DemotionToken string `json:"demotionToken,omitempty"`
	// VolumeBytes and VolumeFreeBytes are the size and free space of the data
	// directory's volume; 0 when unknown.
	VolumeBytes     int64 `json:"volumeBytes,omitempty"`
	VolumeFreeBytes int64 `json:"volumeFreeBytes,omitempty"`
	// VolumeFullInSeconds is how long until the volume is full at the rate its free
	// space went down over the last 10 minutes; 0 when it is not filling (or for less
	// than a minute of samples).
	VolumeFullInSeconds int64 `json:"volumeFullInSeconds,omitempty"`
	// SetAside are the data directories the agent set aside on the volume instead of
	// deleting them, oldest first.
	SetAside []SetAside `json:"setAside,omitempty"`
	// Refusal says what the agent refuses to do because it would replace or mix this
	// instance's data with another database's, and what a person can do; empty when it
	// refuses nothing.
	Refusal string `json:"refusal,omitempty"`
	// ParametersHash identifies the settings of spec.postgresql.parameters this agent has
	// taken (clusterconfig.Config.ParametersHash): PendingRestart is measured against
	// them. Instances that report different ones have not all seen the same change yet
	// (the kubelet updates each pod's copy of the configuration on its own).
	ParametersHash string `json:"parametersHash,omitempty"`
	// PendingRestart are the settings postgresql.conf changes that the running
	// postmaster cannot take without a restart (pg_settings.pending_restart), by name;
	// empty when none wait.
	PendingRestart []PendingSetting `json:"pendingRestart,omitempty"`
	// ConfigRejected is what is wrong with the settings the agent wrote
	// (spec.postgresql.parameters): what postgres rejects, in its own words (the running
	// server keeps the previous value of each, of every setting for a name it does not
	// know, and would not start again), or a shared_buffers larger than the memory the
	// container has (postgres would be killed once its buffers fill); "" when nothing
	// is.
	ConfigRejected string `json:"configRejected,omitempty"`
	// LockedOut: this primary may not acknowledge commits now, so its clients are
	// locked out (no pg_hba.conf line, sessions terminated) until its Lease is
	// confirmed again (docs/failover.md, I1).
	LockedOut bool `json:"lockedOut,omitempty"`
	// DurabilityResets counts the synchronous_commit overrides of a database or role
	// (local or off) this agent reset since it started; LastDurabilityReset says what
	// the last one was. The operator makes an event of each.
	DurabilityResets    int    `json:"durabilityResets,omitempty"`
	LastDurabilityReset string `json:"lastDurabilityReset,omitempty"`
	// DurabilityOverridesKept are such overrides spec.postgresql.allowUnsafeDurability
	// keeps, as the primary last saw them.
	DurabilityOverridesKept []string `json:"durabilityOverridesKept,omitempty"`
	// Receiver is a standby's WAL receiver as the agent watches it; nil on a primary.
	Receiver *ReceiverStatus `json:"receiver,omitempty"`
	// Error says what went wrong last, for a person; empty when nothing did.
	Error string `json:"error,omitempty"`
}

// PendingSetting is a setting whose new value waits for a restart of postgres.
type PendingSetting struct {
	Name string `json:"name"`
	// Value is what the running postmaster has, as SHOW says it (with its unit).
	Value string `json:"value"`
	// Pending is the value in postgresql.conf, which the next start takes.
	Pending string `json:"pending"`
}

// SetAside is a data directory the agent replaced by a new clone and kept.
type SetAside struct {
	// Name is the directory's name beside the data directory on the volume.
	Name string `json:"name"`
	// Reason is why it was replaced.
	Reason string `json:"reason,omitempty"`
	// At is when it was set aside.
	At time.Time `json:"at"`
	// Superseded: the clone that replaced it has been verified; it is removed when the
	// volume needs the space. Until then it is kept whatever the space.
	Superseded bool `json:"superseded,omitempty"`
	// Bytes is its size.
	Bytes int64 `json:"bytes"`
}

// Gate states.
const (
	GateAcking       = "acking"
	GateWithholding  = "withholding"
	GateDraining     = "draining"
	GateDisconnected = "disconnected"
)

// Confirmation is a primary's right to acknowledge commits.
type Confirmation struct {
	// Valid: confirmed within the last T.
	Valid bool `json:"valid"`
	// Via is "api" (a Lease renewal) or "peers" (failsafe).
	Via string `json:"via,omitempty"`
	// RemainingMillis is how long the confirmation lasts without a new one.
	RemainingMillis int64 `json:"remainingMillis"`
}

// RenewalSeen is an agent's first sight of a renewal of the primary Lease.
type RenewalSeen struct {
	// RenewTime is the Lease's spec.renewTime as written: which renewal, not a time to
	// compare with any clock.
	RenewTime time.Time `json:"renewTime"`
	// AgoMillis is how long before this status was made the agent first saw it.
	AgoMillis int64 `json:"agoMillis"`
}

// FailsafeConfirmation is a standby's last confirmation of a primary.
type FailsafeConfirmation struct {
	Primary string `json:"primary"`
	Term    int32  `json:"term"`
	// AgoMillis is how long before this status was made.
	AgoMillis int64 `json:"agoMillis"`
}

// Handover is an instance's clean stop as primary.
type Handover struct {
	Term     int32  `json:"term"`
	Clean    bool   `json:"clean"`
	FinalLSN string `json:"finalLSN,omitempty"`
	Timeline int64  `json:"timeline,omitempty"`
}

// ConfirmRequest asks a standby whether it still follows Primary in Term.
type ConfirmRequest struct {
	Primary string `json:"primary"`
	Term    int32  `json:"term"`
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
	// Released is whether the slot holds no WAL: made without any, or released after
	// its instance was idle for longer than spec.postgresql.idleSlotTimeout, until its
	// instance streams again.
	Released bool `json:"released,omitempty"`
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
	// Demote is a handover: a primary stops acknowledging commits, stops cleanly so its
	// final WAL reaches the standbys, and releases the Lease with its final position.
	Demote(ctx context.Context) error
	// Freeze makes a standby stop receiving WAL until the Lease names a primary again.
	Freeze(ctx context.Context) error
	// Restart restarts postgres in place, so that it takes the settings that need a
	// restart: a streaming standby, or the primary of a single-instance cluster. A
	// primary with standbys, or a standby that is frozen or not running, is refused with
	// ErrConflict: a primary is restarted by a switchover.
	Restart(ctx context.Context) error
	// Confirm answers a primary that cannot reach the API server whether this standby
	// still follows it (failsafe); ErrConflict when it does not.
	Confirm(ctx context.Context, req ConfirmRequest) error
}

// Upgrade phases (Upgrade.Phase), in their order; Failed ends an upgrade that left the
// data on its old major.
const (
	UpgradeChecking  = "Checking"
	UpgradeUpgrading = "Upgrading"
	UpgradeAnalysing = "Analysing"
	UpgradeCompleted = "Completed"
	UpgradeFailed    = "Failed"
)

// Upgrade is a major version upgrade as the primary's agent runs it.
type Upgrade struct {
	// From and To are the major versions.
	From string `json:"from"`
	To   string `json:"to"`
	// Phase is one of the Upgrade* phases.
	Phase string `json:"phase"`
	// Message says what the phase is doing, or why the upgrade failed.
	Message string `json:"message,omitempty"`
	// Since is when the phase began.
	Since time.Time `json:"since"`
	// WritesStoppedMillis is how long the primary refused writes for the upgrade (from
	// its stop to the new major's first acknowledged commit), once known.
	WritesStoppedMillis int64 `json:"writesStoppedMillis,omitempty"`
}

// UpgradedFrom is the database a data directory was upgraded from.
type UpgradedFrom struct {
	SystemIdentifier string `json:"systemIdentifier"`
	Major            string `json:"major"`
}
