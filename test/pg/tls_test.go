package pg

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// tlsDir is what the pods mount under /etc/pgpilot/tls: server/ and replication/.
func (c *cluster) tlsDir() string { return filepath.Join(c.dir, "tls") }

// issueTLS makes the cluster's certificates as the controller does (tests that drive
// agents without the operator): a CA, the server certificate for the cluster's names,
// the replication role's client certificate.
func (c *cluster) issueTLS() {
	c.t.Helper()
	ca, err := pki.NewCA(c.name+" test CA", time.Now(), 0)
	if err != nil {
		c.t.Fatal(err)
	}
	c.ca, c.caPEM = ca, ca.CertPEM
	server := c.issue(certificates.ServerRequest(c.object()))
	c.writeTLS("server", server, ca.CertPEM)
	c.writeTLS("instance", server, ca.CertPEM)
	c.writeTLS("replication", c.issue(certificates.ReplicationRequest()), ca.CertPEM)
}

// object is the PostgresCluster the test cluster stands for.
func (c *cluster) object() *dbv1.PostgresCluster {
	return &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: c.namespace}}
}

func (c *cluster) issue(req pki.Request) *pki.KeyPair {
	c.t.Helper()
	leaf, err := pki.Issue(c.ca, req, time.Now())
	if err != nil {
		c.t.Fatal(err)
	}
	return leaf
}

// writeTLS writes one mounted certificate Secret, as the kubelet does: the files of a
// Secret volume belong to root and others may read them here (the agent copies them).
func (c *cluster) writeTLS(dir string, leaf *pki.KeyPair, ca []byte) {
	c.t.Helper()
	d := filepath.Join(c.tlsDir(), dir)
	mustMkdir(c.t, d, 0o755)
	for name, b := range map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM, "ca.crt": ca} {
		tmp := filepath.Join(d, "."+name)
		mustWrite(c.t, tmp, b)
		if err := os.Rename(tmp, filepath.Join(d, name)); err != nil {
			c.t.Fatal(err)
		}
	}
}

// writeAuth writes the agent API's credentials, as the pods mount <cluster>-agent-auth.
func (c *cluster) writeAuth(files map[string][]byte) {
	c.t.Helper()
	dir := filepath.Join(c.dir, "auth")
	mustMkdir(c.t, dir, 0o755)
	for name, b := range files {
		mustWrite(c.t, filepath.Join(dir, name), b)
	}
}

// agentHTTP is an HTTP client of pod's agent API, verified as the operator does.
func (c *cluster) agentHTTP(pod string) *http.Client {
	return testutil.AgentHTTP(pod+"."+dbv1.NamesOf(c.name).HeadlessService()+"."+c.namespace+".svc", c.caPEM)
}

// mountTLS writes the certificates and agent API credentials the operator made
// (operated clusters).
func (c *cluster) mountTLS() {
	c.t.Helper()
	names := dbv1.NamesOf(c.name)
	get := func(name string, s *corev1.Secret) {
		testutil.Eventually(c.t, time.Minute, func() error {
			return k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: name}, s)
		})
	}
	var auth, ca corev1.Secret
	get(names.AgentAuthSecret(), &auth)
	c.writeAuth(auth.Data)
	get(names.CASecret(), &ca)
	c.caPEM = ca.Data["ca.crt"]
	for dir, name := range map[string]string{"server": names.ServerTLSSecret(), "replication": names.ReplicationTLSSecret(), "instance": names.ServerTLSSecret()} {
		var s corev1.Secret
		testutil.Eventually(c.t, time.Minute, func() error {
			return k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: name}, &s)
		})
		d := filepath.Join(c.tlsDir(), dir)
		mustMkdir(c.t, d, 0o755)
		for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
			mustWrite(c.t, filepath.Join(d, k), s.Data[k])
		}
	}
}

// served is the certificate in's postgres serves, verified for in's pod name behind the
// headless Service with the CA clients are given; it fails unless that succeeds.
func (in *instance) served(ctx context.Context, ca []byte) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no CA certificate")
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=app sslmode=verify-full connect_timeout=3", in.ip))
	if err != nil {
		return nil, err
	}
	cfg.Password = in.c.creds.App.Password
	n := dbv1.NamesOf(in.c.name)
	cfg.TLSConfig = &tls.Config{RootCAs: roots, ServerName: in.pod + "." + n.HeadlessService() + "." + in.c.namespace + ".svc", MinVersion: tls.VersionTLS12}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	tc, ok := conn.PgConn().Conn().(*tls.Conn)
	if !ok {
		return nil, fmt.Errorf("the connection is not TLS")
	}
	return tc.ConnectionState().PeerCertificates[0], nil
}

