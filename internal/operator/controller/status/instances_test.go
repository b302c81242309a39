package status_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/status"
)

func createdAt(t time.Time) podOption {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

func unschedulable(since time.Time, message string) podOption {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodScheduled {
				p.Status.Conditions[i] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
					Reason: "Unschedulable", Message: message, LastTransitionTime: metav1.NewTime(since)}
			}
		}
	}
}

func lastExited(container string, code int32, reason, message string) podOption {
	return func(p *corev1.Pod) {
		for i := range p.Status.ContainerStatuses {
			if p.Status.ContainerStatuses[i].Name == container {
				p.Status.ContainerStatuses[i].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{
					ExitCode: code, Reason: reason, Message: message}
			}
		}
	}
}

func memoryLimit(container, limit string) podOption {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: container,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}}})
	}
}

// What a pod, the kubelet and the scheduler say of an instance that does not run
// becomes one sentence; what is also part of a normal start is told only once it has
// lasted.
func TestPodProblem(t *testing.T) {
	start := now.Add(-time.Minute)
	cases := []struct {
		name string
		pod  corev1.Pod
		want status.Problem
	}{
		{"ready", newPod("db-0", ready), status.Problem{}},
		{"starting, nothing said", newPod("db-0"), status.Problem{}},
		{"no node for it", newPod("db-0", unschedulable(start, "0/1 nodes are available: 1 Insufficient memory.")),
			status.Problem{Message: "cannot be scheduled (Unschedulable): 0/1 nodes are available: 1 Insufficient memory."}},
		{"its volume claim does not exist", newPod("db-0", unschedulable(start, `persistentvolumeclaim "backups" not found`)),
			status.Problem{Message: `cannot be scheduled (Unschedulable): persistentvolumeclaim "backups" not found`}},
		{"waiting for its volume to be provisioned, a moment ago", newPod("db-0",
			unschedulable(now.Add(-5*time.Second), "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.")),
			status.Problem{}},
		{"killed for memory, again and again", newPod("db-0", memoryLimit("postgres", "20Mi"),
			waiting(false, "postgres", "pg:15", "CrashLoopBackOff", "back-off 40s restarting failed container"),
			lastExited("postgres", 137, "OOMKilled", "")),
			status.Problem{Message: "keeps exiting: its postgres container last exited with code 137 (OOMKilled): it was killed for memory; " +
				"its memory limit is 20Mi: raise spec.resources.limits.memory, or lower shared_buffers and work_mem"}},
		{"exits with its last words", newPod("db-0",
			waiting(false, "postgres", "pg:15", "CrashLoopBackOff", "back-off 10s"),
			lastExited("postgres", 1, "Error", "starting\nagent: reading the cluster configuration: no such file")),
			status.Problem{Message: "keeps exiting: its postgres container last exited with code 1 (Error): agent: reading the cluster configuration: no such file"}},
		{"a Secret it needs is missing", newPod("db-0", createdAt(start),
			waiting(false, "postgres", "pg:15", "CreateContainerConfigError", `secret "db-app" not found`)),
			status.Problem{Message: `cannot start its postgres container (CreateContainerConfigError: secret "db-app" not found)`}},
		{"a Secret it needs is missing, a moment after the pod was made", newPod("db-0", createdAt(now.Add(-time.Second)),
			waiting(false, "postgres", "pg:15", "CreateContainerConfigError", `secret "db-app" not found`)),
			status.Problem{}},
		{"an image that cannot be pulled, in an init container", newPod("db-0",
			waiting(true, "install-agent", "pgpilot:nope", "ImagePullBackOff", "Back-off pulling image")),
			status.Problem{Image: true, Message: `cannot pull the image "pgpilot:nope" of its install-agent container (ImagePullBackOff: Back-off pulling image)`}},
		{"evicted", newPod("db-0", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: ephemeral-storage."
		}), status.Problem{Message: "failed (Evicted): The node was low on resource: ephemeral-storage."}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, status.PodProblem(&tc.pod, now.Time)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// An instance's pod speaks first; its agent's error is told for a pod that says nothing
// and is not ready; an instance without a pod is told the StatefulSet's reason.
func TestInstanceProblems(t *testing.T) {
	c := newCluster()
	ps := []corev1.Pod{
		newPod("db-0", ready),
		newPod("db-1", waiting(false, "postgres", "pg:15", "CrashLoopBackOff", "back-off 10s")),
	}
	agents := map[string]string{"db-0": "an old error of a ready instance", "db-1": "cloning from db-0: connection refused"}
	got := status.InstanceProblems(c, ps, agents, `pods "db-2" is forbidden: exceeded quota: pods`, now.Time)
	want := map[string]status.Problem{
		"db-1": {Message: "keeps exiting: its postgres container is in CrashLoopBackOff"},
		"db-2": {Message: `has no pod: the StatefulSet cannot create it: pods "db-2" is forbidden: exceeded quota: pods`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	ps[1] = newPod("db-1")
	if got := status.InstanceProblems(c, ps, agents, "", now.Time)["db-1"].Message; got != "reports: cloning from db-0: connection refused" {
		t.Errorf("db-1: %q, want its agent's error", got)
	}
}

// An instance's problem is told once when it begins or changes, and its end once it is
// ready again.
func TestInstanceEvents(t *testing.T) {
	before := []dbv1.InstanceStatus{
		{Name: "db-0", Ready: true},
		{Name: "db-1", Message: "cannot be scheduled (Unschedulable): no node"},
		{Name: "db-2", Message: "keeps exiting: its postgres container is in CrashLoopBackOff"},
		{Name: "db-3", Message: "reports: cloning"},
	}
	after := []dbv1.InstanceStatus{
		{Name: "db-0", Message: "reports: postgres exited while starting"},
		{Name: "db-1", Message: "cannot be scheduled (Unschedulable): no node"},
		{Name: "db-2", Ready: true},
		{Name: "db-3"}, // no longer says why, but not ready either
	}
	want := []status.InstanceEvent{
		{Type: corev1.EventTypeWarning, Reason: dbv1.ReasonInstanceNotRunning, Message: "db-0 reports: postgres exited while starting"},
		{Type: corev1.EventTypeNormal, Reason: dbv1.ReasonInstanceRunning, Message: "db-2 runs again"},
	}
	if diff := cmp.Diff(want, status.InstanceEvents(before, after)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := status.InstanceEvents(after, after); len(got) != 0 {
		t.Errorf("no change, events %v", got)
	}
}
