package agentapi

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// MountedCredentials are the agent API's credentials as the pod mounts them (the Secret
// <cluster>-agent-auth): control.sha256 and metrics.sha256, the digests of the
// operator's and Prometheus's tokens (a pod never holds the token that controls its
// peers), and peer, the token the cluster's agents call each other with. They are read
// again when older than a few seconds, so a changed Secret takes effect without a
// restart (once the kubelet updated the mounted files).
type MountedCredentials struct {
	Dir string

	mu      sync.Mutex
	read    time.Time
	digests Digests
	peer    string
}

const credentialsMaxAge = 2 * time.Second

func (c *MountedCredentials) load() {
	if time.Since(c.read) < credentialsMaxAge {
		return
	}
	file := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(c.Dir, name))
		return strings.TrimSpace(string(b))
	}
	c.peer = file(FilePeerToken)
	c.digests = Digests{}
	for p, name := range map[Purpose]string{Control: FileControlDigest, Metrics: FileMetricsDigest} {
		if d := file(name); d != "" {
			c.digests[p] = []string{d}
		}
	}
	switch d := file(FilePeerDigest); {
	case c.peer != "":
		c.digests[Peer] = []string{Digest(c.peer)}
	case d != "":
		// Mounted without the token (the pooler's pods): peers' calls are checked, and
		// none can be made.
		c.digests[Peer] = []string{d}
	}
	c.read = time.Now()
}

// PurposeOf implements Credentials.
func (c *MountedCredentials) PurposeOf(token string) Purpose {
	c.mu.Lock()
	c.load()
	d := c.digests
	c.mu.Unlock()
	return d.PurposeOf(token)
}

// PeerToken is the token this agent calls its peers with.
func (c *MountedCredentials) PeerToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.load()
	return c.peer
}
