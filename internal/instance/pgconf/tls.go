package pgconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// TLSFiles are an instance's certificates: as the pod mounts them under Source, and as
// postgres and libpq read them, copied into Dir. The copies belong to the agent's user
// with mode 0600: PostgreSQL and libpq refuse a private key others may read, and the
// files of a mounted Secret belong to root.
//
// Source holds server/ (what PostgreSQL serves: tls.crt, tls.key and ca.crt, the CA that
// verifies it), replication/ (the replication role's client certificate, and ca.crt:
// the cluster's CA, which PostgreSQL verifies client certificates with) and instance/
// (the certificate the operator issues from that CA, which the agent API serves: the
// operator and the peers verify it with the cluster's CA whatever PostgreSQL serves).
type TLSFiles struct {
	Source, Dir string
}

// ServerCert is the copy of the certificate postgres serves.
func (t TLSFiles) ServerCert() string { return filepath.Join(t.Dir, "server.crt") }

// ServerKey is the server certificate's key.
func (t TLSFiles) ServerKey() string { return filepath.Join(t.Dir, "server.key") }

// ServerCA verifies the other instances' server certificates (sslrootcert).
func (t TLSFiles) ServerCA() string { return filepath.Join(t.Dir, "server-ca.crt") }

// ClientCA is the cluster's CA, which postgres verifies client certificates with
// (ssl_ca_file).
func (t TLSFiles) ClientCA() string { return filepath.Join(t.Dir, "client-ca.crt") }

// InstanceCert is the certificate the agent API serves; InstanceKey its key.
func (t TLSFiles) InstanceCert() string { return filepath.Join(t.Dir, "instance.crt") }

// InstanceKey is the agent API certificate's key.
func (t TLSFiles) InstanceKey() string { return filepath.Join(t.Dir, "instance.key") }

// ReplicationCert is the replication role's client certificate (sslcert).
func (t TLSFiles) ReplicationCert() string { return filepath.Join(t.Dir, "replication.crt") }

// ReplicationKey is the replication certificate's key (sslkey).
func (t TLSFiles) ReplicationKey() string { return filepath.Join(t.Dir, "replication.key") }

// SourceCA verifies a replica cluster's source's server certificate (spec.replica).
func (t TLSFiles) SourceCA() string { return filepath.Join(t.Dir, "source-ca.crt") }

// SourceCert is the source's replication client certificate.
func (t TLSFiles) SourceCert() string { return filepath.Join(t.Dir, "source.crt") }

// SourceKey is the source's replication certificate's key.
func (t TLSFiles) SourceKey() string { return filepath.Join(t.Dir, "source.key") }

// hasSource reports whether the pod has a replica cluster's source certificate
// (source/tls.crt): every pod mounts the directory, only a replica cluster's holds it
// (the operator's copy of spec.replica.source.replicationSecretName).
func (t TLSFiles) hasSource() bool {
	_, err := os.Stat(filepath.Join(t.Source, "source", "tls.crt"))
	return err == nil
}

// copies maps each copy to its source.
func (t TLSFiles) copies() [][2]string {
	src := func(dir, key string) string { return filepath.Join(t.Source, dir, key) }
	if t.hasSource() {
		return append(t.ownCopies(), [][2]string{
			{t.SourceCA(), src("source", "ca.crt")},
			{t.SourceCert(), src("source", "tls.crt")},
			{t.SourceKey(), src("source", "tls.key")},
		}...)
	}
	return t.ownCopies()
}

// ownCopies are the cluster's own certificates' copies.
func (t TLSFiles) ownCopies() [][2]string {
	src := func(dir, key string) string { return filepath.Join(t.Source, dir, key) }
	return [][2]string{
		{t.ServerCert(), src("server", "tls.crt")},
		{t.ServerKey(), src("server", "tls.key")},
		{t.ServerCA(), src("server", "ca.crt")},
		{t.ReplicationCert(), src("replication", "tls.crt")},
		{t.ReplicationKey(), src("replication", "tls.key")},
		{t.ClientCA(), src("replication", "ca.crt")},
		{t.InstanceCert(), src("instance", "tls.crt")},
		{t.InstanceKey(), src("instance", "tls.key")},
	}
}

