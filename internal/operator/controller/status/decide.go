package status

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/claims"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/plan"
	"github.com/pgpilot/pgpilot/internal/operator/rolestatus"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// Observed is everything the status of a cluster is computed from.
type Observed struct {
	Cluster *dbv1.PostgresCluster
	// Pooler is the read-write pooler's Deployment (spec.pooler); nil without one, or
	// before the chart made it.
	Pooler *appsv1.Deployment
	// Pods are the cluster's instance pods, sorted by name.
	Pods []corev1.Pod
	// Primary is the holder of the primary Lease, "" when there is none yet.
	Primary string
	// LastFailover is the Lease's record of the last failover, nil when none.
	LastFailover *dbv1.FailoverRecord
	// BackupVerification is the report of the last restore verification, nil when
	// none was reported.
	BackupVerification *dbv1.BackupVerification
	// Replica is where a replica cluster stands as the failover controller last
	// recorded it; nil for a cluster of its own, or before the first record.
	Replica *dbv1.ReplicaStatus
	// FailoverBlocked says why no failover can happen now, "" when one can.
	FailoverBlocked string
	// CredentialProblems say what is wrong with each credentials Secret; empty when
	// all exist and are usable.
	CredentialProblems []string
	// Archiving is the primary's WAL archiving health as the backup controller last
	// recorded it; nil when not known.
	Archiving *ArchivingHealth
	// LastBackup is the newest Completed PostgresBackup, "" when none.
	LastBackup string
	// DataGuard is the agents' refusals and set-aside data directories as the failover
	// controller last recorded them; nil when none were.
	DataGuard *report.DataGuard
	// Claims are the data volume claims of the instances the StatefulSet runs.
	Claims []corev1.PersistentVolumeClaim
	// DataVersion is the data's major version as the failover controller last recorded
	// it; "" when none was.
	DataVersion string
	// Roles is the roles controller's last outcome; nil when it has none yet (the
	// controller just started): status.roles, status.databases and RolesReconciled are
	// then kept as they are.
	Roles *rolestatus.Outcome
	// PendingRestart is what waits for a restart as the restart controller last
	// recorded it; nil when it has not yet.
	PendingRestart *report.PendingRestart
	// MonitoringAPIs are the Prometheus Operator's kinds the API server serves
	// (MonitoringKinds); nil when unknown or monitoring is not enabled.
	MonitoringAPIs map[string]bool
	// Hibernation is where spec.stopped stands as the failover controller recorded it
	// for the Lease's holder and term; nil while the cluster runs.
	Hibernation *primarylease.Hibernation
	// OperatorVersion is this operator's version (internal/version); "" keeps the
	// recorded one.
	OperatorVersion string
	// Streaming are the replicas that do not stream from the primary within
	// maxReadLag, as the failover controller last recorded them; nil when none.
	Streaming report.Streaming
	// Upgrade is where a major version upgrade stands as the failover controller last
	// recorded it; nil when the cluster was never upgraded.
	Upgrade *report.Upgrade
	// Agents are, by instance, what its agent reported as its error while it was not
	// ready, as the failover controller last recorded it.
	Agents map[string]string
	// CreateFailure is why the StatefulSet last failed to create a pod (its newest
	// recent FailedCreate event); "" when it did not, or every pod exists.
	CreateFailure string
	// Health is what threatens the cluster as the failover controller last recorded it.
	Health report.Health
}

// ArchivingHealth is whether the primary archives WAL, and what it last said.
type ArchivingHealth struct {
	OK      bool
	Message string
}

