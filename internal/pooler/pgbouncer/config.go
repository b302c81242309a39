// Package pgbouncer is what the pooler agent knows of PgBouncer: its configuration file,
// which the agent writes, and its admin console, through which the agent pauses,
// resumes and re-points it and reads its statistics (docs/pooler.md).
package pgbouncer

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// Mode is PgBouncer's pool_mode: when a server connection goes back to the pool.
type Mode string

const (
	// Session returns it when the client disconnects.
	Session Mode = "session"
	// Transaction returns it at the end of each transaction.
	Transaction Mode = "transaction"
	// Statement returns it after each statement; multi-statement transactions are
	// refused.
	Statement Mode = "statement"
)

// Config is a pooler's PgBouncer configuration.
type Config struct {
	// ListenPort is the TCP port clients connect to, on every address.
	ListenPort int
	// SocketDir holds the Unix socket the agent reaches the admin console through.
	SocketDir string
	// AuthFile lists the users PgBouncer knows itself: the lookup role and the admin.
	// HBAFile holds HBA's rules (Render writes both files' paths; the agent the files).
	AuthFile, HBAFile string
	// Server is where the pool's server connections go: the primary's address, or the
	// read-only Service's; Port its port.
	Server string
	Port   int
	// AuthUser is the role PgBouncer logs in as to run AuthQuery, which returns a
	// client's name and SCRAM secret.
	AuthUser, AuthQuery string
	// Admin is the user of the admin console (admin and stats).
	Admin string
	Mode  Mode
	// PoolSize is default_pool_size; MaxClients max_client_conn.
	PoolSize, MaxClients int
	// TLS: the pooler's own certificate and key, which clients see, and the CA that
	// signed the instances' certificates, which PgBouncer verifies.
	CertFile, KeyFile, CAFile string
	// ClientCAFile is client_tls_ca_file: the CA a client's certificate is verified
	// with when a client presents one (client_tls_sslmode require asks for none), the
	// cluster's. Without it PgBouncer loads the system's CA bundle at its start, and
	// refuses to start where there is none ("TLS setup failed: failed to load CA"), as
	// in the pooler's image.
	ClientCAFile string
	// ServerCertFile and ServerKeyFile are the client certificate PgBouncer presents to
	// the server: AuthUser logs in with it (pg_hba.conf's cert method), without a
	// password. Other users' logins ignore it (SCRAM).
	ServerCertFile, ServerKeyFile string
	// ServerSSLMode is server_tls_sslmode: verify-full when empty and CAFile is set
	// (in a pod, always); require encrypts without verifying (tests without the CA).
	ServerSSLMode string
	// Parameters are the user's other settings (spec.pooler.parameters), checked by
	// clusterconfig.CheckPoolerParameters.
	Parameters map[string]string
}

// AuthUserConnections bounds the server connections of AuthUser on one PgBouncer.
const AuthUserConnections = 4

