package fleet

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Reach is what the process knows of whether it reaches the agents at all. An agent
// that does not answer is most often down; but when no agent of any cluster answers
// while the kubelets report their pods ready (their probes reach them), it is this
// process that is cut off from the pods' network, and as the leader it can fail no
// primary over (docs/failover.md, "The operator's own availability", O6). It is safe
// for concurrent use.
type Reach struct {
	mu sync.Mutex
	// answered is when an agent last answered.
	answered time.Time
	// unanswered is when the first question that went unanswered since then was asked
	// of a ready pod; zero when none did.
	unanswered time.Time
}

// reach is the process's: every Fleet records into it.
var reach Reach

// ProcessReach is what every Fleet of the process recorded.
func ProcessReach() *Reach { return &reach }

// carried reports whether the network carried a question that ended with err to the
// agent's node and back: an answer, even an error (a refusal, a certificate the
// operator does not trust, a connection refused), says the path works. Only a timeout,
// or a host or network the kernel reports unreachable, may be a cut.
func carried(err error) bool {
	var answer *agentapi.HTTPError
	var netErr net.Error
	switch {
	case err == nil, errors.As(err, &answer):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return false
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return false
	}
	return true
}

// Record notes a question asked at asked of pod's agent: answered (the network
// carried it) or not.
func (r *Reach) Record(pod *corev1.Pod, asked time.Time, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case answered:
		r.answered, r.unanswered = time.Now(), time.Time{}
	case !ready(pod) || asked.Before(r.answered):
		// The kubelet does not vouch for the agent, or an answer came after this
		// question was asked: it says nothing of this process's reach.
	case r.unanswered.IsZero():
		r.unanswered = asked
	}
}

// CutOff is how long, at now, every question to a ready pod's agent has gone
// unanswered: 0 when an agent answered the last of them, or when none was asked.
func (r *Reach) CutOff(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unanswered.IsZero() {
		return 0
	}
	return now.Sub(r.unanswered)
}

// Answered is when an agent last answered; zero when none did.
func (r *Reach) Answered() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answered
}

// ready reports whether the kubelet reports pod ready and not being deleted.
func ready(pod *corev1.Pod) bool {
	if pod == nil || !pod.DeletionTimestamp.IsZero() {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
