package status_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/status"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

var (
	// now is the injected clock of every Decide call; earlier is when the conditions a
	// test starts from last changed, and later is a second reconcile.
	now     = metav1.NewTime(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	earlier = metav1.NewTime(now.Add(-time.Hour))
	later   = metav1.NewTime(now.Add(time.Minute))
)

const (
	generation = 7
	// credentialsOK is the message of CredentialsReady when every Secret is usable.
	credentialsOK = "The superuser, replication and application Secrets exist"
)

// --- fixtures ---------------------------------------------------------------------------

type clusterOption func(*dbv1.PostgresCluster)

// newCluster returns cluster "db" in namespace "prod" with 3 replicas at generation 7,
// as changed by opts.
func newCluster(opts ...clusterOption) *dbv1.PostgresCluster {
	c := &dbv1.PostgresCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", Generation: generation},
		Spec:       dbv1.PostgresClusterSpec{Replicas: 3, Version: "16"},
	}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

func withReplicas(n int32) clusterOption {
	return func(c *dbv1.PostgresCluster) { c.Spec.Replicas = n }
}

// withCondition puts a condition in the cluster's status as it was at earlier.
func withCondition(t string, s metav1.ConditionStatus, reason, message string) clusterOption {
	return func(c *dbv1.PostgresCluster) {
		c.Status.Conditions = append(c.Status.Conditions, dbv1.Condition{
			Type: t, Status: s, Reason: reason, Message: message,
			ObservedGeneration: generation - 1, LastTransitionTime: earlier,
		})
	}
}

// wasReady is the Ready condition a previous Decide left with the given reason; reasons
// only a cluster that has been Healthy can have come with Bootstrapped True.
func wasReady(reason string) clusterOption {
	s := metav1.ConditionFalse
	if reason == dbv1.ReasonAllInstancesReady {
		s = metav1.ConditionTrue
	}
	ready := withCondition(dbv1.ConditionReady, s, reason, "whatever the last Decide said")
	switch reason {
	case dbv1.ReasonAllInstancesReady, dbv1.ReasonInstancesNotReady, dbv1.ReasonPrimaryNotReady:
		return func(c *dbv1.PostgresCluster) { ready(c); wasBootstrapped(c) }
	}
	return ready
}

// failoverReady is the FailoverReady condition Decide writes at now when nothing blocks
// a failover.
var failoverReady = dbv1.Condition{
	Type: dbv1.ConditionFailoverReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonFailoverPossible,
	Message: "A replica can take over if the primary fails", ObservedGeneration: generation, LastTransitionTime: now,
}

// dataConsistent is the DataConsistent condition Decide writes at now when no instance
// refuses another database's data.
var dataConsistent = dbv1.Condition{
	Type: dbv1.ConditionDataConsistent, Status: metav1.ConditionTrue, Reason: dbv1.ReasonOneDatabase,
	Message: "No instance refuses to follow the primary for holding another database", ObservedGeneration: generation, LastTransitionTime: now,
}

var replicasStreaming = dbv1.Condition{
	Type: dbv1.ConditionReplicasStreaming, Status: metav1.ConditionTrue, Reason: dbv1.ReasonAllStreaming,
	Message: "Every replica that answers streams from the primary within maxReadLag", ObservedGeneration: generation, LastTransitionTime: now,
}

// bootstrappedCondition is what wasBootstrapped adds.
var bootstrappedCondition = dbv1.Condition{
	Type: dbv1.ConditionBootstrapped, Status: metav1.ConditionTrue, Reason: dbv1.ReasonFirstHealthy,
	Message: "Every instance was ready for the first time", ObservedGeneration: generation - 1, LastTransitionTime: earlier,
}

// wasBootstrapped is the Bootstrapped condition Decide sets the first time it sees every
// instance ready.
func wasBootstrapped(c *dbv1.PostgresCluster) {
	withCondition(dbv1.ConditionBootstrapped, metav1.ConditionTrue, dbv1.ReasonFirstHealthy, "Every instance was ready for the first time")(c)
}

func withStatus(st dbv1.PostgresClusterStatus) clusterOption {
	return func(c *dbv1.PostgresCluster) { c.Status = st }
}

type podOption func(*corev1.Pod)

// newPod returns instance pod db-<ordinal> of cluster db, not ready, as changed by opts.
func newPod(name string, opts ...podOption) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "prod",
			Labels: map[string]string{dbv1.LabelCluster: "db"},
		},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse},
		}},
	}
	for _, opt := range opts {
		opt(&p)
	}
	return p
}

func ready(p *corev1.Pod) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].Status = corev1.ConditionTrue
		}
	}
}

// waiting makes container (an init container when init) wait for image with reason.
func waiting(init bool, container, image, reason, message string) podOption {
	return func(p *corev1.Pod) {
		cs := corev1.ContainerStatus{Name: container, Image: image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}
		if init {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, cs)
		} else {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, cs)
		}
	}
}

func role(r string) podOption {
	return func(p *corev1.Pod) { p.Labels[dbv1.LabelRole] = r }
}

func onNode(n string) podOption {
	return func(p *corev1.Pod) { p.Spec.NodeName = n }
}

// pods returns db-0 (primary) and replicas db-1, db-2; those named in readyNames are
// ready.
func pods(readyNames ...string) []corev1.Pod {
	var out []corev1.Pod
	for i, name := range []string{"db-0", "db-1", "db-2"} {
		opts := []podOption{role(dbv1.RoleReplica)}
		if i == 0 {
			opts[0] = role(dbv1.RolePrimary)
		}
		for _, r := range readyNames {
			if r == name {
				opts = append(opts, ready)
			}
		}
		out = append(out, newPod(name, opts...))
	}
	return out
}

// readyCondition is the Ready condition Decide is expected to write at generation 7.
func readyCondition(s metav1.ConditionStatus, reason, message string, since metav1.Time) dbv1.Condition {
	return dbv1.Condition{
		Type: dbv1.ConditionReady, Status: s, Reason: reason, Message: message,
		ObservedGeneration: generation, LastTransitionTime: since,
	}
}