var (
	nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	hostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.:-]*$`)
)

// Render writes the configuration file. It refuses parameters
// clusterconfig.CheckPoolerParameters refuses.
func (c Config) Render() (string, error) {
	if why := clusterconfig.CheckPoolerParameters(c.Parameters); why != "" {
		return "", fmt.Errorf("pooler parameters: %s", why)
	}
	switch c.Mode {
	case Session, Transaction, Statement:
	default:
		return "", fmt.Errorf("pool mode %q: want session, transaction or statement", c.Mode)
	}
	if !hostRE.MatchString(c.Server) {
		return "", fmt.Errorf("server %q is not a host name or address", c.Server)
	}
	for _, v := range []string{c.AuthUser, c.Admin} {
		if !nameRE.MatchString(v) {
			return "", fmt.Errorf("user %q cannot be written into pgbouncer.ini", v)
		}
	}
	var b strings.Builder
	b.WriteString("; Written by the pgpilot pooler agent; changes are overwritten.\n[databases]\n")
	// Every database the client names, on the one server.
	fmt.Fprintf(&b, "* = host=%s port=%d auth_user=%s\n\n[pgbouncer]\n", c.Server, c.Port, c.AuthUser)
	set := func(name, value string) { fmt.Fprintf(&b, "%s = %s\n", name, value) }
	set("listen_addr", "*")
	set("listen_port", strconv.Itoa(c.ListenPort))
	set("unix_socket_dir", c.SocketDir)
	set("auth_type", "hba")
	set("auth_hba_file", c.HBAFile)
	set("auth_file", c.AuthFile)
	set("auth_user", c.AuthUser)
	set("auth_query", c.AuthQuery)
	set("admin_users", c.Admin)
	set("stats_users", c.Admin)
	set("pool_mode", string(c.Mode))
	set("default_pool_size", strconv.Itoa(c.PoolSize))
	set("max_client_conn", strconv.Itoa(c.MaxClients))
	// After a failed login to the server (the old primary stopping, the new one not yet
	// letting clients in), a pool waits this long before it tries again: PgBouncer's 15 s
	// would hold its clients that long after every move of the primary.
	set("server_login_retry", "1")
	if c.CertFile != "" {
		set("client_tls_sslmode", "require")
		set("client_tls_cert_file", c.CertFile)
		set("client_tls_key_file", c.KeyFile)
		if c.ClientCAFile != "" {
			set("client_tls_ca_file", c.ClientCAFile)
		}
	}
	switch {
	case c.ServerSSLMode != "":
		set("server_tls_sslmode", c.ServerSSLMode)
	case c.CAFile != "":
		set("server_tls_sslmode", "verify-full")
	}
	if c.CAFile != "" {
		set("server_tls_ca_file", c.CAFile)
	}
	if c.ServerCertFile != "" {
		set("server_tls_cert_file", c.ServerCertFile)
		set("server_tls_key_file", c.ServerKeyFile)
	}
	// PgBouncer keeps a name's addresses dns_max_ttl (15 s by default) whatever their
	// TTL: a primary whose pod was recreated (a new address) since the pool last
	// resolved its name was unreachable for 11 to 12 s after a handover to it (make
	// chaos, sync-pooler, back and forth between two instances). One second, unless the
	// user's parameters say otherwise.
	for _, name := range []string{"dns_max_ttl", "dns_nxdomain_ttl"} {
		if _, ok := c.Parameters[name]; !ok {
			set(name, "1")
		}
	}
	for _, name := range sortedKeys(c.Parameters) {
		set(name, c.Parameters[name])
	}
	// The lookup role's pools (one per database a client names, even before the
	// client authenticates) share this many server connections: each lookup takes a
	// moment, and the role's sessions on an instance stay bounded by the pooler pods.
	fmt.Fprintf(&b, "\n[users]\n%s = max_user_connections=%d\n", c.AuthUser, AuthUserConnections)
	return b.String(), nil
}

// HBA is the pooler's auth_hba_file. Clients log in with SCRAM (over TLS when tls),
// their secret looked up by AuthUser; AuthUser and Admin are users of the auth file,
// which PgBouncer would otherwise let in as clients: AuthUser never is, and Admin only
// through the Unix socket, to the admin console.
func (c Config) HBA() string {
	tls := c.CertFile != ""
	var b strings.Builder
	b.WriteString("# Written by the pgpilot pooler agent; changes are overwritten.\n")
	fmt.Fprintf(&b, "local pgbouncer %s scram-sha-256\n", c.Admin)
	b.WriteString("local all all reject\n")
	for _, net := range []string{"0.0.0.0/0", "::/0"} {
		fmt.Fprintf(&b, "host all %s %s reject\n", c.AuthUser, net)
		fmt.Fprintf(&b, "host all %s %s reject\n", c.Admin, net)
		fmt.Fprintf(&b, "host pgbouncer all %s reject\n", net)
		if tls {
			fmt.Fprintf(&b, "hostssl all all %s scram-sha-256\n", net)
			fmt.Fprintf(&b, "hostnossl all all %s reject\n", net)
		} else {
			fmt.Fprintf(&b, "host all all %s scram-sha-256\n", net)
		}
	}
	return b.String()
}

// AuthFileLine is one user of the auth file, with its password or SCRAM secret.
func AuthFileLine(user, secret string) string {
	quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	return quote(user) + " " + quote(secret) + "\n"
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
