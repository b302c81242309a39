package clusterconfig

import (
	"os"
	"strings"
	"testing"
)

func TestCheckPoolerParameters(t *testing.T) {
	for _, tc := range []struct {
		params map[string]string
		want   string // a part of the message; "" for none
	}{
		{map[string]string{"query_wait_timeout": "60", "server_idle_timeout": "600", "application_name_add_host": "1"}, ""},
		{map[string]string{"auth_type": "trust"}, "auth_type is set by pgpilot"},
		{map[string]string{"listen_port": "6432"}, "listen_port is set by pgpilot"},
		{map[string]string{"admin_users": "alice"}, "admin_users is set by pgpilot"},
		{map[string]string{"server_tls_sslmode": "disable"}, "server_tls_sslmode is set by pgpilot"},
		{map[string]string{"Query_Wait": "1"}, `"Query_Wait" is not a PgBouncer setting's name`},
		{map[string]string{"x = 1\nauth_type": "trust"}, "is not a PgBouncer setting's name"},
		{map[string]string{"server_reset_query": "DISCARD ALL\nauth_type = trust"}, "server_reset_query: the value may not hold a line break"},
		{map[string]string{"ignore_startup_parameters": "%include /etc/passwd"}, "may not hold"},
		{map[string]string{"ignore_startup_parameters": `a"b`}, "may not hold"},
	} {
		got := CheckPoolerParameters(tc.params)
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("CheckPoolerParameters(%q) = %q, want %q", tc.params, got, tc.want)
		}
	}
}

// The CRD refuses what PoolerOwned lists, so that a user hears of it from the API
// server rather than from the cluster's Ready condition.
func TestCRDRefusesWhatThePoolerOwns(t *testing.T) {
	crd, err := os.ReadFile("../../../api/v1/postgrescluster_types.go")
	if err != nil {
		t.Fatal(err)
	}
	var rule string
	for _, line := range strings.Split(string(crd), "\n") {
		if strings.Contains(line, "'admin_users', 'auth_dbname'") {
			rule = line
		}
	}
	if rule == "" {
		t.Fatal("no validation marker of spec.pooler.parameters lists admin_users")
	}
	for _, name := range PoolerOwned {
		if !strings.Contains(rule, "'"+name+"'") {
			t.Errorf("the CRD's rule does not refuse %s: %s", name, rule)
		}
	}
}