// --- phase ------------------------------------------------------------------------------

type phaseCase struct {
	name     string
	observed status.Observed
	want     phaseAndReady
}

type phaseAndReady struct {
	Phase dbv1.Phase
	Ready dbv1.Condition
}

func phaseCases() []phaseCase {
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	return []phaseCase{
		// Creating.
		{
			name:     "no primary designated, no Ready condition",
			observed: status.Observed{Cluster: newCluster(), Pods: pods()},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonNoPrimary, "No primary has been designated yet", now)},
		},
		{
			name:     "no primary designated although every pod is ready",
			observed: status.Observed{Cluster: newCluster(), Pods: pods("db-0", "db-1", "db-2")},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonNoPrimary, "No primary has been designated yet", now)},
		},
		{
			name:     "no pods at all",
			observed: status.Observed{Cluster: newCluster()},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonNoPrimary, "No primary has been designated yet", now)},
		},
		{
			name:     "primary designated, no Ready condition yet, nothing ready",
			observed: status.Observed{Cluster: newCluster(), Pods: pods(), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "0 of 3 instances are ready", now)},
		},
		{
			name:     "primary ready, replicas starting, no Ready condition yet",
			observed: status.Observed{Cluster: newCluster(), Pods: pods("db-0"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "1 of 3 instances are ready", now)},
		},
		{
			// spec.version "16" where no image for 16 can be pulled (the local node has
			// Debian's 15 and 17): the phase alone would say only "0 of 3".
			name: "the primary's image cannot be pulled",
			observed: status.Observed{Cluster: newCluster(), Primary: "db-0", Pods: []corev1.Pod{
				newPod("db-0", role(dbv1.RolePrimary), waiting(false, "postgres", "postgres:16", "ImagePullBackOff", `Back-off pulling image "postgres:16"`)),
				newPod("db-1", role(dbv1.RoleReplica), waiting(true, "agent", "pgpilot:dev", "ErrImagePull", "rpc error: not found")),
				newPod("db-2", role(dbv1.RoleReplica), waiting(false, "postgres", "postgres:15", "CrashLoopBackOff", "back-off 10s")),
			}},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonImageUnavailable, "0 of 3 instances are ready; "+
					`db-0 cannot pull the image "postgres:16" of its postgres container (ImagePullBackOff: Back-off pulling image "postgres:16"); `+
					`db-1 cannot pull the image "pgpilot:dev" of its agent container (ErrImagePull: rpc error: not found); `+
					`db-2 keeps exiting: its postgres container is in CrashLoopBackOff. `+
					`spec.version "16" selects the image; set spec.image to one the nodes can pull, or give the operator one for this major (RELATED_IMAGE_POSTGRES_<major>, docs/install.md)`, now)},
		},
		{
			name: "a container that crash-loops is not an image problem",
			observed: status.Observed{Cluster: newCluster(), Primary: "db-0", Pods: []corev1.Pod{
				newPod("db-0", role(dbv1.RolePrimary), waiting(false, "postgres", "postgres:16", "CrashLoopBackOff", "back-off 10s")),
			}},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonInstanceNotRunning, "0 of 3 instances are ready; db-0 keeps exiting: its postgres container is in CrashLoopBackOff", now)},
		},
		{
			// work_mem: "lots": postgres refuses to start, and its agent says why.
			name: "an agent's error while its instance is not ready",
			observed: status.Observed{Cluster: newCluster(), Primary: "db-0", Pods: pods(),
				Agents: map[string]string{"db-0": `postgres exited while starting: FATAL:  invalid value for parameter "work_mem": "lots"`}},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonInstanceNotRunning, `0 of 3 instances are ready; db-0 reports: postgres exited while starting: FATAL:  invalid value for parameter "work_mem": "lots"`, now)},
		},
		{
			name: "replicas ready but primary not, while Creating",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonCreating)),
				Pods: pods("db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "2 of 3 instances are ready", earlier)},
		},
		{
			name: "primary designated after NoPrimary",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonNoPrimary)),
				Pods: pods("db-0", "db-1"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "2 of 3 instances are ready", earlier)},
		},
		{
			name: "Lease names a pod that does not exist, while Creating",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonCreating)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-9"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "3 of 3 instances are ready", earlier)},
		},
		// Healthy.
		{
			name:     "every instance ready on the first reconcile",
			observed: status.Observed{Cluster: newCluster(), Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-0 is primary", now)},
		},
		{
			name: "every instance ready after Creating",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonCreating)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-0 is primary", now)},
		},
		{
			name: "still Healthy keeps the transition time",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-0 is primary", earlier)},
		},
		{
			name: "a single instance",
			observed: status.Observed{Cluster: newCluster(withReplicas(1)),
				Pods: []corev1.Pod{newPod("db-0", ready)}, Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "1 of 1 instances are ready; db-0 is primary", now)},
		},
		{
			name: "scaled down to 2 with the third pod still ready",
			observed: status.Observed{Cluster: newCluster(withReplicas(2), wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 2 instances are ready; db-0 is primary", earlier)},
		},
		{
			name: "recovered from Unavailable after a failover",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonPrimaryNotReady)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-1"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-1 is primary", now)},
		},
		// Degraded.
		{
			name: "a replica lost after Healthy",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseDegraded,
				readyCondition(f, dbv1.ReasonInstancesNotReady, "2 of 3 instances are ready; db-0 is primary", now)},
		},
		{
			name: "still Degraded keeps the transition time",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonInstancesNotReady)),
				Pods: pods("db-0"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseDegraded,
				readyCondition(f, dbv1.ReasonInstancesNotReady, "1 of 3 instances are ready; db-0 is primary", earlier)},
		},
		{
			name: "a replica pod gone after Healthy",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-1", "db-2")[:2], Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseDegraded,
				readyCondition(f, dbv1.ReasonInstancesNotReady, "2 of 3 instances are ready; db-0 is primary", now)},
		},
		// Unavailable.
		{
			name: "primary lost after Healthy",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseUnavailable,
				readyCondition(f, dbv1.ReasonPrimaryNotReady, "The primary db-0 is not ready; 2 of 3 instances are ready", now)},
		},
		{
			name: "primary lost while Degraded",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonInstancesNotReady)),
				Pods: pods("db-1"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseUnavailable,
				readyCondition(f, dbv1.ReasonPrimaryNotReady, "The primary db-0 is not ready; 1 of 3 instances are ready", earlier)},
		},
		{
			name: "still Unavailable",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonPrimaryNotReady)),
				Pods: pods(), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseUnavailable,
				readyCondition(f, dbv1.ReasonPrimaryNotReady, "The primary db-0 is not ready; 0 of 3 instances are ready", earlier)},
		},
		{
			name: "Lease names a pod that does not exist, after Healthy",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-9"},
			want: phaseAndReady{dbv1.PhaseUnavailable,
				readyCondition(f, dbv1.ReasonPrimaryNotReady, "The primary db-9 is not ready; 3 of 3 instances are ready", now)},
		},
		// History comes from Bootstrapped, not from the Ready condition's last reason.
		{
			name: "first start after a failed install was fixed is still Creating",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonReleaseFailed)),
				Pods: pods("db-0"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseCreating,
				readyCondition(f, dbv1.ReasonCreating, "1 of 3 instances are ready", earlier)},
		},
		{
			name: "a bootstrapped cluster whose Lease lost its holder is Unavailable",
			observed: status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)),
				Pods: pods("db-0", "db-1", "db-2")},
			want: phaseAndReady{dbv1.PhaseUnavailable,
				readyCondition(f, dbv1.ReasonNoPrimary, "The Lease db-primary names no primary", now)},
		},
		// Failed.
		{
			name: "release failed while every instance is ready",
			observed: status.Observed{
				Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady),
					withCondition(dbv1.ConditionReleaseFailed, tr, "UpgradeError", "template: boom")),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseFailed,
				readyCondition(f, dbv1.ReasonReleaseFailed, "Rendering the cluster failed (UpgradeError): template: boom", now)},
		},
		{
			name: "release failed before any pod exists",
			observed: status.Observed{
				Cluster: newCluster(withCondition(dbv1.ConditionReleaseFailed, tr, "InstallError", "values don't meet the schema")),
			},
			want: phaseAndReady{dbv1.PhaseFailed,
				readyCondition(f, dbv1.ReasonReleaseFailed, "Rendering the cluster failed (InstallError): values don't meet the schema", now)},
		},
		{
			name: "a spec the operator refuses",
			observed: status.Observed{
				Cluster: newCluster(withCondition(dbv1.ConditionReleaseFailed, tr, "ErrorGettingValues", "spec refused: spec.resources: requests.cpu 2 is above limits.cpu 1: ...")),
			},
			want: phaseAndReady{dbv1.PhaseFailed,
				readyCondition(f, dbv1.ReasonSpecRefused, "The operator refuses the spec and deploys nothing of it until it is changed: spec.resources: requests.cpu 2 is above limits.cpu 1: ...", now)},
		},
		{
			name: "values that could not be made for another reason",
			observed: status.Observed{
				Cluster: newCluster(withCondition(dbv1.ConditionReleaseFailed, tr, "ErrorGettingValues", "reading the primary Lease: timeout")),
			},
			want: phaseAndReady{dbv1.PhaseFailed,
				readyCondition(f, dbv1.ReasonReleaseFailed, "Rendering the cluster failed (ErrorGettingValues): reading the primary Lease: timeout", now)},
		},
		{
			name: "irreconcilable",
			observed: status.Observed{
				Cluster: newCluster(wasReady(dbv1.ReasonInstancesNotReady),
					withCondition(dbv1.ConditionIrreconcilable, tr, "ReconcileError", "cannot patch StatefulSet")),
				Pods: pods("db-0"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseFailed,
				readyCondition(f, dbv1.ReasonReleaseFailed, "Rendering the cluster failed (ReconcileError): cannot patch StatefulSet", earlier)},
		},
		{
			name: "Helm failure conditions that are False are ignored",
			observed: status.Observed{
				Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady),
					withCondition(dbv1.ConditionReleaseFailed, f, "UpgradeSuccessful", ""),
					withCondition(dbv1.ConditionIrreconcilable, f, "ReconcileComplete", "")),
				Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"},
			want: phaseAndReady{dbv1.PhaseHealthy,
				readyCondition(tr, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-0 is primary", earlier)},
		},
	}
}

