// Package fleet is the operator's one client of a cluster's agents: it finds each
// instance pod's agent, reads the agents' token, and observes them all at once.
package fleet

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/agentapi"
	"github.com/pgpilot/pgpilot/internal/controller/credentials"
)

// Fleet reaches the agents of every cluster. It is safe for concurrent use.
type Fleet struct {
	reader   client.Reader
	http     *http.Client
	agentURL func(pod *corev1.Pod) string
}

// New returns a Fleet reading Secrets through r. agentURL nil means
// http://<pod IP>:8008.
func New(r client.Reader, agentURL func(*corev1.Pod) string) *Fleet {
	if agentURL == nil {
		agentURL = func(p *corev1.Pod) string { return agentapi.BaseURL(p.Status.PodIP) }
	}
	return &Fleet{reader: r, agentURL: agentURL,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}}}
}

// Token is the cluster's agent API token.
func (f *Fleet) Token(ctx context.Context, c *dbv1.PostgresCluster) (string, error) {
	var s corev1.Secret
	if err := f.reader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.AgentTokenSecretName()}, &s); err != nil {
		return "", err
	}
	return string(s.Data[credentials.KeyToken]), nil
}

// Client is a client of pod's agent.
func (f *Fleet) Client(pod *corev1.Pod, token string) *agentapi.Client {
	return agentapi.NewClient(f.agentURL(pod), token, f.http)
}

// Instance is one instance pod as last observed.
type Instance struct {
	Name string
	// Pod is nil for an instance that has no pod.
	Pod *corev1.Pod
	// Terminating: the pod is being deleted.
	Terminating bool
	// Reachable is whether its agent answered /status.
	Reachable bool
	// Status is what its agent answered; valid when Reachable.
	Status agentapi.Status
}

// TerminatingTimeout bounds the status call to a pod being deleted.
const TerminatingTimeout = 300 * time.Millisecond

// Observe asks every pod's agent but those named in except for its status, all at
// once, each within timeout; a pod being deleted within TerminatingTimeout at most:
// once its address is gone, a question to it waits for the whole timeout, and so would
// the decision that needs the others' answers. A pod not asked, or not answering, is
// reported unreachable.
func (f *Fleet) Observe(ctx context.Context, pods []corev1.Pod, token string, timeout time.Duration, except ...string) []Instance {
	out := make([]Instance, len(pods))
	var wg sync.WaitGroup
	for i := range pods {
		p := &pods[i]
		out[i] = Instance{Name: p.Name, Pod: p, Terminating: !p.DeletionTimestamp.IsZero()}
		if p.Status.PodIP == "" || slices.Contains(except, p.Name) {
			continue
		}
		wg.Add(1)
		go func(in *Instance) {
			defer wg.Done()
			t := timeout
			if in.Terminating {
				t = min(t, TerminatingTimeout)
			}
			sctx, cancel := context.WithTimeout(ctx, t)
			defer cancel()
			st, err := f.Client(in.Pod, token).Status(sctx)
			if err == nil {
				in.Reachable, in.Status = true, st
			}
		}(&out[i])
	}
	wg.Wait()
	return out
}
