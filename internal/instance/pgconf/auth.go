package pgconf

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// APICredentials are the agent API's credentials as the pod mounts them (the Secret
// <cluster>-agent-auth): control.sha256 and metrics.sha256, the digests of the
// operator's and Prometheus's tokens (a pod never holds the token that controls its
// peers), and peer, the token the cluster's agents call each other with. They are read
// again when older than a few seconds, so a changed Secret takes effect without a
// restart (once the kubelet updated the mounted files).
type APICredentials struct {
	Dir string

	mu      sync.Mutex
	read    time.Time
	digests agentapi.Digests
	peer    string
}

const credentialsMaxAge = 2 * time.Second

func (c *APICredentials) load() {
	if time.Since(c.read) < credentialsMaxAge {
		return
	}
	file := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(c.Dir, name))
		return strings.TrimSpace(string(b))
	}
	c.peer = file(agentapi.FilePeerToken)
	c.digests = agentapi.Digests{}
	for p, name := range map[agentapi.Purpose]string{agentapi.Control: agentapi.FileControlDigest, agentapi.Metrics: agentapi.FileMetricsDigest} {
		if d := file(name); d != "" {
			c.digests[p] = []string{d}
		}
	}
	if c.peer != "" {
		c.digests[agentapi.Peer] = []string{agentapi.Digest(c.peer)}
	}
	c.read = time.Now()
}

// PurposeOf implements agentapi.Credentials.
func (c *APICredentials) PurposeOf(token string) agentapi.Purpose {
	c.mu.Lock()
	c.load()
	d := c.digests
	c.mu.Unlock()
	return d.PurposeOf(token)
}

// PeerToken is the token this agent calls its peers with.
func (c *APICredentials) PeerToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.load()
	return c.peer
}

// Roots are the CAs the other instances' agent API certificates are verified with, read
// at each call (a handshake): the cluster's CA.
func (t TLSFiles) Roots() (*x509.CertPool, error) {
	b, err := os.ReadFile(t.ClientCA())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("no CA certificate in " + t.ClientCA())
	}
	return pool, nil
}