// Sync copies the mounted certificates into Dir where they differ, and reports whether
// any did. A source that cannot be used (missing, or a certificate that does not match
// its key: a Secret being rewritten, or a wrong one) leaves every copy as it was.
func (t TLSFiles) Sync() (changed bool, err error) {
	contents := map[string][]byte{}
	for _, c := range t.copies() {
		b, err := os.ReadFile(c[1])
		if err != nil {
			return false, fmt.Errorf("reading the mounted certificate: %w", err)
		}
		contents[c[0]] = b
	}
	for _, pair := range [][2]string{{t.ServerCert(), t.ServerKey()}, {t.ReplicationCert(), t.ReplicationKey()}, {t.InstanceCert(), t.InstanceKey()}, {t.SourceCert(), t.SourceKey()}} {
		if _, ok := contents[pair[0]]; !ok {
			continue // no source certificate: not a replica cluster
		}
		if _, err := tls.X509KeyPair(contents[pair[0]], contents[pair[1]]); err != nil {
			return false, fmt.Errorf("the certificate mounted for %s does not go with its key: %w", filepath.Base(pair[0]), err)
		}
	}
	if err := os.MkdirAll(t.Dir, 0o700); err != nil {
		return false, err
	}
	// postgres reads them at a start or a reload, which keepTLS asks for only once all
	// are written; a reload in between that finds a certificate and a key that do not
	// match keeps the TLS configuration it had.
	for _, c := range t.copies() {
		old, err := os.ReadFile(c[0])
		if err == nil && bytes.Equal(old, contents[c[0]]) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return changed, err
		}
		if err := WriteFileAtomic(c[0], contents[c[0]], 0o600); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

// ServerConfig is the agent API's TLS configuration: it serves the instance
// certificate as it is in Dir at each handshake, so that a renewed one is served
// without a restart.
func (t TLSFiles) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(t.InstanceCert(), t.InstanceKey())
			return &c, err
		},
	}
}

// Upstream is how this instance reaches another instance's postgres as the
// replication role: by TLS, verifying its certificate for Host, logging in with the
// replication role's client certificate (pg_hba.conf's cert method), no password.
type Upstream struct {
	// Host is the name the peer's certificate is verified against: its pod's name
	// behind the headless Service, or a replica cluster's source's host.
	Host string
	// Source: the upstream is a replica cluster's source, another cluster, reached with
	// the source's certificates (TLSFiles.Source*) and without a replication slot.
	Source bool
	// Standby: the upstream is a standby by design, the designated primary of a
	// replica cluster: its clones are backups from a standby.
	Standby bool
	// Addr, when set, is the address to connect to instead of resolving Host (tests).
	Addr string
	Port int
	User string
	TLS  TLSFiles
}

// Conninfo is the libpq connection string to the upstream with extra settings added.
// Addr becomes hostaddr: libpq then connects there and still verifies Host.
func (u Upstream) Conninfo(extra map[string]string) string {
	kv := map[string]string{
		"host": u.Host, "port": strconv.Itoa(u.Port), "user": u.User,
		"sslmode": "verify-full", "sslrootcert": u.TLS.ServerCA(),
		"sslcert": u.TLS.ReplicationCert(), "sslkey": u.TLS.ReplicationKey(),
		"connect_timeout": "5",
	}
	if u.Source {
		kv["sslrootcert"], kv["sslcert"], kv["sslkey"] = u.TLS.SourceCA(), u.TLS.SourceCert(), u.TLS.SourceKey()
	}
	if u.Addr != "" {
		kv["hostaddr"] = u.Addr
	}
	for k, v := range extra {
		kv[k] = v
	}
	return Conninfo(kv)
}

// PgConfig is the upstream's connection for pgx, which has no hostaddr: Addr is what
// Host resolves to.
func (u Upstream) PgConfig(extra map[string]string) (*pgconn.Config, error) {
	kv := map[string]string{}
	for k, v := range extra {
		kv[k] = v
	}
	cfg, err := pgconn.ParseConfig(Upstream{Host: u.Host, Source: u.Source, Port: u.Port, User: u.User, TLS: u.TLS}.Conninfo(kv))
	if err != nil {
		return nil, err
	}
	if u.Addr != "" {
		addr := u.Addr
		cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{addr}, nil }
	}
	return cfg, nil
}

// WriteFileAtomic writes path through a temporary file renamed into place: a reader
// finds the old content or the whole new one, never part of it.
func WriteFileAtomic(path string, content []byte, mode os.FileMode) error {
	return ReplaceFile(path, content, mode, false)
}

// ReplaceFile writes content to path through a temporary file renamed over it, so that
// a reader sees the old content or the whole new one; durable syncs the new content
// before the rename, so that a crash too leaves one or the other.
func ReplaceFile(path string, content []byte, mode os.FileMode, durable bool) error {
	tmp := path + ".pgpilot-tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
