package integration

import (
	"context"
	"flag"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// A controller container killed while it leads restarts in the same pod. With the pod's
// name as its identity it takes its Lease back at once; any other candidate waits for
// the Lease to expire (15 s), and every failover in the cluster waits with it.
func TestRestartedLeaderResumesAtOnce(t *testing.T) {
	ns := newNamespace(t)
	const id = "pgpilot-leader-test"
	// The Lease as the killed container left it: held by the pod, renewed just now.
	heldLease(t, ns, id, "pgpilot-controller-manager-0", 15)
	t.Setenv(managerflags.PodNamespaceEnv, ns)

	// Another pod must not take over a Lease that is still valid.
	if elected(t, running(t, candidate(t, id, "pgpilot-controller-manager-1")), 3*time.Second) {
		t.Fatal("another pod took over a Lease renewed 3 s ago, valid for 15 s")
	}
	// The holder's restarted container resumes long before the Lease expires.
	if !elected(t, running(t, candidate(t, id, "pgpilot-controller-manager-0")), 8*time.Second) {
		t.Fatal("the restarted leader was not elected within 8 s of a Lease renewed by its pod: it waited for its own Lease to expire")
	}
}

// The other replica takes over from a leader that died (its Lease no longer renewed)
// once the Lease expires, LeaseDuration after the last renewal it saw, and not before.
func TestStandbyTakesOverAnExpiredLease(t *testing.T) {
	ns := newNamespace(t)
	const id = "pgpilot-standby-test"
	e := managerflags.FailoverElection
	renewed := heldLease(t, ns, id, "pgpilot-controller-manager-0", int32(e.LeaseDuration/time.Second))
	t.Setenv(managerflags.PodNamespaceEnv, ns)

	mgr := running(t, candidate(t, id, "pgpilot-controller-manager-1"))
	if elected(t, mgr, e.LeaseDuration-2*time.Second) {
		t.Fatalf("the standby took over a Lease renewed %s ago, valid for %s", time.Since(renewed).Round(100*time.Millisecond), e.LeaseDuration)
	}
	// From the last renewal: the Lease's duration, a retry period (jittered), and the
	// API server's answer.
	limit := e.LeaseDuration + 2*e.RetryPeriod + time.Second
	if !elected(t, mgr, time.Until(renewed.Add(limit))) {
		t.Fatalf("the standby was not elected within %s of the dead leader's last renewal", limit)
	}
	t.Logf("elected %s after the last renewal", time.Since(renewed).Round(10*time.Millisecond))
}

// A leader that stops (SIGTERM: a rollout, a drain, an upgrade) releases its Lease, and
// the waiting replica takes over within a retry period instead of waiting for it to
// expire.
func TestStoppedLeaderHandsOverAtOnce(t *testing.T) {
	ns := newNamespace(t)
	const id = "pgpilot-handover-test"
	t.Setenv(managerflags.PodNamespaceEnv, ns)
	e := managerflags.FailoverElection

	leader := candidate(t, id, "pgpilot-controller-manager-0")
	stop := start(t, leader)
	t.Cleanup(stop)
	if !elected(t, leader, 10*time.Second) {
		t.Fatal("the first replica was not elected")
	}
	standby := running(t, candidate(t, id, "pgpilot-controller-manager-1"))
	if elected(t, standby, 2*time.Second) {
		t.Fatal("the standby was elected while the leader ran")
	}
	stopped := time.Now()
	stop()
	limit := 2*e.RetryPeriod + time.Second
	if !elected(t, standby, limit-time.Since(stopped)) {
		t.Fatalf("the standby was not elected within %s of the leader's stop: the leader did not release its Lease", limit)
	}
	t.Logf("elected %s after the leader stopped", time.Since(stopped).Round(10*time.Millisecond))
}

// A standby takes over as soon as the kubelet reports that the leader's process has
// exited: its container not running (killed, crashed, waiting to restart), or running
// again since the Lease was taken (the process that took it is gone, and the one that
// runs now has not led); not while the process that took the Lease runs. It does so
// with the operator's own RBAC, in the operator's namespace.
func TestStandbyTakesOverFromAStoppedContainer(t *testing.T) {
	for name, exited := range map[string]func(acquired time.Time) corev1.ContainerState{
		"terminated": func(time.Time) corev1.ContainerState {
			return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}
		},
		"restarted": func(acquired time.Time) corev1.ContainerState {
			return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(acquired.Add(2 * time.Second))}}
		},
	} {
		t.Run(name, func(t *testing.T) { takeOverFromExited(t, name, exited) })
	}
}

