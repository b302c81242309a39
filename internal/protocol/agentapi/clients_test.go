package agentapi

import (
	"crypto/x509"
	"testing"
	"time"
)

// A client not asked for in unusedAfter is dropped; one in use is kept, and asking for
// it again returns the same client, its connections with it.
func TestUnusedClientsAreDropped(t *testing.T) {
	now := time.Now()
	h := &HTTPClients{now: func() time.Time { return now }}
	roots := func() (*x509.CertPool, error) { return x509.NewCertPool(), nil }
	a := h.For("a", "ca1", roots)
	h.For("b", "ca1", roots)
	now = now.Add(unusedAfter / 2)
	if h.For("a", "ca1", roots) != a {
		t.Fatal("asking again for a client in use made a new one")
	}
	now = now.Add(unusedAfter/2 + time.Minute)
	h.For("c", "ca1", roots)
	if got := h.Len(); got != 2 {
		t.Errorf("%d clients kept, want 2 (a, in use, and c; b unused for %s)", got, unusedAfter+time.Minute)
	}
	if h.For("a", "ca1", roots) != a {
		t.Error("the client in use was dropped")
	}
	if h.For("a", "ca2", roots) == a {
		t.Error("a client verifying with another CA is the same client")
	}
}