// Decide computes the status fields and conditions the controller owns. It keeps every
// other field of current (the Helm manager's conditions and deployedRelease) as is.
func Decide(o Observed, now metav1.Time) dbv1.PostgresClusterStatus {
	c := o.Cluster
	st := *c.Status.DeepCopy()
	st.ObservedGeneration = c.Generation
	if o.OperatorVersion != "" {
		st.OperatorVersion = o.OperatorVersion
	}
	st.CurrentPrimary = o.Primary
	if o.DataVersion != "" {
		st.DataVersion = o.DataVersion
	}
	st.Instances = nil
	st.ReadyInstances = 0
	primaryReady := false
	problems := InstanceProblems(c, o.Pods, o.Agents, o.CreateFailure, now.Time)
	for i := range o.Pods {
		p := &o.Pods[i]
		ready := clusterpods.IsReady(p)
		st.Instances = append(st.Instances, dbv1.InstanceStatus{
			Name:    p.Name,
			Role:    p.Labels[dbv1.LabelRole],
			Ready:   ready,
			Node:    p.Spec.NodeName,
			Message: problems[p.Name].Message,
		})
		if o.DataGuard != nil {
			st.Instances[len(st.Instances)-1].SetAside = o.DataGuard.SetAside[p.Name]
		}
		st.Instances[len(st.Instances)-1].Volume = volumeOf(o.Claims, dbv1.VolumeClaimOf(p.Name))
		if o.PendingRestart != nil {
			st.Instances[len(st.Instances)-1].PendingRestart = o.PendingRestart.Instances[p.Name]
		}
		if ready {
			st.ReadyInstances++
			if p.Name == o.Primary {
				primaryReady = true
			}
		}
	}

	st.Pooler = poolerStatus(c, o.Pooler)
	phase, reason, message := phaseOf(o, primaryReady, st.ReadyInstances)
	phase, reason, message = notStreaming(o, phase, reason, message)
	reason, message = notRunning(o, problems, phase, reason, message)
	st.Phase = phase
	if phase == dbv1.PhaseHealthy && !c.Bootstrapped() {
		dbv1.SetCondition(&st.Conditions, dbv1.Condition{
			Type: dbv1.ConditionBootstrapped, Status: metav1.ConditionTrue, Reason: dbv1.ReasonFirstHealthy,
			Message: "Every instance was ready for the first time", ObservedGeneration: c.Generation,
		}, now)
	}
	ready := metav1.ConditionFalse
	if phase == dbv1.PhaseHealthy {
		ready = metav1.ConditionTrue
	}
	dbv1.SetCondition(&st.Conditions, dbv1.Condition{
		Type: dbv1.ConditionReady, Status: ready, Reason: reason, Message: message,
		ObservedGeneration: c.Generation,
	}, now)

	st.LastFailover = o.LastFailover
	if o.BackupVerification != nil {
		st.LastBackupVerification = o.BackupVerification
	}
	st.Replica = nil
	if c.Spec.Replica != nil {
		st.Replica = o.Replica
	}
	failover := dbv1.Condition{
		Type: dbv1.ConditionFailoverReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonFailoverPossible,
		Message: "A replica can take over if the primary fails", ObservedGeneration: c.Generation,
	}
	if o.FailoverBlocked != "" {
		failover.Status, failover.Reason, failover.Message = metav1.ConditionFalse, dbv1.ReasonFailoverBlocked, o.FailoverBlocked
	}
	dbv1.SetCondition(&st.Conditions, failover, now)

	creds := dbv1.Condition{
		Type: dbv1.ConditionCredentialsReady, Status: metav1.ConditionTrue,
		Reason: dbv1.ReasonCredentialsCreated, Message: "The superuser, replication and application Secrets exist",
		ObservedGeneration: c.Generation,
	}
	if len(o.CredentialProblems) > 0 {
		creds.Status = metav1.ConditionFalse
		creds.Reason = dbv1.ReasonCredentialsInvalid
		creds.Message = strings.Join(o.CredentialProblems, "; ")
	}
	dbv1.SetCondition(&st.Conditions, creds, now)

	if len(o.Claims) > 0 {
		have := make([]claims.Claim, len(o.Claims))
		for i := range o.Claims {
			have[i] = claims.ClaimOf(&o.Claims[i])
		}
		cond := claims.Condition(claims.Want(c.Spec.Storage, have), have)
		cond.ObservedGeneration = c.Generation
		dbv1.SetCondition(&st.Conditions, cond, now)
	}

	dbv1.SetCondition(&st.Conditions, dataConsistent(o, c.Generation), now)
	if c.Spec.Replicas > 1 {
		dbv1.SetCondition(&st.Conditions, replicasStreaming(o, c.Generation), now)
	} else {
		dbv1.RemoveCondition(&st.Conditions, dbv1.ConditionReplicasStreaming)
	}
	if o.PendingRestart != nil {
		dbv1.SetCondition(&st.Conditions, pendingRestart(*o.PendingRestart, c.Generation), now)
		dbv1.SetCondition(&st.Conditions, parametersApplied(*o.PendingRestart, c.Generation), now)
	}
	if cond, ok := hibernated(o, st.Conditions); ok {
		dbv1.SetCondition(&st.Conditions, cond, now)
	}
	if cond, ok := majorUpgrade(o); ok {
		dbv1.SetCondition(&st.Conditions, cond, now)
	} else {
		dbv1.RemoveCondition(&st.Conditions, dbv1.ConditionMajorUpgrade)
	}

	if b := dbv1.FindCondition(st.Conditions, dbv1.ConditionBootstrapped); b != nil && b.Status == metav1.ConditionTrue {
		for _, cond := range healthConditions(o.Health, c.Generation) {
			dbv1.SetCondition(&st.Conditions, cond, now)
		}
	}

	if o.Roles != nil {
		st.Roles, st.Databases = o.Roles.Roles, o.Roles.Databases
		dbv1.SetCondition(&st.Conditions, rolestatus.Condition(*o.Roles), now)
	}

	switch {
	case !c.Spec.Monitoring.Enabled:
		dbv1.RemoveCondition(&st.Conditions, dbv1.ConditionMonitoringReady)
	case o.MonitoringAPIs != nil:
		dbv1.SetCondition(&st.Conditions, monitoringCondition(o.MonitoringAPIs, c.Generation), now)
	}

	st.LastBackup = o.LastBackup
	switch {
	case c.Spec.Backup == nil:
		dbv1.RemoveCondition(&st.Conditions, dbv1.ConditionContinuousArchiving)
	case o.Archiving != nil:
		archiving := dbv1.Condition{
			Type: dbv1.ConditionContinuousArchiving, Status: metav1.ConditionTrue, Reason: dbv1.ReasonArchiving,
			Message: o.Archiving.Message, ObservedGeneration: c.Generation,
		}
		if !o.Archiving.OK {
			archiving.Status, archiving.Reason = metav1.ConditionFalse, dbv1.ReasonArchiveFailing
		}
		dbv1.SetCondition(&st.Conditions, archiving, now)
	}
	return st
}