func TestDecidePhase(t *testing.T) {
	for _, tc := range phaseCases() {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Decide(tc.observed, now)
			got := phaseAndReady{Phase: st.Phase}
			if c := dbv1.FindCondition(st.Conditions, dbv1.ConditionReady); c != nil {
				got.Ready = *c
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("phase and Ready condition (-want +got):\n%s", diff)
			}
		})
	}
}

// The controller writes the status only when Decide's output differs from the stored
// status, so Decide applied to its own output must return it unchanged, later too.
func TestDecideIsIdempotent(t *testing.T) {
	cases := phaseCases()
	cases = append(cases, phaseCase{
		name: "credentials problems",
		observed: status.Observed{Cluster: newCluster(), Pods: pods("db-0"), Primary: "db-0",
			CredentialProblems: []string{"Secret db-app does not exist yet"}},
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first := status.Decide(tc.observed, now)
			again := tc.observed
			again.Cluster = tc.observed.Cluster.DeepCopy()
			again.Cluster.Status = *first.DeepCopy()
			second := status.Decide(again, later)
			if !equality.Semantic.DeepEqual(first, second) {
				t.Errorf("a second Decide changed the status (-first +second):\n%s", cmp.Diff(first, second))
			}
		})
	}
}

// --- conditions -------------------------------------------------------------------------

