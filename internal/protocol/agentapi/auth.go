package agentapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// Purpose is what a credential of the agent API is for. Each endpoint names the
// purposes it serves; a credential opens nothing else.
type Purpose string

const (
	// Control is the operator's: every call, promote, fence, demote, freeze, restart
	// and the backup calls included.
	Control Purpose = "control"
	// Peer is the other agents' of the cluster: /status and the failsafe /confirm.
	Peer Purpose = "peer"
	// Metrics is Prometheus's, read-only: /metrics and /status.
	Metrics Purpose = "metrics"
)

// Keys of the Secret <cluster>-agent-auth, files where the instance pods mount it: the
// digests of the operator's and Prometheus's tokens, and the agents' own token.
const (
	FileControlDigest = "control.sha256"
	FileMetricsDigest = "metrics.sha256"
	FilePeerToken     = "peer"
	// FilePeerDigest is the digest of the peers' token: the pooler's pods, which check
	// a primary's pause, mount it and not the token.
	FilePeerDigest = "peer.sha256"
)

// Credentials tell which purpose a bearer token was given for.
type Credentials interface {
	// PurposeOf returns the purpose of token, or "" when it has none.
	PurposeOf(token string) Purpose
}

// Digest is the hex SHA-256 of a token: what an agent keeps of the operator's and
// Prometheus's tokens, so that a pod's files do not hold the credentials that control
// its peers.
func Digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Digests are Credentials from the hex SHA-256 digests of each purpose's tokens.
type Digests map[Purpose][]string

// PurposeOf implements Credentials. Every digest is compared, in constant time, so the
// answer's timing says nothing of which matched.
func (d Digests) PurposeOf(token string) Purpose {
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	var found Purpose
	for _, p := range []Purpose{Control, Peer, Metrics} {
		for _, h := range d[p] {
			want, err := hex.DecodeString(strings.TrimSpace(h))
			if err == nil && subtle.ConstantTimeCompare(sum[:], want) == 1 {
				found = p
			}
		}
	}
	return found
}

// Tokens are Credentials from the tokens themselves (tests, and a Server given only
// ServerOptions.Token).
func Tokens(tokens map[Purpose]string) Digests {
	d := Digests{}
	for p, t := range tokens {
		if t != "" {
			d[p] = append(d[p], Digest(t))
		}
	}
	return d
}

// authorize is Authorize with the server's credentials.
func (s *Server) authorize(r *http.Request, allowed ...Purpose) (int, string) {
	return Authorize(s.creds, r, allowed...)
}

// Authorize checks the request's bearer token against the purposes allowed. It returns
// 200, or the status code to answer with and a reason that is safe to log and to send
// (it never contains the token).
func Authorize(creds Credentials, r *http.Request, allowed ...Purpose) (int, string) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return http.StatusUnauthorized, "missing bearer token"
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return http.StatusUnauthorized, "authorization is not a bearer token"
	}
	purpose := creds.PurposeOf(strings.TrimLeft(token, " "))
	switch {
	case purpose == "":
		return http.StatusUnauthorized, "wrong bearer token"
	case !slices.Contains(allowed, purpose):
		return http.StatusForbidden, "a " + string(purpose) + " token cannot make this call"
	}
	return http.StatusOK, ""
}

// guarded serves h to the purposes allowed only, answering others 401 or 403.
func (s *Server) guarded(h http.Handler, allowed ...Purpose) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, reason := s.authorize(r, allowed...); code != http.StatusOK {
			// Read-only paths are called every few seconds by a misconfigured scraper.
			s.refuse(w, r, s.log.V(1).WithValues("remoteAddr", r.RemoteAddr), code, reason)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// refuse answers an unauthorised call and logs it to log.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, log logr.Logger, code int, reason string) {
	log.Info("Refused unauthorised call", "result", reason, "code", code, "path", r.URL.Path)
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", "Bearer")
	}
	writeJSONError(w, code, reason)
}

// ClientTLS is the TLS configuration of a client of the agent whose certificate must be
// valid for serverName, verified with the CAs roots returns at each handshake (so that
// a renewed CA file is used without a restart).
func ClientTLS(serverName string, roots func() (*x509.CertPool, error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// Not skipped: VerifyConnection verifies the chain and the name, against the
		// roots of the moment, which RootCAs cannot give.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			pool, err := roots()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the agent sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: serverName, Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	}
}

// HTTPClients keeps one HTTP client per agent, each verifying its agent's name, so that
// connections to it are reused. A client not asked for in unusedAfter is dropped, its
// idle connections closed: the agents of deleted pods and clusters, or of a CA since
// replaced, are not kept for the life of the process.
type HTTPClients struct {
	mu      sync.Mutex
	clients map[string]*keptClient
	swept   time.Time
	// now is time.Now but in tests.
	now func() time.Time
}

type keptClient struct {
	client *http.Client
	used   time.Time
}

// IdleConnTimeout is how long a connection to an agent is kept unused: longer than a
// settled cluster's holder goes unasked (5 s), shorter than its standbys do (30 s, the
// failover controller's quiet cycles), whose connections would otherwise be kept for
// a question every 30 s: at 1,000 clusters, 2,000 connections, each two goroutines and
// its buffers (about 40 KB), for 67 TLS handshakes a second.
const IdleConnTimeout = 15 * time.Second

// unusedAfter is how long a client is kept without being asked for: well above every
// poll period, so that a client in use is never dropped.
const unusedAfter = 10 * time.Minute

// For returns the client of the agent named serverName, verified with roots; key tells
// clients with other roots apart (a digest of them).
func (h *HTTPClients) For(serverName, key string, roots func() (*x509.CertPool, error)) *http.Client {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if h.now != nil {
		now = h.now()
	}
	if h.clients == nil {
		h.clients = map[string]*keptClient{}
	}
	h.sweep(now)
	k := serverName + "|" + key
	if c, ok := h.clients[k]; ok {
		c.used = now
		return c.client
	}
	c := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     ClientTLS(serverName, roots),
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     IdleConnTimeout,
		TLSHandshakeTimeout: 5 * time.Second,
		// A request is a few hundred bytes and an answer a few KB: the 4 KB
		// defaults were 25 MB of buffers kept for 3,000 connections.
		WriteBufferSize: 1 << 10,
		ReadBufferSize:  2 << 10,
	}}
	h.clients[k] = &keptClient{client: c, used: now}
	return c
}

// Len is how many clients are kept.
func (h *HTTPClients) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clients)
}

// sweep drops the clients unused for unusedAfter, once a minute at most; h.mu held.
func (h *HTTPClients) sweep(now time.Time) {
	if now.Sub(h.swept) < time.Minute {
		return
	}
	h.swept = now
	for k, c := range h.clients {
		if now.Sub(c.used) >= unusedAfter {
			c.client.CloseIdleConnections()
			delete(h.clients, k)
		}
	}
}