// dataConsistent is False while an instance refuses another database's data.
func dataConsistent(o Observed, generation int64) dbv1.Condition {
	cond := dbv1.Condition{
		Type: dbv1.ConditionDataConsistent, Status: metav1.ConditionTrue, Reason: dbv1.ReasonOneDatabase,
		Message: "No instance refuses to follow the primary for holding another database", ObservedGeneration: generation,
	}
	if o.DataGuard == nil || len(o.DataGuard.Refusals) == 0 {
		return cond
	}
	var msgs []string
	for _, pod := range slices.Sorted(maps.Keys(o.DataGuard.Refusals)) {
		msgs = append(msgs, pod+": "+o.DataGuard.Refusals[pod])
	}
	cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, dbv1.ReasonAnotherDatabase, strings.Join(msgs, "; ")
	return cond
}

// volumeOf is the status of the claim named name, nil when it is not among pvcs.
func volumeOf(pvcs []corev1.PersistentVolumeClaim, name string) *dbv1.VolumeStatus {
	for i := range pvcs {
		if pvcs[i].Name != name {
			continue
		}
		c := claims.ClaimOf(&pvcs[i])
		v := &dbv1.VolumeStatus{Claim: name, Requested: c.Requested.String(), Resizing: c.Resizing}
		if !c.Capacity.IsZero() {
			v.Capacity = c.Capacity.String()
		}
		return v
	}
	return nil
}

// pendingRestart is True while a setting waits for a restart, with what waits, where,
// and the step under way or what blocks it.
func pendingRestart(r report.PendingRestart, generation int64) dbv1.Condition {
	cond := dbv1.Condition{Type: dbv1.ConditionPendingRestart, Status: metav1.ConditionFalse, Reason: dbv1.ReasonNoRestartNeeded,
		Message: r.Message, ObservedGeneration: generation}
	switch {
	case r.Blocked:
		cond.Status, cond.Reason = metav1.ConditionTrue, dbv1.ReasonRestartBlocked
	case r.Pending:
		cond.Status, cond.Reason = metav1.ConditionTrue, dbv1.ReasonRestartPending
	}
	return cond
}