func TestDecideCredentialsReady(t *testing.T) {
	tr, f := metav1.ConditionTrue, metav1.ConditionFalse
	credentials := func(s metav1.ConditionStatus, reason, message string, since metav1.Time) dbv1.Condition {
		return dbv1.Condition{
			Type: dbv1.ConditionCredentialsReady, Status: s, Reason: reason, Message: message,
			ObservedGeneration: generation, LastTransitionTime: since,
		}
	}
	cases := []struct {
		name     string
		cluster  *dbv1.PostgresCluster
		problems []string
		want     dbv1.Condition
	}{
		{
			name:    "every Secret usable, first time",
			cluster: newCluster(),
			want:    credentials(tr, dbv1.ReasonCredentialsCreated, credentialsOK, now),
		},
		{
			name:    "every Secret usable, as before",
			cluster: newCluster(withCondition(dbv1.ConditionCredentialsReady, tr, dbv1.ReasonCredentialsCreated, credentialsOK)),
			want:    credentials(tr, dbv1.ReasonCredentialsCreated, credentialsOK, earlier),
		},
		{
			name:     "one problem",
			cluster:  newCluster(),
			problems: []string{"Secret db-app does not exist yet"},
			want:     credentials(f, dbv1.ReasonCredentialsInvalid, "Secret db-app does not exist yet", now),
		},
		{
			name:    "several problems are joined in order",
			cluster: newCluster(withCondition(dbv1.ConditionCredentialsReady, tr, dbv1.ReasonCredentialsCreated, credentialsOK)),
			problems: []string{
				"Secret db-superuser does not exist yet",
				`Secret db-replication has no "password" key`,
				`Secret db-app has no "username" key`,
			},
			want: credentials(f, dbv1.ReasonCredentialsInvalid,
				`Secret db-superuser does not exist yet; Secret db-replication has no "password" key; Secret db-app has no "username" key`, now),
		},
		{
			name: "problems changed but still False keeps the transition time",
			cluster: newCluster(withCondition(dbv1.ConditionCredentialsReady, f, dbv1.ReasonCredentialsInvalid,
				"Secret db-app does not exist yet")),
			problems: []string{`Secret db-app has no "password" key`},
			want:     credentials(f, dbv1.ReasonCredentialsInvalid, `Secret db-app has no "password" key`, earlier),
		},
		{
			name: "fixed",
			cluster: newCluster(withCondition(dbv1.ConditionCredentialsReady, f, dbv1.ReasonCredentialsInvalid,
				"Secret db-app does not exist yet")),
			want: credentials(tr, dbv1.ReasonCredentialsCreated, credentialsOK, now),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Decide(status.Observed{Cluster: tc.cluster, CredentialProblems: tc.problems}, now)
			got := dbv1.FindCondition(st.Conditions, dbv1.ConditionCredentialsReady)
			if got == nil {
				t.Fatalf("no %s condition in %+v", dbv1.ConditionCredentialsReady, st.Conditions)
			}
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("CredentialsReady (-want +got):\n%s", diff)
			}
		})
	}
}

// --- the whole status -------------------------------------------------------------------