// Every network path is TLS: clients verify the instances by name with the cluster's
// CA, a connection without TLS is refused, replicas clone and stream with their client
// certificate alone (the replication role has no password at all), the superuser cannot
// log in over the network, and a renewed certificate is served without a restart.
func TestTLSEverywhere(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	primary, replica := c.instances[0], c.instances[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if _, err := primary.served(ctx, c.ca.CertPEM); err != nil {
		t.Fatalf("sslmode=verify-full with the cluster's CA: %v", err)
	}
	plain, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=app sslmode=disable connect_timeout=3", primary.ip))
	if err != nil {
		t.Fatal(err)
	}
	plain.Password = c.creds.App.Password
	if conn, err := pgx.ConnectConfig(ctx, plain); err == nil {
		conn.Close(ctx)
		t.Fatal("a connection without TLS was accepted")
	} else if !strings.Contains(err.Error(), "no encryption") {
		t.Errorf("a connection without TLS was refused, but not for that: %v", err)
	}
	su, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=postgres user=postgres sslmode=require connect_timeout=3", primary.ip))
	if err != nil {
		t.Fatal(err)
	}
	su.Password = c.creds.Superuser.Password
	if conn, err := pgx.ConnectConfig(ctx, su); err == nil {
		conn.Close(ctx)
		t.Fatal("the superuser logged in over the network")
	}

	// The agent API: TLS, verified by name with the cluster's CA; no call but the probes
	// without a token; the peers' token cannot promote.
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{http.MethodGet, agentapi.PathStatus, "", http.StatusUnauthorized},
		{http.MethodGet, agentapi.PathMetrics, "", http.StatusUnauthorized},
		{http.MethodPost, agentapi.PathPromote, "", http.StatusUnauthorized},
		{http.MethodPost, agentapi.PathPromote, "peer-" + c.name, http.StatusForbidden},
		{http.MethodGet, agentapi.PathStatus, "peer-" + c.name, http.StatusOK},
		{http.MethodGet, agentapi.PathMetrics, token, http.StatusOK},
		{http.MethodGet, agentapi.PathHealthz, "", http.StatusOK},
	} {
		req, err := http.NewRequestWithContext(ctx, tc.method, "https://"+primary.ip+":8008"+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := c.agentHTTP(primary.pod).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with token %q: %s, want %d", tc.method, tc.path, tc.token, resp.Status, tc.want)
		}
	}
	stranger, err := pki.NewCA("another CA", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	serverName := primary.pod + "." + dbv1.NamesOf(c.name).HeadlessService() + "." + c.namespace + ".svc"
	if resp, err := testutil.AgentHTTP(serverName, stranger.CertPEM).Get("https://" + primary.ip + ":8008/healthz"); err == nil {
		resp.Body.Close()
		t.Error("the agent API's certificate verified with another CA")
	}

	// No replication password: the role loses it, and a new replica still clones and
	// streams, and an existing one reconnects.
	if err := primary.superExec("ALTER ROLE " + pgx.Identifier{c.creds.Replication.Username}.Sanitize() + " PASSWORD NULL"); err != nil {
		t.Fatal(err)
	}
	primary.mustExec("CREATE TABLE tls_rows (id int)")
	primary.mustExec("INSERT INTO tls_rows SELECT generate_series(1, 100)")
	replica.waitCount("tls_rows", 100, time.Minute)
	replica.stop()
	replica.start()
	replica.waitRole(agentapi.RoleReplica, 1, upTimeout)
	primary.mustExec("INSERT INTO tls_rows SELECT generate_series(101, 200)")
	replica.waitCount("tls_rows", 200, time.Minute)

	// Rotation: a new server certificate, from the same CA, is served within seconds,
	// by the same postmaster, and streaming goes on.
	before, err := primary.served(ctx, c.ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pid := primary.postmasterPid()
	c.writeTLS("server", c.issue(certificates.ServerRequest(c.object())), c.ca.CertPEM)
	testutil.Eventually(t, 30*time.Second, func() error {
		now, err := primary.served(ctx, c.ca.CertPEM)
		if err != nil {
			return err
		}
		if now.SerialNumber.Cmp(before.SerialNumber) == 0 {
			return fmt.Errorf("still serving serial %s", before.SerialNumber)
		}
		return nil
	})
	if got := primary.postmasterPid(); got != pid {
		t.Errorf("the postmaster changed from %d to %d: the certificate was not reloaded", pid, got)
	}
	primary.mustExec("INSERT INTO tls_rows SELECT generate_series(201, 300)")
	replica.waitCount("tls_rows", 300, time.Minute)
}