// parametersApplied is False while some instance cannot use its settings.
func parametersApplied(r report.PendingRestart, generation int64) dbv1.Condition {
	if len(r.Rejected) > 0 {
		return dbv1.Condition{Type: dbv1.ConditionParametersApplied, Status: metav1.ConditionFalse, Reason: dbv1.ReasonParametersRejected,
			Message: r.RejectedMessage() + "; fix spec.postgresql.parameters", ObservedGeneration: generation}
	}
	return dbv1.Condition{Type: dbv1.ConditionParametersApplied, Status: metav1.ConditionTrue, Reason: dbv1.ReasonParametersApplied,
		Message: "PostgreSQL accepts every setting it is given", ObservedGeneration: generation}
}

// hibernated is the Hibernated condition: True once spec.stopped stopped every
// instance, False while they stop or resume, and False (Resumed) once a cluster that
// was stopped runs again; none for a cluster never stopped (ok false).
func hibernated(o Observed, conditions []dbv1.Condition) (dbv1.Condition, bool) {
	c, h := o.Cluster, o.Hibernation
	cond := dbv1.Condition{Type: dbv1.ConditionHibernated, Status: metav1.ConditionFalse, ObservedGeneration: c.Generation}
	switch {
	case c.Spec.Stopped && h != nil && h.Phase == primarylease.Stopped:
		cond.Status, cond.Reason = metav1.ConditionTrue, dbv1.ReasonStopped
		cond.Message = fmt.Sprintf("Every instance is stopped; the volumes, Secrets and primary Lease are kept, and %s resumes as the primary", h.Holder)
		if h.FinalLSN != "" {
			cond.Message += fmt.Sprintf(" (its WAL ends at %s, timeline %d)", h.FinalLSN, h.Timeline)
		}
	case c.Spec.Stopped:
		cond.Reason, cond.Message = dbv1.ReasonStopping, "Stopping (spec.stopped): the primary stops first and keeps its role; the pods go once the standbys have its final WAL"
	case h != nil:
		cond.Reason, cond.Message = dbv1.ReasonResuming, fmt.Sprintf("Resuming: %s starts again as the primary and the replicas follow it", h.Holder)
	case dbv1.FindCondition(conditions, dbv1.ConditionHibernated) != nil:
		cond.Reason, cond.Message = dbv1.ReasonResumed, "Running again after a hibernation (spec.stopped)"
	default:
		return cond, false
	}
	return cond, true
}

// helmErrorGettingValues is the Helm reconciler's ReleaseFailed reason when the values
// could not be made: for pgpilot, a spec the plan refuses.
const helmErrorGettingValues = "ErrorGettingValues"