func TestDecideStatus(t *testing.T) {
	deployed := dbv1.Condition{
		Type: dbv1.ConditionDeployed, Status: metav1.ConditionTrue, Reason: "UpgradeSuccessful",
		Message: "release notes", ObservedGeneration: 6, LastTransitionTime: earlier,
	}
	initialized := dbv1.Condition{Type: "Initialized", Status: metav1.ConditionTrue, LastTransitionTime: earlier}
	release := &dbv1.DeployedRelease{Name: "db", Manifest: "---\n# Source: postgrescluster/templates/statefulset.yaml\n"}

	cases := []struct {
		name     string
		observed status.Observed
		want     dbv1.PostgresClusterStatus
	}{
		{
			name: "first status: Helm's fields kept, ours added",
			observed: status.Observed{
				Cluster: newCluster(withStatus(dbv1.PostgresClusterStatus{
					Conditions:      []dbv1.Condition{initialized, deployed},
					DeployedRelease: release,
				})),
				Pods: []corev1.Pod{
					newPod("db-0", role(dbv1.RolePrimary), ready, onNode("node-a")),
					newPod("db-1", role(dbv1.RoleReplica), onNode("node-b")),
					newPod("db-2"), // not labelled nor scheduled yet
				},
				Primary: "db-0",
			},
			want: dbv1.PostgresClusterStatus{
				Conditions: []dbv1.Condition{
					initialized,
					deployed,
					readyCondition(metav1.ConditionFalse, dbv1.ReasonCreating, "1 of 3 instances are ready", now),
					failoverReady,
					{Type: dbv1.ConditionCredentialsReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonCredentialsCreated,
						Message: credentialsOK, ObservedGeneration: generation, LastTransitionTime: now},
					dataConsistent,
					replicasStreaming,
				},
				Phase:          dbv1.PhaseCreating,
				CurrentPrimary: "db-0",
				ReadyInstances: 1,
				Instances: []dbv1.InstanceStatus{
					{Name: "db-0", Role: dbv1.RolePrimary, Ready: true, Node: "node-a"},
					{Name: "db-1", Role: dbv1.RoleReplica, Ready: false, Node: "node-b"},
					{Name: "db-2", Role: "", Ready: false, Node: ""},
				},
				ObservedGeneration: generation,
				DeployedRelease:    release,
			},
		},
		{
			name: "stale fields replaced after a failover",
			observed: status.Observed{
				Cluster: newCluster(withStatus(dbv1.PostgresClusterStatus{
					Conditions: []dbv1.Condition{
						readyCondition(metav1.ConditionTrue, dbv1.ReasonAllInstancesReady, "3 of 3 instances are ready; db-0 is primary", earlier),
						deployed,
						bootstrappedCondition,
					},
					Phase:          dbv1.PhaseHealthy,
					CurrentPrimary: "db-0",
					ReadyInstances: 3,
					Instances: []dbv1.InstanceStatus{
						{Name: "db-0", Role: dbv1.RolePrimary, Ready: true, Node: "node-a"},
						{Name: "db-1", Role: dbv1.RoleReplica, Ready: true, Node: "node-b"},
						{Name: "db-2", Role: dbv1.RoleReplica, Ready: true, Node: "node-c"},
					},
					ObservedGeneration: 5,
					DeployedRelease:    release,
				})),
				Pods: []corev1.Pod{
					newPod("db-0", role(dbv1.RoleFenced), onNode("node-a")),
					newPod("db-1", role(dbv1.RolePrimary), ready, onNode("node-b")),
				},
				Primary: "db-1",
				DataGuard: &report.DataGuard{
					Refusals: map[string]string{"db-0": "refusing to rewind onto db-1: it holds another database"},
					SetAside: map[string][]string{"db-1": {"pgdata.set-aside-20261124T100000Z: pg_rewind failed"}},
				},
			},
			want: dbv1.PostgresClusterStatus{
				Conditions: []dbv1.Condition{
					readyCondition(metav1.ConditionFalse, dbv1.ReasonInstancesNotReady, "1 of 3 instances are ready; db-1 is primary", now),
					deployed,
					bootstrappedCondition,
					failoverReady,
					{Type: dbv1.ConditionCredentialsReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonCredentialsCreated,
						Message: credentialsOK, ObservedGeneration: generation, LastTransitionTime: now},
					{Type: dbv1.ConditionDataConsistent, Status: metav1.ConditionFalse, Reason: dbv1.ReasonAnotherDatabase,
						Message:            "db-0: refusing to rewind onto db-1: it holds another database",
						ObservedGeneration: generation, LastTransitionTime: now},
					replicasStreaming,
					{Type: dbv1.ConditionConnectionsAvailable, Status: metav1.ConditionTrue, Reason: dbv1.ReasonConnectionsAvailable,
						Message: "The primary's client sessions take less than 90% of those it admits", ObservedGeneration: generation, LastTransitionTime: now},
					{Type: dbv1.ConditionTransactionIDsSafe, Status: metav1.ConditionTrue, Reason: dbv1.ReasonTransactionIDsFrozen,
						Message: "Every database's oldest unfrozen transaction ID is less than 500 million transactions old", ObservedGeneration: generation, LastTransitionTime: now},
					{Type: dbv1.ConditionVolumeSpace, Status: metav1.ConditionTrue, Reason: dbv1.ReasonVolumeSpaceAvailable,
						Message: "Every instance's volume is less than 90% used and does not fill within a day at the current rate", ObservedGeneration: generation, LastTransitionTime: now},
				},
				Phase:          dbv1.PhaseDegraded,
				CurrentPrimary: "db-1",
				ReadyInstances: 1,
				Instances: []dbv1.InstanceStatus{
					{Name: "db-0", Role: dbv1.RoleFenced, Ready: false, Node: "node-a"},
					{Name: "db-1", Role: dbv1.RolePrimary, Ready: true, Node: "node-b",
						SetAside: []string{"pgdata.set-aside-20261124T100000Z: pg_rewind failed"}},
				},
				ObservedGeneration: generation,
				DeployedRelease:    release,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.observed.Cluster.DeepCopy()
			got := status.Decide(tc.observed, now)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			// The cluster may come from the informer cache: Decide must not modify it.
			if diff := cmp.Diff(before, tc.observed.Cluster); diff != "" {
				t.Errorf("Decide modified the cluster (-before +after):\n%s", diff)
			}
		})
	}
}

// Bootstrapped turns True the first time every instance is ready and is kept through
// later losses (and through the Helm manager's status writes, which keep conditions).
func TestBootstrappedIsSetOnceAndKept(t *testing.T) {
	c := newCluster()
	c.Status = status.Decide(status.Observed{Cluster: c, Pods: pods("db-0"), Primary: "db-0"}, earlier)
	if b := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionBootstrapped); b != nil {
		t.Fatalf("Bootstrapped set while Creating: %+v", b)
	}
	c.Status = status.Decide(status.Observed{Cluster: c, Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"}, now)
	want := dbv1.Condition{Type: dbv1.ConditionBootstrapped, Status: metav1.ConditionTrue, Reason: dbv1.ReasonFirstHealthy,
		Message: "Every instance was ready for the first time", ObservedGeneration: generation, LastTransitionTime: now}
	if diff := cmp.Diff(&want, dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionBootstrapped)); diff != "" {
		t.Fatalf("after the first Healthy (-want +got):\n%s", diff)
	}
	// What a Helm status write leaves: conditions only.
	c.Status = dbv1.PostgresClusterStatus{Conditions: c.Status.Conditions}
	c.Status = status.Decide(status.Observed{Cluster: c, Pods: pods("db-0", "db-1"), Primary: "db-0"}, later)
	if c.Status.Phase != dbv1.PhaseDegraded {
		t.Errorf("phase = %s after losing a replica, want Degraded", c.Status.Phase)
	}
	if diff := cmp.Diff(&want, dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionBootstrapped)); diff != "" {
		t.Errorf("Bootstrapped changed (-want +got):\n%s", diff)
	}
}

