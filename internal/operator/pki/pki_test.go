package pki_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/operator/pki"
)

func TestIssueAndVerify(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA("test CA", now, 0)
	if err != nil {
		t.Fatal(err)
	}
	req := pki.Request{CommonName: "db-rw", DNSNames: []string{"db-rw.ns.svc", "*.db-headless.ns.svc"}, Usage: pki.Server}
	leaf, err := pki.Issue(ca, req, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Parse(leaf.CertPEM, leaf.KeyPEM); err != nil {
		t.Fatalf("an issued pair does not parse: %v", err)
	}
	if _, err := pki.Parse(leaf.CertPEM, ca.KeyPEM); err == nil {
		t.Error("a certificate parsed with another's key")
	}
	for host, ok := range map[string]bool{"db-rw.ns.svc": true, "db-0.db-headless.ns.svc": true, "db-rw.other.svc": false, "a.b.db-headless.ns.svc": false} {
		why := pki.VerifyServer(leaf.CertPEM, ca.CertPEM, host, now)
		if (why == "") != ok {
			t.Errorf("VerifyServer(%s) = %q, want valid %v", host, why, ok)
		}
	}
	if why := pki.Fits(leaf.Cert, ca.Cert, req, now); why != "" {
		t.Errorf("Fits = %q for the request it was issued for", why)
	}
	other := req
	other.DNSNames = []string{"db-rw.ns.svc"}
	if why := pki.Fits(leaf.Cert, ca.Cert, other, now); !strings.Contains(why, "DNS names") {
		t.Errorf("Fits = %q with other names", why)
	}
	client := pki.Request{CommonName: "db-rw", DNSNames: req.DNSNames, Usage: pki.Client}
	if why := pki.Fits(leaf.Cert, ca.Cert, client, now); why == "" {
		t.Error("a server certificate fits a client request")
	}
	another, err := pki.NewCA("another", now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if why := pki.Fits(leaf.Cert, another.Cert, req, now); !strings.Contains(why, "not valid under the cluster's CA") {
		t.Errorf("Fits = %q under another CA", why)
	}
	if why := pki.VerifyServer(leaf.CertPEM, ca.CertPEM, "db-rw.ns.svc", now.Add(pki.LeafValidity+time.Hour)); why == "" {
		t.Error("an expired certificate verifies")
	}
}

// A leaf is renewed two thirds into its life, and never outlives its CA.
func TestRenewAt(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA("test CA", now, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.Issue(ca, pki.Request{CommonName: "r", Usage: pki.Client, Validity: 90 * time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pki.RenewAt(leaf.Cert), now.Add(-5*time.Minute).Add(95*time.Minute*2/3); !got.Equal(want) {
		t.Errorf("RenewAt = %s, want %s", got, want)
	}
	long, err := pki.Issue(ca, pki.Request{CommonName: "r", Usage: pki.Client}, now)
	if err != nil {
		t.Fatal(err)
	}
	if long.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("the leaf ends %s, after its CA (%s)", long.Cert.NotAfter, ca.Cert.NotAfter)
	}
}
