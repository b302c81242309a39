package pgconf

import (
	"crypto/x509"
	"errors"
	"os"
)

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