// A blocked failover and the last failover, as the failover controller recorded them on
// the Lease, reach the status.
// A replica the failover controller recorded as not streaming (I6) makes a cluster whose
// pods are all ready Degraded, names the replica and since when, and the condition
// goes back to True once the record is empty.
func TestDecideReplicasStreaming(t *testing.T) {
	since := time.Date(2026, 11, 27, 5, 12, 1, 0, time.UTC)
	o := status.Observed{Cluster: newCluster(wasReady(dbv1.ReasonAllInstancesReady)), Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0",
		Streaming: report.Streaming{"db-2": {Upstream: "db-0", State: agentapi.ReceiverConnecting, Since: since,
			Reason: "not streaming from db-0 for 5.2s: the WAL receiver is connecting"}}}
	st := status.Decide(o, now)
	if st.Phase != dbv1.PhaseDegraded {
		t.Errorf("phase %s, want Degraded", st.Phase)
	}
	ready := dbv1.FindCondition(st.Conditions, dbv1.ConditionReady)
	if ready == nil || ready.Reason != dbv1.ReasonReplicaNotStreaming || !strings.Contains(ready.Message, "db-2 has not streamed from db-0 since 2026-11-27T05:12:01Z") {
		t.Errorf("Ready condition %+v", ready)
	}
	c := dbv1.FindCondition(st.Conditions, dbv1.ConditionReplicasStreaming)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != dbv1.ReasonReplicaNotStreaming ||
		!strings.Contains(c.Message, "db-2 has not streamed from db-0 since 2026-11-27T05:12:01Z (not streaming from db-0 for 5.2s: the WAL receiver is connecting)") {
		t.Errorf("ReplicasStreaming condition %+v", c)
	}
	o.Streaming = nil
	st = status.Decide(o, now)
	if c := dbv1.FindCondition(st.Conditions, dbv1.ConditionReplicasStreaming); st.Phase != dbv1.PhaseHealthy || c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("streaming again: phase %s, condition %+v", st.Phase, c)
	}
	// One instance: no replica, no condition.
	o.Cluster = newCluster(withReplicas(1), wasReady(dbv1.ReasonAllInstancesReady))
	if c := dbv1.FindCondition(status.Decide(o, now).Conditions, dbv1.ConditionReplicasStreaming); c != nil {
		t.Errorf("a single instance has a ReplicasStreaming condition: %+v", c)
	}
}

func TestDecideFailover(t *testing.T) {
	rec := &dbv1.FailoverRecord{From: "db-0", To: "db-1", Time: earlier, Duration: "3.2s", Reason: "the primary db-0's agent does not answer"}
	st := status.Decide(status.Observed{Cluster: newCluster(), Pods: pods("db-1"), Primary: "db-1",
		LastFailover: rec, FailoverBlocked: "no replica is running and answering"}, now)
	if diff := cmp.Diff(rec, st.LastFailover); diff != "" {
		t.Errorf("lastFailover (-want +got):\n%s", diff)
	}
	want := dbv1.Condition{Type: dbv1.ConditionFailoverReady, Status: metav1.ConditionFalse, Reason: dbv1.ReasonFailoverBlocked,
		Message: "no replica is running and answering", ObservedGeneration: generation, LastTransitionTime: now}
	if diff := cmp.Diff(&want, dbv1.FindCondition(st.Conditions, dbv1.ConditionFailoverReady)); diff != "" {
		t.Errorf("FailoverReady (-want +got):\n%s", diff)
	}
}

func TestDecideArchivingAndLastBackup(t *testing.T) {
	withBackup := func(c *dbv1.PostgresCluster) {
		c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "b"}}}
	}
	archiving := func(st dbv1.PostgresClusterStatus) *dbv1.Condition {
		return dbv1.FindCondition(st.Conditions, dbv1.ConditionContinuousArchiving)
	}
	// Not known yet: no condition rather than a guess.
	st := status.Decide(status.Observed{Cluster: newCluster(withBackup), Pods: pods()}, now)
	if c := archiving(st); c != nil {
		t.Errorf("before the first observation: %+v", c)
	}
	st = status.Decide(status.Observed{Cluster: newCluster(withBackup), Pods: pods(), LastBackup: "db-1",
		Archiving: &status.ArchivingHealth{OK: false, Message: "cannot reach the S3 endpoint"}}, now)
	if c := archiving(st); c == nil || c.Status != metav1.ConditionFalse || c.Reason != dbv1.ReasonArchiveFailing ||
		c.Message != "cannot reach the S3 endpoint" {
		t.Errorf("failing: %+v", c)
	}
	if st.LastBackup != "db-1" {
		t.Errorf("lastBackup = %q", st.LastBackup)
	}
	c := newCluster(withBackup, withStatus(st))
	st = status.Decide(status.Observed{Cluster: c, Pods: pods(), Archiving: &status.ArchivingHealth{OK: true, Message: "Last archived"}}, later)
	if c := archiving(st); c == nil || c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Equal(&later) {
		t.Errorf("recovered: %+v", c)
	}
	// spec.backup removed: the condition goes.
	c = newCluster(withStatus(st))
	if got := archiving(status.Decide(status.Observed{Cluster: c, Pods: pods()}, later)); got != nil {
		t.Errorf("without spec.backup: %+v", got)
	}
}

func TestDecidePendingRestart(t *testing.T) {
	cond := func(st dbv1.PostgresClusterStatus) *dbv1.Condition {
		return dbv1.FindCondition(st.Conditions, dbv1.ConditionPendingRestart)
	}
	// Not known yet: no condition rather than a guess.
	if c := cond(status.Decide(status.Observed{Cluster: newCluster(), Pods: pods()}, now)); c != nil {
		t.Errorf("before the first observation: %+v", c)
	}
	for _, tc := range []struct {
		name   string
		record report.PendingRestart
		status metav1.ConditionStatus
		reason string
	}{
		{"nothing waits", report.PendingRestart{Message: "No setting waits for a restart"}, metav1.ConditionFalse, dbv1.ReasonNoRestartNeeded},
		{"rolling", report.PendingRestart{Pending: true, Message: "shared_buffers (128MB → 160MB) waiting for a restart on db-0 (primary); restarting standby db-1",
			Instances: map[string][]string{"db-0": {"shared_buffers: 128MB → 160MB"}}},
			metav1.ConditionTrue, dbv1.ReasonRestartPending},
		{"blocked", report.PendingRestart{Pending: true, Blocked: true, Message: "max_connections is lowered"}, metav1.ConditionTrue, dbv1.ReasonRestartBlocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Decide(status.Observed{Cluster: newCluster(), Pods: pods("db-0", "db-1"), PendingRestart: &tc.record}, now)
			want := dbv1.Condition{Type: dbv1.ConditionPendingRestart, Status: tc.status, Reason: tc.reason, Message: tc.record.Message,
				ObservedGeneration: generation, LastTransitionTime: now}
			if diff := cmp.Diff(&want, cond(st)); diff != "" {
				t.Errorf("PendingRestart (-want +got):\n%s", diff)
			}
			for _, i := range st.Instances {
				if diff := cmp.Diff(tc.record.Instances[i.Name], i.PendingRestart); diff != "" {
					t.Errorf("%s pendingRestart (-want +got):\n%s", i.Name, diff)
				}
			}
		})
	}
}

