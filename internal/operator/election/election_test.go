package election

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Only the kubelet's report that the named container has no process is a dead leader:
// a running container, another container's state, or no report at all is not.
func TestStopped(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	terminated := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}}
	waiting := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	pod := func(states map[string]corev1.ContainerState) *corev1.Pod {
		p := &corev1.Pod{}
		for name, s := range states {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: name, State: s})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"running", pod(map[string]corev1.ContainerState{"controller": running}), false},
		{"terminated", pod(map[string]corev1.ContainerState{"controller": terminated}), true},
		{"waiting to restart", pod(map[string]corev1.ContainerState{"controller": waiting}), true},
		{"another container terminated", pod(map[string]corev1.ContainerState{"controller": running, "manager": terminated}), false},
		{"no state reported yet", pod(map[string]corev1.ContainerState{"controller": {}}), false},
		{"no status", pod(nil), false},
	} {
		if got := Stopped(tc.pod, "controller"); (got != "") != tc.want {
			t.Errorf("%s: Stopped = %q, want stopped %v", tc.name, got, tc.want)
		}
	}
}

// A leader steps down once cut off for After, only after MinTenure as the leader, and
// only if an agent answered it since it was elected.
func TestStepDownDue(t *testing.T) {
	elected := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		ledFor   time.Duration
		cutOff   time.Duration
		answered time.Time
		want     bool
	}{
		{"reaches the agents", time.Hour, 0, elected.Add(time.Minute), false},
		{"cut off briefly", time.Hour, 2 * time.Second, elected.Add(time.Minute), false},
		{"cut off for After", time.Hour, 3 * time.Second, elected.Add(time.Minute), true},
		{"cut off, but just elected", 10 * time.Second, 3 * time.Second, elected.Add(time.Second), false},
		{"cut off, led for MinTenure", 20 * time.Second, 5 * time.Second, elected.Add(time.Second), true},
		{"cut off, never answered as the leader", time.Hour, time.Hour, elected.Add(-time.Second), false},
		{"cut off, never answered at all", time.Hour, time.Hour, time.Time{}, false},
	} {
		s := &StepDown{After: 3 * time.Second, MinTenure: 20 * time.Second,
			CutOff:   func(time.Time) time.Duration { return tc.cutOff },
			Answered: func() time.Time { return tc.answered }}
		if got := s.due(elected, elected.Add(tc.ledFor)); got != tc.want {
			t.Errorf("%s: due = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A container that started after its pod took the Lease runs a process that did not.
func TestRestarted(t *testing.T) {
	acquired := time.Date(2026, 11, 29, 12, 0, 0, 500_000_000, time.UTC)
	pod := func(started time.Time) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: "controller", RestartCount: 1,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}},
		}}}}
	}
	for _, tc := range []struct {
		name    string
		started time.Time
		want    bool
	}{
		{"started before it took the Lease", acquired.Add(-time.Minute), false},
		{"started again after", acquired.Add(3 * time.Second), true},
		// The start time is in whole seconds: within the second it is missed.
		{"started again within the second", acquired.Truncate(time.Second), false},
	} {
		if got := Restarted(pod(tc.started), "controller", acquired); (got != "") != tc.want {
			t.Errorf("%s: Restarted = %q, want %v", tc.name, got, tc.want)
		}
	}
	if got := Restarted(pod(acquired.Add(time.Minute)), "manager", acquired); got != "" {
		t.Errorf("another container's start: Restarted = %q", got)
	}
}
