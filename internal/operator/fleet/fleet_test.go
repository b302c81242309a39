package fleet

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/operator/pki"
)

// A CA is parsed once while in use; a PEM without a certificate is an error.
func TestCAPoolsParseOnce(t *testing.T) {
	ca, err := pki.NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pem := ca.CertPEM
	var p caPools
	first, err := p.parse(sha256.Sum256(pem), pem)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.parse(sha256.Sum256(pem), pem)
	if err != nil || again != first {
		t.Errorf("the same CA parsed again: %p, %p, %v", first, again, err)
	}
	garbage := []byte("not a certificate")
	if _, err := p.parse(sha256.Sum256(garbage), garbage); err == nil {
		t.Error("a ca.crt without a certificate was accepted")
	}
}
