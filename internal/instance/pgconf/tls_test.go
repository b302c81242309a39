package pgconf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// Network logins are TLS only; the replication role by certificate alone; the superuser
// only when allowed.
func TestHBAConf(t *testing.T) {
	closed := hbaLines(HBAConf("repl", false))
	for _, l := range closed {
		if strings.HasPrefix(l, "host ") && !strings.HasSuffix(l, " reject") {
			t.Errorf("a network line without TLS accepts: %q", l)
		}
		if strings.Contains(l, " repl ") && strings.HasPrefix(l, "hostssl") && !strings.HasSuffix(l, " cert") {
			t.Errorf("the replication role logs in by something else than its certificate: %q", l)
		}
	}
	for _, want := range []string{"hostssl all postgres all reject", "hostnossl all all all reject", "hostssl replication repl all cert"} {
		if !strings.Contains(strings.Join(closed, "\n"), want) {
			t.Errorf("pg_hba.conf has no %q:\n%s", want, strings.Join(closed, "\n"))
		}
	}
	if open := HBAConf("repl", true); !strings.Contains(strings.Join(hbaLines(open), "\n"), "hostssl all postgres all scram-sha-256") {
		t.Errorf("superuserNetworkAccess does not let the superuser in:\n%s", open)
	}
	// The pooler's lookup role: by its certificate over TLS, to any database but the
	// templates, and by nothing else, a password included, whether or not the superuser
	// may log in.
	for _, network := range []bool{false, true} {
		conf := hbaLines(HBAConf("repl", network))
		for _, c := range []struct {
			conn, db, want string
		}{
			{"hostssl", "app", "cert"}, {"hostssl", "postgres", "cert"}, {"hostssl", "template1", "reject"}, {"hostssl", "template0", "reject"},
			{"hostnossl", "app", "reject"}, {"local", "app", "reject"}, {"hostssl", "replication", "reject"},
		} {
			if got := hbaMethod(conf, c.conn, c.db, poolerauth.Role); got != c.want {
				t.Errorf("superuserNetwork %v: %s to %s as %s: %q, want %q", network, c.conn, c.db, poolerauth.Role, got, c.want)
			}
		}
	}
	// Everyone else as before: the application owner by password, over TLS only.
	for conn, want := range map[string]string{"hostssl": "scram-sha-256", "hostnossl": "reject", "local": "scram-sha-256"} {
		if got := hbaMethod(closed, conn, "app", "app"); got != want {
			t.Errorf("%s to app as app: %q, want %q", conn, got, want)
		}
	}
}

// hbaMethod is the method of the first line of conf (hbaLines) that a connection of
// type conn ("local", "hostssl", "hostnossl") to db ("replication" for a replication
// connection) as user matches, as PostgreSQL picks it; "" when none does.
func hbaMethod(conf []string, conn, db, user string) string {
	for _, l := range conf {
		f := strings.Fields(l)
		typ, database, role := f[0], f[1], f[2]
		method := f[len(f)-1]
		if strings.HasPrefix(method, "map=") {
			method = f[len(f)-2]
		}
		typeOK := typ == conn || (typ == "host" && conn != "local")
		dbOK := slices.Contains(strings.Split(database, ","), db) || (database == "all" && db != "replication")
		if typeOK && dbOK && (role == "all" || role == user) {
			return method
		}
	}
	return ""
}

// hbaLines are a pg_hba.conf's lines without comments, their fields one space apart.
func hbaLines(conf string) []string {
	var out []string
	for _, l := range strings.Split(conf, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// Sync copies the mounted certificates, reports a change only when there is one, and
// keeps the copies when the mounted certificate does not go with its key.
func TestTLSFilesSync(t *testing.T) {
	dir := t.TempDir()
	files := TLSFiles{Source: filepath.Join(dir, "mounted"), Dir: filepath.Join(dir, "copies")}
	ca, err := pki.NewCA("ca", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	mount := func(sub string, pair *pki.KeyPair, key []byte) {
		d := filepath.Join(files.Source, sub)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"tls.crt": pair.CertPEM, "tls.key": key, "ca.crt": ca.CertPEM} {
			if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	issue := func(u pki.Usage) *pki.KeyPair {
		p, err := pki.Issue(ca, pki.Request{CommonName: "x", Usage: u}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	server, repl := issue(pki.Server), issue(pki.Client)
	mount("server", server, server.KeyPEM)
	mount("replication", repl, repl.KeyPEM)
	mount("instance", server, server.KeyPEM)
	if changed, err := files.Sync(); err != nil || !changed {
		t.Fatalf("first Sync: changed %v, %v", changed, err)
	}
	if st, err := os.Stat(files.ServerKey()); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the key's copy: %v, %v; want mode 0600", st.Mode(), err)
	}
	if changed, err := files.Sync(); err != nil || changed {
		t.Errorf("Sync with nothing new: changed %v, %v", changed, err)
	}
	renewed := issue(pki.Server)
	mount("server", renewed, server.KeyPEM) // half-written: the new certificate, the old key
	if _, err := files.Sync(); err == nil {
		t.Error("Sync accepted a certificate with another's key")
	}
	if b, _ := os.ReadFile(files.ServerCert()); string(b) != string(server.CertPEM) {
		t.Error("a failed Sync changed the certificate in use")
	}
	mount("server", renewed, renewed.KeyPEM)
	if changed, err := files.Sync(); err != nil || !changed {
		t.Errorf("Sync of a renewal: changed %v, %v", changed, err)
	}
	if b, _ := os.ReadFile(files.ServerCert()); string(b) != string(renewed.CertPEM) {
		t.Error("the renewed certificate was not copied")
	}
}

// A locked-out primary's pg_hba.conf lets in the agent's own local sessions and the
// standbys' replication, and no client.
func TestLockedOutHBAConf(t *testing.T) {
	conf := hbaLines(LockedOutHBAConf("repl"))
	for i, l := range conf {
		f := strings.Fields(l)
		method := f[len(f)-1]
		if method == "reject" || method == "map=pgpilot" {
			continue
		}
		switch {
		case f[0] == "local" && f[2] == "postgres" && method == "peer":
		case f[0] == "hostssl" && f[2] == "repl" && method == "cert":
		default:
			t.Errorf("line %d lets a client in: %q", i, l)
		}
	}
	if last := conf[len(conf)-1]; !strings.HasPrefix(last, "host ") || !strings.HasSuffix(last, "reject") {
		t.Errorf("the last line %q does not refuse every network connection", last)
	}
	// The pooler relies on a locked-out primary refusing its lookup role.
	for _, conn := range []string{"hostssl", "hostnossl", "local"} {
		if got := hbaMethod(conf, conn, "app", poolerauth.Role); got != "reject" {
			t.Errorf("locked out: %s as %s: %q, want reject", conn, poolerauth.Role, got)
		}
	}
	in := ConfInput{ReplicationUser: "repl", LockedOut: true}
	if in.HBA() != LockedOutHBAConf("repl") {
		t.Errorf("ConfInput.HBA does not render the lockout")
	}
	in.LockedOut = false
	if in.HBA() != HBAConf("repl", false) {
		t.Errorf("ConfInput.HBA renders the lockout when not locked out")
	}
}
