package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition is metav1.Condition with reason and message optional: the Helm manager
// (helm-operator-plugins) writes conditions into the same list without a reason.
type Condition struct {
	// type of the condition, CamelCase.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type string `json:"type"`
	// status is True, False or Unknown.
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status metav1.ConditionStatus `json:"status"`
	// observedGeneration is the generation the condition was set for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// lastTransitionTime is when status last changed.
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	// reason is a CamelCase word for why.
	// +optional
	Reason string `json:"reason,omitempty"`
	// message says why, for a person.
	// +optional
	Message string `json:"message,omitempty"`
}

// Condition types the controller owns.
const (
	// ConditionReady is True when the primary and every replica are ready.
	ConditionReady = "Ready"
	// ConditionCredentialsReady is True when the credentials Secrets exist and are usable.
	ConditionCredentialsReady = "CredentialsReady"
	// ConditionFailoverReady is False while the primary has failed and no replica can
	// safely take over, with the reason.
	ConditionFailoverReady = "FailoverReady"
	// ConditionBootstrapped turns True the first time every instance is ready and stays
	// True: it tells a cluster still being created from one that lost instances.
	ConditionBootstrapped = "Bootstrapped"
	// ConditionContinuousArchiving is True while the primary archives WAL to the
	// backup store, False with the archiver's last error when it cannot.
	ConditionContinuousArchiving = "ContinuousArchiving"
	// ConditionDataConsistent is False while an instance refuses to rewind onto, clone
	// from or follow a primary that holds another database (its data is kept), with
	// what to do.
	ConditionDataConsistent = "DataConsistent"
	// ConditionStorageResized is True when every instance's volume requests and has the
	// size the cluster wants (spec.storage.size, or more once grown automatically).
	ConditionStorageResized = "StorageResized"
	// ConditionRolesReconciled is True when every item of spec.roles and
	// spec.databases matches PostgreSQL, False with the failed ones (status.roles,
	// status.databases).
	ConditionRolesReconciled = "RolesReconciled"
	// ConditionPendingRestart is True while a setting of spec.postgresql.parameters (or
	// one pgpilot manages) waits for postgres to restart on some instance, with the
	// settings, the instances and the step under way or what blocks it.
	ConditionPendingRestart = "PendingRestart"
	// ConditionParametersApplied is True while PostgreSQL accepts every setting it is
	// given, False naming each it rejects in its own words (the running server keeps
	// the previous values; an instance that restarts would not start, so the restart
	// controller restarts none); absent until the restart controller first looked.
	ConditionParametersApplied = "ParametersApplied"
	// ConditionMonitoringReady is True when spec.monitoring.enabled can be served (the
	// Prometheus Operator's PodMonitor and PrometheusRule kinds exist), False with what
	// is missing; absent while monitoring is not enabled.
	ConditionMonitoringReady = "MonitoringReady"

	// ConditionReplicasStreaming is True while every replica streams from the primary
	// within spec.postgresql.maxReadLag, False naming each that does not (since when,
	// its WAL receiver's state, or its lag); the cluster is Degraded meanwhile.
	ConditionReplicasStreaming = "ReplicasStreaming"

	// ConditionHibernated is True while spec.stopped has stopped every instance, False
	// while they stop or resume (reason Stopping, Resuming, Resumed); absent on a
	// cluster never stopped.
	ConditionHibernated = "Hibernated"
	// ConditionMajorUpgrade is where a major version upgrade stands (docs/operations.md,
	// "Major version upgrades"): False while it runs (reason: its phase) or after it
	// failed (UpgradeFailed, the data still on its old major), True once every instance
	// runs the new major. Absent for a cluster never upgraded.
	ConditionMajorUpgrade = "MajorUpgrade"
	// ConditionConnectionsAvailable is False while the primary's client sessions take
	// 90% of what it admits (until under 80%); ConditionTransactionIDsSafe False while a
	// database's oldest unfrozen transaction ID is 500 million old (until under 450);
	// ConditionVolumeSpace False while an instance's volume is 90% used or fills within
	// a day (until under 85% and not). Each says what to do. Set once the cluster was
	// first healthy.
	ConditionConnectionsAvailable = "ConnectionsAvailable"
	ConditionTransactionIDsSafe   = "TransactionIDsSafe"
	ConditionVolumeSpace          = "VolumeSpace"
)

