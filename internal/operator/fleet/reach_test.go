package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// The process is cut off from the time a question to a ready pod went unanswered until
// any agent answers; a pod the kubelet does not report ready, or a question asked
// before the last answer, says nothing of it.
func TestReachCutOff(t *testing.T) {
	readyPod := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	notReady := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}}}
	deleting := readyPod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}

	var r Reach
	now := time.Now()
	if got := r.CutOff(now); got != 0 {
		t.Fatalf("nothing asked: cut off for %s", got)
	}
	r.Record(notReady, now.Add(-10*time.Second), false)
	r.Record(deleting, now.Add(-10*time.Second), false)
	if got := r.CutOff(now); got != 0 {
		t.Errorf("only pods not ready or being deleted went unanswered: cut off for %s", got)
	}
	r.Record(readyPod, now.Add(-4*time.Second), false)
	r.Record(readyPod, now.Add(-2*time.Second), false)
	if got := r.CutOff(now); got < 4*time.Second || got > 5*time.Second {
		t.Errorf("unanswered since 4 s ago: cut off for %s", got)
	}
	r.Record(notReady, now.Add(-time.Second), true)
	if got := r.CutOff(now); got != 0 {
		t.Errorf("an agent answered: cut off for %s", got)
	}
	// A question asked before that answer, and given up on after it.
	r.Record(readyPod, now.Add(-3*time.Second), false)
	if got := r.CutOff(time.Now()); got != 0 {
		t.Errorf("a question asked before the last answer went unanswered: cut off for %s", got)
	}
}

// Only a timeout or an unreachable host may be a cut; any answer says the path works.
func TestCarried(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{fmt.Errorf("status: %w", &agentapi.HTTPError{StatusCode: 409}), true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{errors.New("tls: failed to verify certificate"), true},
		{fmt.Errorf("get: %w", context.DeadlineExceeded), false},
		{&net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}, false},
		{&net.OpError{Op: "dial", Err: syscall.ENETUNREACH}, false},
	} {
		if got := carried(tc.err); got != tc.want {
			t.Errorf("carried(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