// A setting postgres rejects is named in its words, per instance.
func TestDecideParametersApplied(t *testing.T) {
	st := status.Decide(status.Observed{Cluster: newCluster(), Pods: pods("db-0", "db-1"),
		PendingRestart: &report.PendingRestart{Message: "No setting waits for a restart"}}, now)
	if c := dbv1.FindCondition(st.Conditions, dbv1.ConditionParametersApplied); c == nil || c.Status != metav1.ConditionTrue || c.Reason != dbv1.ReasonParametersApplied {
		t.Errorf("accepted: %+v", c)
	}
	st = status.Decide(status.Observed{Cluster: newCluster(), Pods: pods("db-0", "db-1"),
		PendingRestart: &report.PendingRestart{Message: "No setting waits for a restart", Rejected: map[string]string{
			"db-1": `invalid value for parameter "work_mem": "lots"`, "db-0": `invalid value for parameter "work_mem": "lots"`}}}, now)
	want := `Settings of spec.postgresql.parameters cannot be used as they are: ` +
		`db-0: invalid value for parameter "work_mem": "lots"; db-1: invalid value for parameter "work_mem": "lots"; fix spec.postgresql.parameters`
	if c := dbv1.FindCondition(st.Conditions, dbv1.ConditionParametersApplied); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != dbv1.ReasonParametersRejected || c.Message != want {
		t.Errorf("rejected: %+v\nwant message %q", c, want)
	}
}

// spec.stopped: the phase and the Hibernated condition follow the failover controller's
// record, and a cluster that was stopped says it runs again.
func TestDecideHibernated(t *testing.T) {
	stopped := func(c *dbv1.PostgresCluster) { c.Spec.Stopped = true }
	record := func(phase string) *primarylease.Hibernation {
		return &primarylease.Hibernation{Phase: phase, Holder: "db-1", Term: 4, FinalLSN: "0/6000028", Timeline: 2}
	}
	for _, tc := range []struct {
		name        string
		cluster     *dbv1.PostgresCluster
		hibernation *primarylease.Hibernation
		pods        []corev1.Pod
		phase       dbv1.Phase
		status      metav1.ConditionStatus
		reason      string // of Hibernated; "" for no condition
	}{
		{"never stopped", newCluster(), nil, pods("db-0", "db-1", "db-2"), dbv1.PhaseHealthy, "", ""},
		{"asked to stop", newCluster(stopped), nil, pods("db-0", "db-1", "db-2"), dbv1.PhaseStopping, metav1.ConditionFalse, dbv1.ReasonStopping},
		{"the primary stopping", newCluster(stopped), record(primarylease.Stopping), pods("db-0", "db-1", "db-2"), dbv1.PhaseStopping, metav1.ConditionFalse, dbv1.ReasonStopping},
		{"stopped", newCluster(stopped), record(primarylease.Stopped), nil, dbv1.PhaseStopped, metav1.ConditionTrue, dbv1.ReasonStopped},
		{"resuming", newCluster(), record(primarylease.Resuming), nil, dbv1.PhaseUnavailable, metav1.ConditionFalse, dbv1.ReasonResuming},
		{"resumed", newCluster(withCondition(dbv1.ConditionHibernated, metav1.ConditionFalse, dbv1.ReasonResuming, "")), nil,
			pods("db-0", "db-1", "db-2"), dbv1.PhaseHealthy, metav1.ConditionFalse, dbv1.ReasonResumed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cluster.Status.Conditions = append(tc.cluster.Status.Conditions, dbv1.Condition{Type: dbv1.ConditionBootstrapped, Status: metav1.ConditionTrue})
			st := status.Decide(status.Observed{Cluster: tc.cluster, Pods: tc.pods, Primary: "db-1", Hibernation: tc.hibernation}, now)
			if st.Phase != tc.phase {
				t.Errorf("phase %s, want %s", st.Phase, tc.phase)
			}
			c := dbv1.FindCondition(st.Conditions, dbv1.ConditionHibernated)
			switch {
			case tc.reason == "" && c != nil:
				t.Errorf("Hibernated %+v on a cluster never stopped", c)
			case tc.reason != "" && (c == nil || c.Status != tc.status || c.Reason != tc.reason):
				t.Errorf("Hibernated %+v, want %s %s", c, tc.status, tc.reason)
			}
		})
	}
}

// status.operatorVersion is the running operator's version: a new operator writes its
// own over the old one's; an Observed without a version (none known) keeps the record.
func TestDecideOperatorVersion(t *testing.T) {
	for _, tc := range []struct {
		name, recorded, running, want string
	}{
		{"first write", "", "0.1.0", "0.1.0"},
		{"same operator", "0.1.0", "0.1.0", "0.1.0"},
		{"after an upgrade", "0.1.0", "0.2.0", "0.2.0"},
		{"no version known", "0.1.0", "", "0.1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(func(c *dbv1.PostgresCluster) { c.Status.OperatorVersion = tc.recorded })
			st := status.Decide(status.Observed{Cluster: c, OperatorVersion: tc.running}, now)
			if st.OperatorVersion != tc.want {
				t.Errorf("operatorVersion %q, want %q", st.OperatorVersion, tc.want)
			}
		})
	}
}

