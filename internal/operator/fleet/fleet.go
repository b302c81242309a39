// Package fleet is the operator's one client of a cluster's agents: it finds each
// instance pod's agent, reads the operator's token and the cluster's CA, calls each agent
// over TLS verifying its name, and observes them all at once.
package fleet

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Fleet reaches the agents of every cluster. It is safe for concurrent use.
type Fleet struct {
	reader   client.Reader
	clients  *agentapi.HTTPClients
	agentURL func(pod *corev1.Pod) string
}

// connections are the HTTP clients of every Fleet of the process: one per agent (by its
// name and the CA that verifies it), whichever controller asks. Each controller had
// its own, and so its own kept-alive TLS connection to every agent it asks (the
// failover, restart and roles controllers ask every cluster's): 2,300 connections and
// 4,700 goroutines for 320 clusters.
var connections agentapi.HTTPClients

// New returns a Fleet reading Secrets through r. agentURL nil means
// https://<pod IP>:8008.
func New(r client.Reader, agentURL func(*corev1.Pod) string) *Fleet {
	if agentURL == nil {
		agentURL = func(p *corev1.Pod) string { return agentapi.BaseURL(p.Status.PodIP) }
	}
	return &Fleet{reader: r, agentURL: agentURL, clients: &connections}
}

// Access is what calling a cluster's agents takes: the operator's token, and the
// cluster's CA, which every agent's certificate must chain to for its pod's name.
type Access struct {
	token    string
	headless string
	roots    *x509.CertPool
	// key tells CAs apart: a client made for another CA is not reused.
	key string
}

// Access reads the operator's token (Secret <cluster>-agent) and the cluster's CA
// (Secret <cluster>-ca); both are made by the controller.
func (f *Fleet) Access(ctx context.Context, c *dbv1.PostgresCluster) (Access, error) {
	n := c.Names()
	var token, ca corev1.Secret
	if err := f.reader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: n.AgentTokenSecret()}, &token); err != nil {
		return Access{}, err
	}
	if err := f.reader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: n.CASecret()}, &ca); err != nil {
		return Access{}, err
	}
	sum := sha256.Sum256(ca.Data["ca.crt"])
	roots, err := pools.parse(sum, ca.Data["ca.crt"])
	if err != nil {
		return Access{}, fmt.Errorf("the CA Secret %s: %w", n.CASecret(), err)
	}
	return Access{
		token:    string(token.Data[secrets.KeyToken]),
		headless: n.HeadlessService() + "." + c.Namespace + ".svc",
		roots:    roots,
		key:      hex.EncodeToString(sum[:8]),
	}, nil
}

// pools are the CAs of every cluster, parsed: each cycle of every controller that calls
// a cluster's agents needs its CA, and parsing it again each time was 5 % of what the
// controller allocated at 1,000 clusters.
var pools caPools

// caPools are parsed CA bundles by the SHA-256 of their PEM. A bundle not asked for in
// ten minutes (a deleted cluster's, a replaced CA) is dropped.
type caPools struct {
	mu    sync.Mutex
	pools map[[sha256.Size]byte]*caPool
	swept time.Time
}

type caPool struct {
	pool *x509.CertPool
	used time.Time
}

func (p *caPools) parse(sum [sha256.Size]byte, pem []byte) (*x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.pools == nil {
		p.pools = map[[sha256.Size]byte]*caPool{}
	}
	if now.Sub(p.swept) >= time.Minute {
		p.swept = now
		for k, c := range p.pools {
			if now.Sub(c.used) >= 10*time.Minute {
				delete(p.pools, k)
			}
		}
	}
	if c, ok := p.pools[sum]; ok {
		c.used = now
		return c.pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no certificate in ca.crt")
	}
	p.pools[sum] = &caPool{pool: pool, used: now}
	return pool, nil
}

// Client is a client of pod's agent: its certificate is verified for the pod's name
// behind the headless Service.
func (f *Fleet) Client(pod *corev1.Pod, a Access) *agentapi.Client {
	roots := a.roots
	http := f.clients.For(pod.Name+"."+a.headless, a.key, func() (*x509.CertPool, error) { return roots, nil })
	return agentapi.NewClient(f.agentURL(pod), a.token, http)
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
func (f *Fleet) Observe(ctx context.Context, pods []corev1.Pod, access Access, timeout time.Duration, except ...string) []Instance {
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
			asked := time.Now()
			st, err := f.Client(in.Pod, access).Status(sctx)
			if err == nil {
				in.Reachable, in.Status = true, st
			}
			if ctx.Err() == nil { // a question this process gave up on says nothing of its reach
				reach.Record(in.Pod, asked, carried(err))
			}
		}(&out[i])
	}
	wg.Wait()
	return out
}