// phaseOf summarises the cluster. A cluster stays Creating until it has been Healthy
// once; after that a missing replica makes it Degraded and a missing primary Unavailable.
func phaseOf(o Observed, primaryReady bool, readyInstances int32) (dbv1.Phase, string, string) {
	c := o.Cluster
	for _, t := range []string{dbv1.ConditionReleaseFailed, dbv1.ConditionIrreconcilable} {
		cond := dbv1.FindCondition(c.Status.Conditions, t)
		switch {
		case cond == nil || cond.Status != metav1.ConditionTrue:
		case cond.Reason == helmErrorGettingValues && strings.HasPrefix(cond.Message, plan.RefusedPrefix):
			// The operator's own refusal of the spec (plan.Decide), in its words.
			return dbv1.PhaseFailed, dbv1.ReasonSpecRefused,
				"The operator refuses the spec and deploys nothing of it until it is changed: " + strings.TrimPrefix(cond.Message, plan.RefusedPrefix)
		default:
			return dbv1.PhaseFailed, dbv1.ReasonReleaseFailed,
				fmt.Sprintf("Rendering the cluster failed (%s): %s", cond.Reason, cond.Message)
		}
	}
	creating := !c.Bootstrapped()
	want := c.Spec.Replicas
	switch {
	case c.Spec.Stopped && o.Hibernation != nil && o.Hibernation.Phase == primarylease.Stopped:
		return dbv1.PhaseStopped, dbv1.ReasonStopped, fmt.Sprintf("Every instance is stopped (spec.stopped); %s resumes as the primary", o.Hibernation.Holder)
	case c.Spec.Stopped:
		return dbv1.PhaseStopping, dbv1.ReasonStopping, "Stopping (spec.stopped): the primary stops first, then every pod goes"
	case o.Primary == "" && creating:
		return dbv1.PhaseCreating, dbv1.ReasonNoPrimary, "No primary has been designated yet"
	case o.Primary == "":
		return dbv1.PhaseUnavailable, dbv1.ReasonNoPrimary,
			fmt.Sprintf("The Lease %s names no primary", c.PrimaryLeaseName())
	case primaryReady && readyInstances >= want && c.FollowedSource() != "":
		return dbv1.PhaseHealthy, dbv1.ReasonAllInstancesReady,
			fmt.Sprintf("%d of %d instances are ready; a replica cluster: %s follows %s, the others follow it", readyInstances, want, o.Primary, c.FollowedSource())
	case primaryReady && readyInstances >= want:
		return dbv1.PhaseHealthy, dbv1.ReasonAllInstancesReady,
			fmt.Sprintf("%d of %d instances are ready; %s is primary", readyInstances, want, o.Primary)
	case creating:
		return dbv1.PhaseCreating, dbv1.ReasonCreating,
			fmt.Sprintf("%d of %d instances are ready", readyInstances, want)
	case primaryReady:
		return dbv1.PhaseDegraded, dbv1.ReasonInstancesNotReady,
			fmt.Sprintf("%d of %d instances are ready; %s is primary", readyInstances, want, o.Primary)
	default:
		return dbv1.PhaseUnavailable, dbv1.ReasonPrimaryNotReady,
			fmt.Sprintf("The primary %s is not ready; %d of %d instances are ready", o.Primary, readyInstances, want)
	}
}

// streamingProblems describes the replicas that do not stream, one per pod, sorted.
func streamingProblems(o Observed) []string {
	var out []string
	for _, pod := range slices.Sorted(maps.Keys(o.Streaming)) {
		if pod == o.Primary {
			continue
		}
		out = append(out, o.Streaming[pod].Describe(pod))
	}
	return out
}

// notStreaming makes a Healthy or Degraded phase Degraded with the replicas that do not
// stream from the primary within maxReadLag (I6): such a replica is not ready, and one
// whose probe has not failed yet must not leave the cluster Healthy meanwhile.
func notStreaming(o Observed, phase dbv1.Phase, reason, message string) (dbv1.Phase, string, string) {
	problems := streamingProblems(o)
	if len(problems) == 0 || (phase != dbv1.PhaseHealthy && phase != dbv1.PhaseDegraded) {
		return phase, reason, message
	}
	return dbv1.PhaseDegraded, dbv1.ReasonReplicaNotStreaming, message + "; " + strings.Join(problems, "; ")
}

// replicasStreaming is True while every replica streams within maxReadLag, False naming
// each one that does not.
func replicasStreaming(o Observed, generation int64) dbv1.Condition {
	cond := dbv1.Condition{Type: dbv1.ConditionReplicasStreaming, Status: metav1.ConditionTrue, Reason: dbv1.ReasonAllStreaming,
		Message: "Every replica that answers streams from the primary within maxReadLag", ObservedGeneration: generation}
	if problems := streamingProblems(o); len(problems) > 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, dbv1.ReasonReplicaNotStreaming
		cond.Message = strings.Join(problems, "; ") + ". Such a replica is not ready (it leaves the -ro and -r Services) until it streams within maxReadLag; its agent restarts a WAL receiver that hangs"
	}
	return cond
}