func TestDecideMajorUpgrade(t *testing.T) {
	cluster := newCluster(wasReady(dbv1.ReasonAllInstancesReady))
	cluster.Spec.Version = "17"
	o := status.Observed{Cluster: cluster, Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0"}
	if c := dbv1.FindCondition(status.Decide(o, now).Conditions, dbv1.ConditionMajorUpgrade); c != nil {
		t.Errorf("a cluster never upgraded has a MajorUpgrade condition: %+v", c)
	}
	tests := []struct {
		reason, version string
		want            metav1.ConditionStatus // "" for no condition
		message         string
	}{
		{dbv1.ReasonUpgrading, "17", metav1.ConditionFalse, "PostgreSQL 15 to 17: pg_upgrade --copy"},
		{dbv1.ReasonUpgradeFailed, "17", metav1.ConditionFalse, "PostgreSQL 15 to 17: pg_upgrade --copy"},
		{dbv1.ReasonUpgradeCompleted, "17", metav1.ConditionTrue, "(writes stopped for 4.2 s)"},
		{dbv1.ReasonUpgradeFailed, "15", "", ""}, // spec.version set back
	}
	for _, tc := range tests {
		o.Cluster.Spec.Version = tc.version
		o.Upgrade = &report.Upgrade{From: "15", To: "17", Reason: tc.reason, Message: "pg_upgrade --copy", WritesStoppedMillis: 4200}
		c := dbv1.FindCondition(status.Decide(o, now).Conditions, dbv1.ConditionMajorUpgrade)
		switch {
		case tc.want == "" && c != nil:
			t.Errorf("%s with version %s: condition %+v, want none", tc.reason, tc.version, c)
		case tc.want == "":
		case c == nil || c.Status != tc.want || c.Reason != tc.reason || !strings.Contains(c.Message, tc.message):
			t.Errorf("%s with version %s: condition %+v, want %s with %q", tc.reason, tc.version, c, tc.want, tc.message)
		}
	}
}

// What threatens a bootstrapped cluster is a condition each, False with since when,
// what and what to do; nothing is said of a cluster never yet healthy.
func TestDecideHealth(t *testing.T) {
	since := earlier.Time
	health := report.Health{
		report.HealthConnections:     {Message: "the primary db-0 has 95 client sessions of the 97 it admits (97%): ...", Since: since},
		report.HealthVolume + "db-2": {Message: "db-2's volume is 93% used (70 MiB free): set spec.storage.autoGrow, ...", Since: since},
		report.HealthVolume + "db-1": {Message: "db-1's volume is 91% used (90 MiB free): ...", Since: since},
	}
	st := status.Decide(status.Observed{Cluster: newCluster(wasBootstrapped), Pods: pods("db-0", "db-1", "db-2"), Primary: "db-0", Health: health}, now)
	conn := dbv1.FindCondition(st.Conditions, dbv1.ConditionConnectionsAvailable)
	xid := dbv1.FindCondition(st.Conditions, dbv1.ConditionTransactionIDsSafe)
	vol := dbv1.FindCondition(st.Conditions, dbv1.ConditionVolumeSpace)
	if conn == nil || conn.Status != metav1.ConditionFalse || conn.Reason != dbv1.ReasonConnectionsSaturated ||
		conn.Message != "since 2025-03-04T04:06:07Z: the primary db-0 has 95 client sessions of the 97 it admits (97%): ..." {
		t.Errorf("ConnectionsAvailable %+v", conn)
	}
	if xid == nil || xid.Status != metav1.ConditionTrue {
		t.Errorf("TransactionIDsSafe %+v, want True", xid)
	}
	if vol == nil || vol.Status != metav1.ConditionFalse || vol.Reason != dbv1.ReasonVolumeFillingUp ||
		!strings.HasPrefix(vol.Message, "since 2025-03-04T04:06:07Z: db-1's volume") || !strings.Contains(vol.Message, "; since 2025-03-04T04:06:07Z: db-2's volume") {
		t.Errorf("VolumeSpace %+v, want db-1 then db-2", vol)
	}
	creating := status.Decide(status.Observed{Cluster: newCluster(), Pods: pods("db-0"), Primary: "db-0", Health: health}, now)
	if c := dbv1.FindCondition(creating.Conditions, dbv1.ConditionConnectionsAvailable); c != nil {
		t.Errorf("a cluster never healthy has %+v", c)
	}
}

// status.pooler reports the read-write pool's pods from its Deployment, and says what
// keeps them from serving; nothing without spec.pooler.
func TestPoolerStatus(t *testing.T) {
	withPooler := &dbv1.PostgresCluster{Spec: dbv1.PostgresClusterSpec{Pooler: &dbv1.PoolerSpec{Instances: 2}}}
	withPooler.Name = "db"
	deployment := func(replicas, ready int32, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
		return &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: &replicas},
			Status: appsv1.DeploymentStatus{ReadyReplicas: ready, Conditions: conds}}
	}
	for _, tc := range []struct {
		name    string
		c       *dbv1.PostgresCluster
		d       *appsv1.Deployment
		want    *dbv1.PoolerStatus
		message string
	}{
		{name: "no pooler", c: &dbv1.PostgresCluster{}, d: deployment(2, 2)},
		{name: "not rendered yet", c: withPooler, want: &dbv1.PoolerStatus{Instances: 2}, message: "does not exist yet"},
		{name: "serving", c: withPooler, d: deployment(2, 2), want: &dbv1.PoolerStatus{Instances: 2, ReadyInstances: 2}},
		{name: "one pod not ready", c: withPooler, d: deployment(2, 1), want: &dbv1.PoolerStatus{Instances: 2, ReadyInstances: 1}, message: "1 of 2 pooler pods are ready"},
		{name: "a pod the ReplicaSet cannot create", c: withPooler, d: deployment(2, 1, appsv1.DeploymentCondition{
			Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Message: `pods "db-pooler-rw-x" is forbidden: exceeded quota`}),
			want: &dbv1.PoolerStatus{Instances: 2, ReadyInstances: 1}, message: "exceeded quota"},
	} {
		got := status.Decide(status.Observed{Cluster: tc.c, Pooler: tc.d}, metav1.Now()).Pooler
		if (got == nil) != (tc.want == nil) {
			t.Fatalf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if got == nil {
			continue
		}
		if got.Instances != tc.want.Instances || got.ReadyInstances != tc.want.ReadyInstances ||
			!strings.Contains(got.Message, tc.message) || (tc.message == "") != (got.Message == "") {
			t.Errorf("%s: %+v, want %+v with a message holding %q", tc.name, got, tc.want, tc.message)
		}
	}
}
