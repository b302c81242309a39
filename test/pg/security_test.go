package pg

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

// loggedSecret finds, in a server log, a statement that sets a password or a SCRAM
// verifier.
var loggedSecret = regexp.MustCompile(`(?i)PASSWORD\s+'|SCRAM-SHA-256\$`)

// No setting logs a password or a verifier: with log_statement = all and every
// statement's duration logged, the agent sets passwords at its start (the Secrets'),
// creates a role with one and rotates it (PUT /roles), and the server's log holds
// none of them, while it does log the agent's other statements.
func TestPasswordsAreNeverLogged(t *testing.T) {
	c := newCluster(t, 1)
	c.setConfig("parameters", map[string]string{"log_statement": "all", "log_min_duration_statement": "0",
		"log_min_error_statement": "debug5", "shared_buffers": "16MB"})
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)

	apply := func(req agentapi.RolesRequest) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := p.api().ApplyRoles(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range append(res.Roles, res.Passwords...) {
			if r.Error != "" {
				t.Fatalf("%s: %s", r.Name, r.Error)
			}
		}
	}
	role := func(pw string) agentapi.Role {
		return agentapi.Role{Name: "alice", Login: true, Inherit: true, ConnectionLimit: -1, Password: &pw}
	}
	apply(agentapi.RolesRequest{Roles: []agentapi.Role{role("first-alice-pw")}})
	apply(agentapi.RolesRequest{Roles: []agentapi.Role{role("second-alice-pw")},
		Passwords: []agentapi.Password{{Role: "app", Password: "rotated-app-pw"}}})
	if err := p.loginAs("alice", "second-alice-pw", "app"); err != nil {
		t.Fatalf("alice's rotated password: %v", err)
	}
	// The Secrets' passwords are set at the agent's start.
	p.stop()
	log := p.log.String() // start gives the agent a new log
	c.creds.App.Password = "from-the-secret-" + c.name
	mustWrite(t, filepath.Join(c.dir, "secrets", "app", "password"), []byte(c.creds.App.Password))
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("SELECT 1")
	p.stop()
	log += p.log.String()
	if !strings.Contains(log, "statement: SELECT") {
		t.Fatalf("the server logged no statement: log_statement = all is not in force, and this test shows nothing")
	}
	var leaks []string
	for _, line := range strings.Split(log, "\n") {
		if loggedSecret.MatchString(line) {
			leaks = append(leaks, line)
		}
	}
	if len(leaks) > 0 {
		t.Errorf("the log holds %d lines with a password or verifier:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
	for _, pw := range []string{"first-alice-pw", "second-alice-pw", "rotated-app-pw", c.creds.App.Password} {
		if strings.Contains(log, pw) {
			t.Errorf("the log holds the password %q", pw)
		}
	}
	t.Logf("the server logged %d statements, none with a password", strings.Count(log, "statement: "))
}