// Condition types the Helm manager owns.
const (
	ConditionInitialized    = "Initialized"
	ConditionDeployed       = "Deployed"
	ConditionReleaseFailed  = "ReleaseFailed"
	ConditionIrreconcilable = "Irreconcilable"
)

// Reasons of the controller's conditions and events.
const (
	ReasonCreating          = "Creating"
	ReasonFirstHealthy      = "FirstHealthy"
	ReasonAllInstancesReady = "AllInstancesReady"
	ReasonInstancesNotReady = "InstancesNotReady"
	ReasonPrimaryNotReady   = "PrimaryNotReady"
	ReasonNoPrimary         = "NoPrimary"
	ReasonReleaseFailed     = "ReleaseFailed"
	// ReasonSpecRefused: the operator refuses the spec before rendering anything
	// (parameters, resources, version), with what to change.
	ReasonSpecRefused        = "SpecRefused"
	ReasonCredentialsCreated = "CredentialsCreated"
	ReasonCredentialsAdopted = "CredentialsAdopted"
	ReasonCredentialsInvalid = "CredentialsInvalid"
	ReasonCertificateIssued  = "CertificateIssued"
	ReasonCertificateInvalid = "CertificateInvalid"
	ReasonPrimaryDesignated  = "PrimaryDesignated"
	ReasonFailoverPossible   = "FailoverPossible"
	ReasonFailoverBlocked    = "FailoverBlocked"
	ReasonArchiving          = "WALArchived"
	ReasonArchiveFailing     = "WALArchiveFailing"
	ReasonBackupStarted      = "BackupStarted"
	ReasonBackupCompleted    = "BackupCompleted"
	ReasonBackupFailed       = "BackupFailed"
	ReasonBackupScheduled    = "BackupScheduled"
	ReasonBackupPruned       = "BackupPruned"
	ReasonOneDatabase        = "OneDatabase"
	ReasonAnotherDatabase    = "AnotherDatabase"
	// ReasonImageUnavailable: the Ready condition's reason while an instance pod cannot
	// start a container because its image cannot be pulled or is not a valid name.
	ReasonImageUnavailable = "ImageUnavailable"
	// ReasonInstanceNotRunning: the Ready condition's reason, and a Warning event's,
	// while an instance is not running and its pod, the kubelet, the StatefulSet or its
	// agent says why (status.instances[].message); ReasonInstanceRunning, a Normal
	// event, once it runs again.
	ReasonInstanceNotRunning = "InstanceNotRunning"
	ReasonInstanceRunning    = "InstanceRunning"
	// ConditionConnectionsAvailable, ConditionTransactionIDsSafe and
	// ConditionVolumeSpace, and their events: what threatens the cluster before
	// anything fails (the failover controller's health report). A Warning event with
	// the problem's reason when it begins, a Normal one with the other when it ends.
	ReasonConnectionsAvailable = "ConnectionsAvailable"
	ReasonConnectionsSaturated = "ConnectionsSaturated"
	ReasonTransactionIDsFrozen = "TransactionIDsFrozen"
	ReasonWraparoundRisk       = "WraparoundRisk"
	ReasonVolumeSpaceAvailable = "VolumeSpaceAvailable"
	ReasonVolumeFillingUp      = "VolumeFillingUp"
	// ConditionReplicasStreaming, the Degraded phase and events: every replica streams
	// (ReasonAllStreaming), one does not stream or lags beyond maxReadLag
	// (ReasonReplicaNotStreaming, a Warning event), it streams again
	// (ReasonReplicaStreaming, a Normal event).
	ReasonAllStreaming        = "AllStreaming"
	ReasonReplicaNotStreaming = "ReplicaNotStreaming"
	// ReasonReplicaClusterStreaming (Normal event): a replica cluster's designated
	// primary streams from its source; ReasonReplicaClusterNotStreaming (Warning) when
	// it stops; ReasonReplicaClusterPromoted (Normal) once spec.replica.enabled false
	// made it a primary.
	ReasonReplicaClusterStreaming    = "ReplicaClusterStreaming"
	ReasonReplicaClusterNotStreaming = "ReplicaClusterNotStreaming"
	ReasonReplicaClusterPromoted     = "ReplicaClusterPromoted"
	// ReasonReplicaClusterDemoted (Normal event): its primary stopped cleanly to follow
	// the source; the event gives the demotion token.
	ReasonReplicaClusterDemoted = "ReplicaClusterDemoted"
	ReasonReplicaStreaming      = "ReplicaStreaming"
	// Roles and databases (ConditionRolesReconciled and events).
	ReasonRolesReconciled  = "Reconciled"
	ReasonRoleFailed       = "RoleFailed"
	ReasonDatabaseFailed   = "DatabaseFailed"
	ReasonRolesUnreachable = "PrimaryUnreachable"

	// Events of the failover controller (docs/failover.md).
	ReasonPrimaryFailed     = "PrimaryFailed"
	ReasonFailoverStarted   = "FailoverStarted"
	ReasonFailoverCompleted = "FailoverCompleted"
	ReasonHandedBack        = "HandedBack"
	ReasonUnfenced          = "Unfenced"
	ReasonSwitchoverRefused = "SwitchoverRefused"
	ReasonSwitchedOver      = "SwitchedOver"
	ReasonSwitchoverAborted = "SwitchoverAborted"
	ReasonFenced            = "Fenced"
	// ReasonPrimaryLeaseRecreated: the primary Lease was deleted and rebuilt from the
	// agents' views (docs/failover.md, "The cluster's record").
	ReasonPrimaryLeaseRecreated = "PrimaryLeaseRecreated"
	// ReasonDurabilityOverrideReset: the primary reset a database's or role's
	// synchronous_commit = local or off, whose commits would skip the commit gate, and
	// terminated the sessions that may have started with it. ReasonDurabilityOverrideKept:
	// spec.postgresql.allowUnsafeDurability keeps such a setting.
	ReasonDurabilityOverrideReset = "DurabilityOverrideReset"
	ReasonDurabilityOverrideKept  = "DurabilityOverrideKept"
	// ReasonDataRefused: an agent refuses to replace its data with another database's.
	ReasonDataRefused = "DataRefused"
	// ReasonDataSetAside: an agent replaced a data directory by a new clone and kept
	// the old one on the volume; ReasonSetAsideRemoved: it removed one that a verified
	// clone superseded, because the volume needed the space.
	ReasonDataSetAside    = "DataSetAside"
	ReasonSetAsideRemoved = "SetAsideRemoved"
	// ReasonRestartingInstance: a rolling update restarts an instance's pod, or the
	// restart controller its postgres.
	ReasonRestartingInstance = "RestartingInstance"
	// ReasonSwitchingOverForUpdate: a rolling update restarts the primary, whose agent
	// hands the role over to the most advanced standby as it stops.
	ReasonSwitchingOverForUpdate = "SwitchingOverForUpdate"
	// ReasonRolloutPaused and ReasonRolloutQueued: a rolling update waits, for
	// AnnotationRolloutPaused or for the limit on clusters rolling at once.
	ReasonRolloutPaused = "RolloutPaused"
	ReasonRolloutQueued = "RolloutQueued"
	// ReasonSwitchingOverForScaleDown: a scale-down would remove the primary's pod, so
	// the primary moves to an instance that stays first; ReasonScaleDownWaiting: no
	// instance that stays can take over yet, and the scale-down waits.
	ReasonSwitchingOverForScaleDown = "SwitchingOverForScaleDown"
	ReasonScaleDownWaiting          = "ScaleDownWaiting"

	// The storage controller's events and the StorageResized condition's reasons.
	ReasonVolumeExpanding        = "VolumeExpanding"
	ReasonVolumeExpansionRefused = "VolumeExpansionRefused"
	ReasonVolumeAutoGrown        = "VolumeAutoGrown"
	ReasonVolumeAtMaxSize        = "VolumeAtMaxSize"
	ReasonVolumesAtSize          = "VolumesAtSize"

	// Reasons of the PendingRestart condition and the restart controller's events
	// (docs/operations.md, "Changing settings"). ReasonRestartingInstance above names
	// each instance restarted.
	ReasonRestartPending  = "RestartPending"
	ReasonRestartBlocked  = "RestartBlocked"
	ReasonNoRestartNeeded = "NoRestartPending"
	// ReasonSwitchingOverForRestart: the primary's role moves to a restarted standby so
	// that it restarts as a standby.
	ReasonSwitchingOverForRestart = "SwitchingOverForRestart"
	// ReasonPendingRestartApplied: every instance runs with the settings.
	ReasonPendingRestartApplied = "PendingRestartApplied"
	// The ParametersApplied condition's reasons, and the events of a change.
	ReasonParametersApplied  = "ParametersApplied"
	ReasonParametersRejected = "ParametersRejected"

	// Reasons of the MonitoringReady condition (docs/monitoring.md).
	ReasonPrometheusOperatorFound   = "PrometheusOperatorFound"
	ReasonPrometheusOperatorMissing = "PrometheusOperatorMissing"

	// Hibernation (spec.stopped): the Hibernated condition's reasons and the failover
	// controller's events.
	ReasonStopping = "Stopping"
	ReasonStopped  = "Stopped"
	ReasonResuming = "Resuming"
	ReasonResumed  = "Resumed"
	// ReasonFenceWaiting: a fenced primary waits for an instance that can take over
	// before it stops; ReasonFenceIgnored: the annotation names no instance of the
	// cluster. ReasonFenced and ReasonUnfenced name an instance fenced or back.
	ReasonFenceWaiting = "FenceWaiting"

	// ConditionMajorUpgrade's reasons, and the events of an upgrade, in their order.
	ReasonUpgradeChecking        = "UpgradeChecking"
	ReasonUpgrading              = "Upgrading"
	ReasonUpgradeAnalysing       = "UpgradeAnalysing"
	ReasonUpgradeReplicasCloning = "UpgradeReplicasCloning"
	ReasonUpgradeCompleted       = "UpgradeCompleted"
	ReasonUpgradeFailed          = "UpgradeFailed"
	ReasonFenceIgnored           = "FenceIgnored"
)

