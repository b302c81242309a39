package pg

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// loggedSecret finds, in a server log, a statement that sets a password or a SCRAM
// verifier.
var loggedSecret = regexp.MustCompile(`(?i)PASSWORD\s+'|SCRAM-SHA-256\$`)

// No setting logs a password or a verifier: with log_statement = all and every
// statement's duration logged, the agent sets passwords at its start (the Secrets'),
// creates a role with one and rotates it (PUT /roles), and the server's log holds
// none of them, while it does log the agent's other statements.
func TestPasswordsAreNeverLogged(t *testing.T) {
	t.Parallel()
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

// impostor is a replication client over TCP with the replication certificate that
// calls itself the commit gate and confirms every WAL position it receives.
type impostor struct {
	done chan struct{}
	err  error
}

// connectImpostor connects to in over TCP as the replication role, with the
// replication certificate and application_name pgpilot_gate, starts streaming and
// confirms everything it receives as flushed, until its connection ends.
func connectImpostor(t *testing.T, in *instance) *impostor {
	t.Helper()
	dir := filepath.Join(in.c.tlsDir(), "replication")
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=5432 user=%s replication=true application_name=%s sslmode=verify-ca "+
		"sslrootcert=%s sslcert=%s sslkey=%s connect_timeout=5", in.ip, in.c.creds.Replication.Username, gate.GateName,
		filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("the replication certificate does not log in over TCP: %v", err)
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	conn.Frontend().SendQuery(&pgproto3.Query{String: fmt.Sprintf("START_REPLICATION PHYSICAL %s TIMELINE %d", sys.XLogPos, sys.Timeline)})
	if err := conn.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	for started := false; !started; {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			started = true
		case *pgproto3.ErrorResponse:
			t.Fatal(pgconn.ErrorResponseToPgError(m))
		}
	}
	imp := &impostor{done: make(chan struct{})}
	go func() {
		defer close(imp.done)
		defer conn.Close(context.Background())
		received := sys.XLogPos
		for {
			err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: received})
			if err == nil {
				rctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				var msg pgproto3.BackendMessage
				msg, err = conn.ReceiveMessage(rctx)
				cancel()
				if pgconn.Timeout(err) {
					continue
				}
				if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 0 && cd.Data[0] == pglogrepl.XLogDataByteID {
					if x, perr := pglogrepl.ParseXLogData(cd.Data[1:]); perr == nil {
						received = max(received, x.WALStart+pglogrepl.LSN(len(x.WALData)))
					}
				}
				if e, ok := msg.(*pgproto3.ErrorResponse); ok {
					err = pgconn.ErrorResponseToPgError(e)
				}
			}
			if err != nil {
				imp.err = err
				return
			}
		}
	}()
	return imp
}

// The commit gate's name cannot be taken: a client holding the replication
// certificate that connects over TCP as pgpilot_gate, ahead of the gate in postgres's
// list of walsenders (so that postgres counts its confirmations, not the gate's), is
// terminated by the primary's agent within seconds, counted in its status, and the
// primary, whose Lease is not confirmed, acknowledges no commit.
func TestGateNameCannotBeTaken(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE gate_test (id int)")
	// Cut off from the API server and its peer, it cannot confirm its Lease.
	c.instances[1].kill9()
	p.proxy.setCut(true)
	testutil.Eventually(t, 3*primarylease.Duration, func() error {
		if st, err := p.status(); err != nil || st.Gate != agentapi.GateWithholding {
			return fmt.Errorf("the gate is %q (%v), not withholding yet", st.Gate, err)
		}
		return nil
	})
	// The agent paused, its gate's walsender ended: the impostor takes the first
	// walsender slot, and the gate, when the agent resumes, a later one. Postgres picks
	// the first of two standbys of one name.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	if err := p.superExec("SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = '" + gate.GateName + "'"); err != nil {
		t.Fatal(err)
	}
	imp := connectImpostor(t, p)
	resume()
	resumedAt := time.Now()
	select {
	case <-imp.done:
		t.Logf("the impostor was terminated %s after the agent resumed: %v", time.Since(resumedAt).Round(10*time.Millisecond), imp.err)
	case <-time.After(15 * time.Second):
		t.Errorf("the impostor still streams 15 s after the agent resumed")
	}
	if err := p.tryWrite(5*time.Second, "INSERT INTO gate_test VALUES (1)"); err == nil {
		t.Errorf("a commit was acknowledged by a primary whose Lease is not confirmed")
	}
	// Withholding, or, once the Lease itself expired while the agent was stopped and
	// resumed (a loaded machine takes seconds over the pause), stopped as a primary
	// that lost its Lease, its gate gone with postgres: acknowledging nothing either way.
	st := p.mustStatus()
	if st.Gate == agentapi.GateAcking || st.GateImpostorsTerminated < 1 {
		t.Errorf("gate %q, impostors terminated %d; want it not acking and at least 1", st.Gate, st.GateImpostorsTerminated)
	}
	if !strings.Contains(p.log.String(), "took the commit gate's name") {
		t.Errorf("the agent did not log the impostor's termination")
	}
}

