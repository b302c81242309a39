// Package pki makes the certificates of a cluster: a CA per cluster, the server
// certificate its instances serve (PostgreSQL and the agent API) and the client
// certificates that authenticate replication. It uses the standard library's crypto/x509
// only; keys are ECDSA P-256, stored as PKCS #8 PEM (what OpenSSL, and so PostgreSQL,
// reads).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Durations of what the operator issues. A CA lives long because every client trusts it;
// a leaf is renewed by the operator when two thirds of its life have passed (RenewAt).
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 90 * 24 * time.Hour
	// backdate covers clocks a little behind the operator's.
	backdate = 5 * time.Minute
)

// KeyPair is a certificate and its private key, parsed, with the PEM they came from.
type KeyPair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// Usage is what a leaf certificate is for.
type Usage int

const (
	// Server certificates authenticate an instance to its clients.
	Server Usage = iota
	// Client certificates authenticate a role to PostgreSQL (pg_hba.conf's cert method
	// matches CommonName against the role).
	Client
)

// Request is a leaf certificate to issue.
type Request struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	Usage      Usage
	// Validity defaults to LeafValidity.
	Validity time.Duration
}

// NewCA makes a self-signed CA named commonName, valid from now for validity
// (CAValidity when 0).
func NewCA(commonName string, now time.Time, validity time.Duration) (*KeyPair, error) {
	if validity == 0 {
		validity = CAValidity
	}
	key, serial, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"pgpilot"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, tmpl, key, key)
}

// Issue signs a leaf certificate for req with ca, valid from now.
func Issue(ca *KeyPair, req Request, now time.Time) (*KeyPair, error) {
	if req.Validity == 0 {
		req.Validity = LeafValidity
	}
	key, serial, err := newKey()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	switch req.Usage {
	case Server:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case Client:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return sign(tmpl, ca.Cert, key, ca.Key)
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) (*KeyPair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &KeyPair{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// newKey makes a certificate's key and a random serial number for it.
func newKey() (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return key, serial, err
}

// Parse reads a certificate and its key from PEM and checks that they belong together.
// Only the first certificate of certPEM is the leaf; the rest (a chain) is kept in
// CertPEM as given.
func Parse(certPEM, keyPEM []byte) (*KeyPair, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("the private key cannot sign")
	}
	return &KeyPair{Cert: pair.Leaf, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCerts reads every certificate of a PEM bundle; it fails when there is none.
func ParseCerts(bundle []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := bytes.TrimSpace(bundle)
	for len(rest) > 0 {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}

// RenewAt is when a certificate the operator issued is renewed: two thirds into its
// life, leaving a third (30 days of a 90-day certificate) for the renewal to reach every
// pod and for anyone to notice if it does not.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life * 2 / 3)
}

// Fits reports why leaf does not fit req as issued by ca, or "" when it does: signed by
// ca, for the same usage, names and addresses. A certificate that does not fit is
// issued again.
func Fits(leaf *x509.Certificate, ca *x509.Certificate, req Request, now time.Time) string {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	usage := x509.ExtKeyUsageServerAuth
	if req.Usage == Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "not valid under the cluster's CA: " + err.Error()
	}
	if leaf.Subject.CommonName != req.CommonName {
		return fmt.Sprintf("common name %q, not %q", leaf.Subject.CommonName, req.CommonName)
	}
	if !sameSet(leaf.DNSNames, req.DNSNames) {
		return fmt.Sprintf("DNS names %v, not %v", leaf.DNSNames, req.DNSNames)
	}
	var have, want []string
	for _, ip := range leaf.IPAddresses {
		have = append(have, ip.String())
	}
	for _, ip := range req.IPs {
		want = append(want, ip.String())
	}
	if !sameSet(have, want) {
		return fmt.Sprintf("IP addresses %v, not %v", have, want)
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// VerifyServer says why the server certificate in certPEM (the leaf, then any
// intermediates) is not valid for host under the CAs of caPEM at now, or "" when it is:
// what a client with sslmode=verify-full checks.
func VerifyServer(certPEM, caPEM []byte, host string, now time.Time) string {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return "has a tls.crt that cannot be read: " + err.Error()
	}
	cas, err := ParseCerts(caPEM)
	if err != nil {
		return "has a ca.crt that cannot be read: " + err.Error()
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err = certs[0].Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return fmt.Sprintf("has a certificate that ca.crt does not verify for %s: %v", host, err)
	}
	return ""
}