// majorUpgrade is the MajorUpgrade condition from the upgrade the failover controller
// recorded: True once completed on every instance, False while under way or after it
// failed. None for a cluster never upgraded, or once spec.version no longer asks for
// the recorded upgrade's major (set back after a failure, say).
func majorUpgrade(o Observed) (dbv1.Condition, bool) {
	u, c := o.Upgrade, o.Cluster
	if u == nil || u.Reason == "" || u.To != c.Spec.Version {
		return dbv1.Condition{}, false
	}
	cond := dbv1.Condition{Type: dbv1.ConditionMajorUpgrade, Status: metav1.ConditionFalse, Reason: u.Reason,
		Message: fmt.Sprintf("PostgreSQL %s to %s: %s", u.From, u.To, u.Message), ObservedGeneration: c.Generation}
	if u.Reason == dbv1.ReasonUpgradeCompleted {
		cond.Status = metav1.ConditionTrue
		if u.WritesStoppedMillis > 0 {
			cond.Message += fmt.Sprintf(" (writes stopped for %.1f s)", float64(u.WritesStoppedMillis)/1000)
		}
	}
	return cond, true
}

// healthConditions are ConnectionsAvailable, TransactionIDsSafe and VolumeSpace from the
// health report: True with the bound, or False with the problem and what to do.
func healthConditions(h report.Health, generation int64) []dbv1.Condition {
	one := func(t, okReason, okMsg, badReason string, problems ...string) dbv1.Condition {
		cond := dbv1.Condition{Type: t, Status: metav1.ConditionTrue, Reason: okReason, Message: okMsg, ObservedGeneration: generation}
		if len(problems) > 0 {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, badReason, strings.Join(problems, "; ")
		}
		return cond
	}
	since := func(p report.HealthProblem) string {
		return fmt.Sprintf("since %s: %s", p.Since.UTC().Format(time.RFC3339), p.Message)
	}
	var conns, xids, volumes []string
	if p, ok := h[report.HealthConnections]; ok {
		conns = append(conns, since(p))
	}
	if p, ok := h[report.HealthWraparound]; ok {
		xids = append(xids, since(p))
	}
	vols := h.Volumes()
	for _, pod := range slices.Sorted(maps.Keys(vols)) {
		volumes = append(volumes, since(vols[pod]))
	}
	return []dbv1.Condition{
		one(dbv1.ConditionConnectionsAvailable, dbv1.ReasonConnectionsAvailable,
			"The primary's client sessions take less than 90% of those it admits", dbv1.ReasonConnectionsSaturated, conns...),
		one(dbv1.ConditionTransactionIDsSafe, dbv1.ReasonTransactionIDsFrozen,
			"Every database's oldest unfrozen transaction ID is less than 500 million transactions old", dbv1.ReasonWraparoundRisk, xids...),
		one(dbv1.ConditionVolumeSpace, dbv1.ReasonVolumeSpaceAvailable,
			"Every instance's volume is less than 90% used and does not fill within a day at the current rate", dbv1.ReasonVolumeFillingUp, volumes...),
	}
}

// poolerStatus is status.pooler: the read-write pool's pods, from its Deployment, and
// what keeps them from serving; nil without spec.pooler.
func poolerStatus(c *dbv1.PostgresCluster, d *appsv1.Deployment) *dbv1.PoolerStatus {
	if c.Spec.Pooler == nil {
		return nil
	}
	s := &dbv1.PoolerStatus{Instances: max(c.Spec.Pooler.Instances, 1)}
	if d == nil {
		s.Message = "the pooler's Deployment " + c.Names().PoolerReadWrite() + " does not exist yet"
		return s
	}
	if d.Spec.Replicas != nil {
		s.Instances = *d.Spec.Replicas
	}
	s.ReadyInstances = d.Status.ReadyReplicas
	for _, cond := range d.Status.Conditions {
		if cond.Status == corev1.ConditionFalse && cond.Message != "" && cond.Type != appsv1.DeploymentAvailable ||
			cond.Type == appsv1.DeploymentReplicaFailure && cond.Status == corev1.ConditionTrue {
			s.Message = cond.Message
		}
	}
	if s.Message == "" && s.ReadyInstances < s.Instances {
		s.Message = fmt.Sprintf("%d of %d pooler pods are ready: kubectl describe pods -l db.example.com/pooler=%s says why", s.ReadyInstances, s.Instances, c.Name)
	}
	return s
}
