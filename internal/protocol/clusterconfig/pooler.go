package clusterconfig

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Pooler is spec.pooler, as the pooler agents write it into pgbouncer.ini.
type Pooler struct {
	// Mode is pool_mode: session, transaction or statement.
	Mode string `json:"mode"`
	// PoolSize is default_pool_size; MaxClientConnections max_client_conn.
	PoolSize             int `json:"poolSize"`
	MaxClientConnections int `json:"maxClientConnections"`
	// Parameters are the user's other PgBouncer settings (CheckPoolerParameters).
	Parameters map[string]string `json:"parameters,omitempty"`
	// ReadOnlyService is where the read-only pool's server connections go: the
	// cluster's -ro Service; "" without a read-only pool.
	ReadOnlyService string `json:"readOnlyService,omitempty"`
	// ReadWrite and ReadOnly are the pooler's Services ("" without a read-only pool).
	ReadWrite string `json:"readWrite"`
	ReadOnly  string `json:"readOnly,omitempty"`
	// Headless is the read-write pooler pods' headless Service: the primary's agent
	// asks each address behind it to pause before a handover.
	Headless string `json:"headless"`
}

// PoolerOwned are the PgBouncer settings the pooler sets itself: where it listens,
// how it authenticates, TLS, its admin, the pools it is given fields for, and where it
// logs. A user's value for one of them is refused (CheckPoolerParameters); the CRD
// refuses them too, and its list must stay this one.
var PoolerOwned = []string{
	"admin_users", "auth_dbname", "auth_file", "auth_hba_file", "auth_query", "auth_type", "auth_user",
	"client_tls_ca_file", "client_tls_cert_file", "client_tls_key_file", "client_tls_sslmode",
	"conffile", "default_pool_size", "listen_addr", "listen_port", "logfile", "max_client_conn",
	"peer_id", "pidfile", "pool_mode", "server_tls_ca_file", "server_tls_cert_file", "server_tls_key_file",
	"server_login_retry", "server_tls_sslmode", "service_name", "so_reuseport", "stats_users", "syslog", "syslog_facility",
	"syslog_ident", "unix_socket_dir", "unix_socket_group", "unix_socket_mode", "user",
}

var (
	poolerNameRE  = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	poolerValueRE = regexp.MustCompile(`^[^\x00-\x1f\x7f"%]*$`)
)

// CheckPoolerParameters says what is wrong with a user's PgBouncer parameters, "" when
// nothing is: a name that is no setting's shape, one of PoolerOwned, or a value with a
// line break, a control character, a double quote or a percent sign (an %include).
func CheckPoolerParameters(params map[string]string) string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(params)) {
		value := params[name]
		switch {
		case !poolerNameRE.MatchString(name):
			problems = append(problems, fmt.Sprintf("%q is not a PgBouncer setting's name (lower case letters, digits and _)", name))
		case slices.Contains(PoolerOwned, name):
			problems = append(problems, fmt.Sprintf("%s is set by pgpilot", name))
		case !poolerValueRE.MatchString(value):
			problems = append(problems, fmt.Sprintf("%s: the value may not hold a line break, a control character, '\"' or '%%'", name))
		}
	}
	return strings.Join(problems, "; ")
}