func takeOverFromExited(t *testing.T, name string, exited func(acquired time.Time) corev1.ContainerState) {
	ns := devenv.OperatorNamespace
	id := "pgpilot-dead-leader-" + name
	leader, identity := id+"-0", id+"-1"
	t.Setenv(managerflags.PodNamespaceEnv, ns)
	// A Lease valid for long: only the container's state can let the standby in early.
	acquired := heldLease(t, ns, id, leader, 60)
	create(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leader},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "controller", Image: "controller:latest", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			}}},
		},
	})
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leader}}, client.GracePeriodSeconds(0))
		_ = k8s.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}})
	})
	containerState(t, ns, leader, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(acquired.Add(-time.Minute))}})

	standby := candidateAs(t, operatorCfg, id, identity)
	var f managerflags.Flags
	f.LeaderElect, f.Identity, f.LeaderElectionID, f.RetryPeriod = true, identity, id, managerflags.FailoverElection.RetryPeriod
	dead, err := f.DeadLeader(standby, "controller")
	if err != nil || dead == nil {
		t.Fatalf("no dead leader runnable: %v", err)
	}
	if err := standby.Add(dead); err != nil {
		t.Fatal(err)
	}
	running(t, standby)
	if elected(t, standby, 3*time.Second) {
		t.Fatal("the standby took over from a leader whose container runs, with its Lease valid")
	}
	reported := time.Now()
	containerState(t, ns, leader, exited(acquired))
	e := managerflags.FailoverElection
	limit := 3*e.RetryPeriod + time.Second
	if !elected(t, standby, limit) {
		t.Fatalf("the standby was not elected within %s of the kubelet's report that the leader's process exited", limit)
	}
	t.Logf("elected %s after the kubelet's report", time.Since(reported).Round(10*time.Millisecond))
}

// containerState sets the state of the pod's container "controller" as the kubelet would.
func containerState(t *testing.T, ns, name string, state corev1.ContainerState) {
	t.Helper()
	var pod corev1.Pod
	if err := get(ns, name, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "controller", Image: "controller:latest", State: state}}
	if err := k8s.Status().Update(context.Background(), &pod); err != nil {
		t.Fatal(err)
	}
}

// heldLease creates the leader election Lease id as its holder left it, renewed now,
// and returns when.
func heldLease(t *testing.T, ns, id, holder string, seconds int32) time.Time {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	create(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](seconds),
			AcquireTime: &now, RenewTime: &now,
		},
	})
	return now.Time
}

// candidate is a manager with the controller's flags and election, as the pod identity
// would run it.
func candidate(t *testing.T, id, identity string) manager.Manager {
	t.Helper()
	return candidateAs(t, cfg, id, identity)
}

// candidateAs is candidate talking to the API server with as.
func candidateAs(t *testing.T, as *rest.Config, id, identity string) manager.Manager {
	t.Helper()
	t.Setenv(managerflags.PodNameEnv, identity)
	var f managerflags.Flags
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	f.Register(fs, "0", "0", id, managerflags.FailoverElection)
	if err := fs.Parse([]string{"--leader-elect"}); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	opts, err := f.Options(scheme, as)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(as, opts)
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

// running starts mgr until the test ends, and returns it.
func running(t *testing.T, mgr manager.Manager) manager.Manager {
	t.Cleanup(start(t, mgr))
	return mgr
}

// start runs mgr until the returned function is called (at most once; later calls do
// nothing), which waits until it has stopped.
func start(t *testing.T, mgr manager.Manager) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
}

// elected reports whether mgr is elected within d.
func elected(t *testing.T, mgr manager.Manager, d time.Duration) bool {
	t.Helper()
	select {
	case <-mgr.Elected():
		return true
	case <-time.After(d):
		return false
	}
}