// The agent refuses, whatever the CRD let through, the memberships that reach a program
// or file role or a superuser, directly or through a role made by hand, and CREATEROLE
// on PostgreSQL 15; it revokes the unsafe memberships a role of the spec holds already
// (carol's of pg_read_server_files, and of admins, which reaches a program role), and
// grants the others.
func TestUnsafeMembershipsAreRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	for _, sql := range []string{
		"CREATE ROLE admins NOLOGIN", "GRANT pg_execute_server_program TO admins",
		"CREATE ROLE bosses NOLOGIN", "GRANT postgres TO bosses",
		"CREATE ROLE carol NOLOGIN", "GRANT pg_read_server_files TO carol", "GRANT admins TO carol",
	} {
		if err := p.superExec(sql); err != nil {
			t.Fatal(err)
		}
	}
	role := func(name string, in ...string) agentapi.Role {
		return agentapi.Role{Name: name, Login: true, Inherit: true, ConnectionLimit: -1, InRoles: in}
	}
	creator := role("dave")
	creator.CreateRole = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.api().ApplyRoles(ctx, agentapi.RolesRequest{Roles: []agentapi.Role{
		role("alice", "pg_execute_server_program"), role("bob", "admins"), role("bea", "bosses"),
		role("carol", "pg_read_server_files"), creator, role("eve", "pg_monitor"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"alice": "role alice cannot be a member of pg_execute_server_program",
		"bob":   "role bob cannot be a member of admins, a member of pg_execute_server_program,",
		"bea":   "role bea cannot be a member of bosses, a member of postgres, which is a superuser",
		"carol": "role carol cannot be a member of pg_read_server_files",
		"dave":  "role dave cannot have CREATEROLE on PostgreSQL before 16",
		"eve":   "",
	}
	for _, r := range res.Roles {
		if w := want[r.Name]; w == "" && r.Error != "" || w != "" && !strings.HasPrefix(r.Error, w) {
			t.Errorf("%s: error %q, want one starting with %q", r.Name, r.Error, w)
		}
	}
	// Not made, not granted; carol's membership revoked; eve's granted.
	if err := p.superExec(`DO $$ BEGIN
		IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname IN ('alice', 'bob', 'bea', 'dave')) THEN RAISE 'a refused role was made'; END IF;
		IF pg_has_role('carol', 'pg_read_server_files', 'MEMBER') THEN RAISE 'carol is still a member of pg_read_server_files'; END IF;
		IF pg_has_role('carol', 'admins', 'MEMBER') THEN RAISE 'carol is still a member of admins'; END IF;
		IF NOT pg_has_role('eve', 'pg_monitor', 'MEMBER') THEN RAISE 'eve is not a member of pg_monitor'; END IF;
	END $$`); err != nil {
		t.Error(err)
	}
}

// The -app Secret's uri verifies the server: with the cluster's CA where the uri says
// (here a file of the test's, the only part of the uri replaced) and the -rw Service's
// name resolved to the primary, it connects with sslmode=verify-full; with another CA
// it does not.
func TestAppURIVerifiesTheServer(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 1)
	startOperated(t, c)
	names := dbv1.NamesOf(c.name)
	var app, ca corev1.Secret
	for name, s := range map[string]*corev1.Secret{names.AppSecret(): &app, names.CASecret(): &ca} {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: name}, s); err != nil {
			t.Fatal(err)
		}
	}
	uri := string(app.Data["uri"])
	const caPath = "sslrootcert=/etc/pgpilot/ca/ca.crt"
	if !strings.Contains(uri, "sslmode=verify-full") || !strings.Contains(uri, caPath) {
		t.Fatalf("the uri lacks sslmode=verify-full or %s", caPath)
	}
	connect := func(caPEM []byte) error {
		file := filepath.Join(t.TempDir(), "ca.crt")
		mustWrite(t, file, caPEM)
		cfg, err := pgx.ParseConfig(strings.Replace(uri, caPath, "sslrootcert="+file, 1))
		if err != nil {
			return err
		}
		if cfg.TLSConfig == nil || cfg.TLSConfig.ServerName != names.ReadWriteService()+"."+c.namespace {
			return fmt.Errorf("TLS %v: want the server verified as %s.%s", cfg.TLSConfig != nil, names.ReadWriteService(), c.namespace)
		}
		cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{c.instances[0].ip}, nil }
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return conn.Ping(ctx)
	}
	if err := connect(ca.Data["ca.crt"]); err != nil {
		t.Errorf("the uri with the cluster's CA: %v", err)
	}
	other, err := pki.NewCA("another CA", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := connect(other.CertPEM); err == nil {
		t.Errorf("the uri connected with a CA that did not issue the server's certificate")
	}
}
