package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The controller makes a cluster's CA, publishes its certificate without the key, and
// issues the server certificate (valid for the Services and the pods behind the headless
// one) and the replication client certificate; a certificate due for renewal, or one
// from another CA, is issued again; a user's server Secret that cannot serve is reported.
func TestCertificates(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "tls"))
	n := dbv1.NamesOf("tls")
	secret := func(name string) *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		testutil.Eventually(t, timeout, func() error { return get(ns, name, &s) })
		return &s
	}
	published := secret(n.CASecret())
	if len(published.Data) != 1 || len(published.Data["ca.crt"]) == 0 {
		t.Fatalf("Secret %s holds %d keys; want ca.crt only", n.CASecret(), len(published.Data))
	}
	caKey := secret(n.CAKeySecret())
	ca, err := pki.Parse(caKey.Data["tls.crt"], caKey.Data["tls.key"])
	if err != nil || !ca.Cert.IsCA || !bytes.Equal(published.Data["ca.crt"], ca.CertPEM) {
		t.Fatalf("the CA: %v (published the same: %v)", err, bytes.Equal(published.Data["ca.crt"], caKey.Data["tls.crt"]))
	}
	server := secret(n.ServerTLSSecret())
	now := time.Now()
	for _, host := range []string{"tls-rw.ns.svc", "tls-ro." + ns + ".svc", "tls-r." + ns, "tls-0.tls-headless." + ns + ".svc",
		"tls-2.tls-headless." + ns + ".svc.cluster.local"} {
		host = strings.Replace(host, ".ns.", "."+ns+".", 1)
		if why := pki.VerifyServer(server.Data["tls.crt"], published.Data["ca.crt"], host, now); why != "" {
			t.Errorf("the server certificate %s", why)
		}
	}
	if why := pki.VerifyServer(server.Data["tls.crt"], published.Data["ca.crt"], "tls-rw.elsewhere.svc", now); why == "" {
		t.Error("the server certificate is valid for another namespace's Service")
	}
	repl := secret(n.ReplicationTLSSecret())
	leaf, err := pki.Parse(repl.Data["tls.crt"], repl.Data["tls.key"])
	if err != nil || leaf.Cert.Subject.CommonName != dbv1.ReplicationUser {
		t.Fatalf("the replication certificate: %v, %+v", err, leaf)
	}

	// Renewal: a server certificate with a minute left is replaced by one with its
	// whole life ahead.
	short, err := pki.Issue(ca, pki.Request{CommonName: "tls-rw", DNSNames: certificates.ServerRequest(newCluster(ns, "tls")).DNSNames,
		Usage: pki.Server, Validity: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	server.Data = map[string][]byte{"tls.crt": short.CertPEM, "tls.key": short.KeyPEM, "ca.crt": ca.CertPEM}
	if err := k8s.Update(context.Background(), server); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		s := secret(n.ServerTLSSecret())
		c, err := pki.Parse(s.Data["tls.crt"], s.Data["tls.key"])
		if err != nil {
			return err
		}
		if c.Cert.NotAfter.Before(now.Add(24 * time.Hour)) {
			return fmt.Errorf("still expiring at %s", c.Cert.NotAfter)
		}
		return nil
	})

	// A user's server certificate that ca.crt does not verify is reported.
	other, err := pki.NewCA("another CA", now, 0)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := pki.Issue(other, pki.Request{CommonName: "x", DNSNames: []string{"x"}, Usage: pki.Server}, now)
	if err != nil {
		t.Fatal(err)
	}
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: ns}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": stranger.CertPEM, "tls.key": stranger.KeyPEM, "ca.crt": other.CertPEM}})
	create(t, newCluster(ns, "own-cert", func(c *dbv1.PostgresCluster) { c.Spec.TLS.ServerSecretName = "mine" }))
	testutil.Eventually(t, timeout, func() error {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "own-cert" && e.Reason == dbv1.ReasonCertificateInvalid &&
				strings.Contains(e.Message, "Secret mine (spec.tls.serverSecretName) has a certificate that ca.crt does not verify for own-cert-rw."+ns+".svc") {
				return nil
			}
		}
		return fmt.Errorf("no CertificateInvalid event for own-cert")
	})
	// The StatefulSet mounts the user's Secret for PostgreSQL.
	testutil.Eventually(t, timeout, func() error {
		var sts appsv1.StatefulSet
		if err := get(ns, "own-cert", &sts); err != nil {
			return err
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == "tls-server" && v.Secret != nil && v.Secret.SecretName == "mine" {
				return nil
			}
		}
		return fmt.Errorf("the StatefulSet does not mount Secret mine as tls-server")
	})
}