// Phases of a cluster.
const (
	PhaseCreating    Phase = "Creating"
	PhaseHealthy     Phase = "Healthy"
	PhaseDegraded    Phase = "Degraded"
	PhaseUnavailable Phase = "Unavailable"
	PhaseFailed      Phase = "Failed"
	// PhaseStopping and PhaseStopped: spec.stopped (hibernation).
	PhaseStopping Phase = "Stopping"
	PhaseStopped  Phase = "Stopped"
)

// FindCondition returns the condition of type t, or nil.
func FindCondition(conditions []Condition, t string) *Condition {
	for i := range conditions {
		if conditions[i].Type == t {
			return &conditions[i]
		}
	}
	return nil
}

// SetCondition sets c in conditions, keeping lastTransitionTime when the status did
// not change, and reports whether anything changed.
func SetCondition(conditions *[]Condition, c Condition, now metav1.Time) bool {
	existing := FindCondition(*conditions, c.Type)
	if existing == nil {
		c.LastTransitionTime = now
		*conditions = append(*conditions, c)
		return true
	}
	if existing.Status != c.Status {
		c.LastTransitionTime = now
	} else {
		c.LastTransitionTime = existing.LastTransitionTime
	}
	if *existing == c {
		return false
	}
	*existing = c
	return true
}

// RemoveCondition removes the condition of type t, if any.
func RemoveCondition(conditions *[]Condition, t string) {
	out := (*conditions)[:0]
	for _, c := range *conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	*conditions = out
}
