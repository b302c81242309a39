package pgbouncer

import (
	"strings"
	"testing"
)

func TestRender(t *testing.T) {
	c := Config{ListenPort: 5432, SocketDir: "/run/pgbouncer", AuthFile: "/run/pgbouncer/users.txt", HBAFile: "/run/pgbouncer/hba.conf",
		Server: "my-db-1.my-db-headless.ns.svc", Port: 5432, AuthUser: "pgpilot_pooler", AuthQuery: "SELECT usename, passwd FROM f($1)",
		Admin: "pgpilot_admin", Mode: Transaction, PoolSize: 20, MaxClients: 1000,
		CertFile: "/tls/tls.crt", KeyFile: "/tls/tls.key", CAFile: "/tls/ca.crt", ClientCAFile: "/pooler-tls/ca.crt",
		Parameters: map[string]string{"query_wait_timeout": "60"}}
	text, err := c.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"* = host=my-db-1.my-db-headless.ns.svc port=5432 auth_user=pgpilot_pooler\n",
		"auth_type = hba\n", "auth_hba_file = /run/pgbouncer/hba.conf\n", "auth_query = SELECT usename, passwd FROM f($1)\n",
		"pool_mode = transaction\n", "server_login_retry = 1\n", "default_pool_size = 20\n", "max_client_conn = 1000\n",
		"client_tls_sslmode = require\n", "client_tls_ca_file = /pooler-tls/ca.crt\n",
		"server_tls_sslmode = verify-full\n", "server_tls_ca_file = /tls/ca.crt\n",
		"query_wait_timeout = 60\n", "[users]\npgpilot_pooler = max_user_connections=4\n", "dns_max_ttl = 1\n", "dns_nxdomain_ttl = 1\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, text)
		}
	}
	// The user's settings come after pgpilot's, and none of them is refused here.
	if strings.Index(text, "query_wait_timeout") < strings.Index(text, "max_client_conn") {
		t.Errorf("a user's setting before pgpilot's:\n%s", text)
	}

	for name, bad := range map[string]func(*Config){
		"a refused parameter": func(c *Config) { c.Parameters = map[string]string{"auth_type": "trust"} },
		"a pool mode":         func(c *Config) { c.Mode = "batch" },
		"a server with a space": func(c *Config) {
			c.Server = "db port=1"
		},
		"an admin with a quote": func(c *Config) { c.Admin = `a"b` },
	} {
		c := c
		c.Parameters = map[string]string{}
		bad(&c)
		if _, err := c.Render(); err == nil {
			t.Errorf("%s was rendered", name)
		}
	}
}

func TestHBA(t *testing.T) {
	c := Config{AuthUser: "pgpilot_pooler", Admin: "pgpilot_admin"}
	plain := c.HBA()
	c.CertFile = "/tls/tls.crt"
	tls := c.HBA()
	for _, want := range []string{
		"local pgbouncer pgpilot_admin scram-sha-256\n", "local all all reject\n",
		"host all pgpilot_pooler 0.0.0.0/0 reject\n", "host all pgpilot_pooler ::/0 reject\n",
		"host all pgpilot_admin 0.0.0.0/0 reject\n", "host pgbouncer all ::/0 reject\n",
	} {
		if !strings.Contains(plain, want) || !strings.Contains(tls, want) {
			t.Errorf("HBA lacks %q:\n%s\n%s", want, plain, tls)
		}
	}
	if !strings.Contains(plain, "host all all 0.0.0.0/0 scram-sha-256\n") || strings.Contains(plain, "hostssl") {
		t.Errorf("without TLS:\n%s", plain)
	}
	if !strings.Contains(tls, "hostnossl all all 0.0.0.0/0 reject\n") || !strings.Contains(tls, "hostssl all all ::/0 scram-sha-256\n") {
		t.Errorf("with TLS:\n%s", tls)
	}
	// The rejections come first: PgBouncer, like PostgreSQL, takes the first line that matches.
	if strings.Index(tls, "host all pgpilot_pooler 0.0.0.0/0 reject") > strings.Index(tls, "hostssl all all 0.0.0.0/0") {
		t.Errorf("the lookup role's rejection after the general rule:\n%s", tls)
	}
}

func TestAuthFileLine(t *testing.T) {
	if got := AuthFileLine("pgpilot_pooler", `pa"ss`); got != `"pgpilot_pooler" "pa""ss"`+"\n" {
		t.Errorf("AuthFileLine = %q", got)
	}
}
