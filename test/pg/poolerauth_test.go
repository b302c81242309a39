package pg

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/instance/pgsql"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// With a pooler configured, the primary's agent makes the pooler's lookup role (a login
// by certificate only, with nothing else) and sets up the lookup function in every
// database a client may connect to, template1 included, and in a database created later
// within seconds. The role logs in with a client certificate of the cluster's CA and
// reads an ordinary role's SCRAM secret, never the superuser's; a password does not let
// it in, not even one a superuser gave it; a locked-out primary refuses it. A database
// where the setup fails (a schema pgpilot its owner owns) is logged once, reported in
// PUT /roles' answer for it, and does not keep the others from being set up.
func TestPoolerLookupIsSetUpByThePrimary(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	p, standby := c.instances[0], c.instances[1]

	// Before a pooler is configured: a database whose owner owns a schema pgpilot, and
	// no lookup role.
	if err := p.superExec("CREATE DATABASE squat OWNER app TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	p.superQuery(t, "squat", "CREATE SCHEMA pgpilot AUTHORIZATION app")
	time.Sleep(3 * time.Second) // a pass or more of the primary's maintenance
	if n := p.superQuery(t, "postgres", "SELECT count(*) FROM pg_roles WHERE rolname = '"+poolerauth.Role+"'"); n != "0" {
		t.Fatalf("without a pooler configured, %s exists (%s)", poolerauth.Role, n)
	}

	pooler := map[string]any{"mode": "transaction", "poolSize": 10, "maxClientConnections": 100,
		"readWrite": c.name + "-pooler-rw", "headless": c.name + "-pooler-headless"}
	p.setConfigRead("pooler", pooler)
	start := time.Now()
	hasLookup := func(in *instance, db string) error {
		got, err := in.superQueryErr(db, `SELECT count(*) FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
			WHERE n.nspname = 'pgpilot' AND f.proname = 'pooler_lookup' AND f.prosecdef
			AND has_function_privilege('`+poolerauth.Role+`', f.oid, 'EXECUTE') AND NOT has_function_privilege('app', f.oid, 'EXECUTE')`)
		if err != nil {
			return err
		}
		if got != "1" {
			return fmt.Errorf("%s: database %s has no lookup function callable by %s alone", in.pod, db, poolerauth.Role)
		}
		return nil
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, db := range []string{"app", "postgres", "template1"} {
			if err := hasLookup(p, db); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("the lookup function was in app, postgres and template1 %s after the pooler was configured", time.Since(start).Round(10*time.Millisecond))
	role := p.superQuery(t, "postgres", `SELECT concat_ws(' ', rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolreplication,
		rolbypassrls, rolconnlimit, rolpassword IS NULL, (SELECT count(*) FROM pg_auth_members WHERE member = a.oid))
		FROM pg_authid a WHERE rolname = '`+poolerauth.Role+`'`)
	if want := fmt.Sprintf("t f f f f f f %d t 0", pgsql.PoolerConnectionLimit); role != want {
		t.Errorf("%s: login super createdb createrole inherit replication bypassrls connlimit no-password memberships = %q, want %q",
			poolerauth.Role, role, want)
	}
	// A standby has them by replication.
	testutil.Eventually(t, 10*time.Second, func() error { return hasLookup(standby, "app") })

	// A database created afterwards, from template0 (without the function template1
	// now gives every new database).
	if err := p.superExec("CREATE DATABASE later TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	testutil.Eventually(t, 10*time.Second, func() error { return hasLookup(p, "later") })
	t.Logf("a database created from template0 had the lookup function %s later", time.Since(created).Round(10*time.Millisecond))
	if err := p.superExec("CREATE DATABASE copied"); err != nil {
		t.Fatal(err)
	}
	if err := hasLookup(p, "copied"); err != nil {
		t.Errorf("a database created from template1: %v", err)
	}

	// The database where the setup fails: logged with the reason, and reported.
	const failed = "Could not set up the pooler's lookup function in a database"
	testutil.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(p.log.String(), failed) {
			return fmt.Errorf("%s's agent has not logged the failure in database squat", p.pod)
		}
		return nil
	})
	failedAt := time.Now()
	if !strings.Contains(p.log.String(), "is not owned by a superuser") {
		t.Errorf("the failure's log line does not say why:\n%s", lastBytes(p.log.Bytes(), 4000))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.api().ApplyRoles(ctx, agentapi.RolesRequest{Databases: []agentapi.Database{{Name: "app", Owner: "app"}, {Name: "squat", Owner: "app"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Databases) != 2 || res.Databases[0].Error != "" ||
		!strings.Contains(res.Databases[1].Error, "lookup function") || !strings.Contains(res.Databases[1].Error, "not owned by a superuser") {
		t.Errorf("PUT /roles' answer for databases app and squat: %+v; want no error for app, the lookup function's failure and why for squat", res.Databases)
	}

	// The lookup role, by its certificate: an ordinary role's SCRAM secret, nothing for
	// the superuser, no other catalog's secrets, in the database created later too.
	cert := c.issue(pki.Request{CommonName: poolerauth.Role, Usage: pki.Client})
	secret := p.superQuery(t, "postgres", "SELECT rolpassword FROM pg_authid WHERE rolname = 'app'")
	for _, db := range []string{"app", "later"} {
		err := p.asPooler(cert, db, func(ctx context.Context, conn *pgx.Conn) error {
			rows, err := conn.Query(ctx, poolerauth.Query, "app")
			if err != nil {
				return err
			}
			type entry struct{ Usename, Passwd string }
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[entry])
			if err != nil {
				return err
			}
			if len(got) != 1 || got[0].Usename != "app" || got[0].Passwd != secret || !strings.HasPrefix(secret, "SCRAM-SHA-256$") {
				return fmt.Errorf("the lookup of app: %+v; want its SCRAM secret", got)
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pgpilot.pooler_lookup('postgres')").Scan(&n); err != nil || n != 0 {
				return fmt.Errorf("the lookup of the superuser: %d rows (%v); want none", n, err)
			}
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_authid").Scan(&n); err == nil {
				return fmt.Errorf("%s read pg_authid", poolerauth.Role)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s by its certificate, in database %s: %v", poolerauth.Role, db, err)
		}
	}
	// Never in a template: a lookup session idle there would make CREATE DATABASE fail.
	if err := p.asPooler(cert, "template1", func(context.Context, *pgx.Conn) error { return nil }); err == nil {
		t.Errorf("%s logged in to template1", poolerauth.Role)
	}

	// A password, even one a superuser gave the role, lets it in nowhere.
	if err := p.superExec("ALTER ROLE " + poolerauth.Role + " PASSWORD 'pooler-pw'"); err != nil {
		t.Fatal(err)
	}
	if err := p.loginAs(poolerauth.Role, "pooler-pw", "app"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("%s with a password over TLS: %v; want refused for want of a certificate", poolerauth.Role, err)
	}
	plain, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=5432 dbname=app user=%s password=pooler-pw sslmode=disable connect_timeout=3", p.ip, poolerauth.Role))
	if err == nil {
		_ = plain.Close(ctx)
		t.Errorf("%s with a password without TLS logged in", poolerauth.Role)
	}
	local := asPostgres("psql", "-X", "-h", filepath.Join(p.dir, "run"), "-p", "5432", "-U", poolerauth.Role, "-d", "app", "-c", "SELECT 1")
	local.Env = append(local.Env, "PGPASSWORD=pooler-pw")
	if out, err := local.CombinedOutput(); err == nil || !strings.Contains(string(out), "pg_hba.conf rejects") {
		t.Errorf("%s with a password over the local socket: %v\n%s; want refused by pg_hba.conf", poolerauth.Role, err, out)
	}
	// Another pooler block: the agent sets everything up again, the role's password
	// gone, and says the failure again, once.
	pooler["mode"] = "session"
	p.setConfigRead("pooler", pooler)
	changed := time.Now()
	testutil.Eventually(t, 10*time.Second, func() error {
		got, err := p.superQueryErr("postgres", "SELECT rolpassword IS NULL FROM pg_authid WHERE rolname = '"+poolerauth.Role+"'")
		if err != nil || got != "t" {
			return fmt.Errorf("%s still has the password a superuser gave it (%v)", poolerauth.Role, err)
		}
		return nil
	})
	// Tried again every 30 s: logged once all the same.
	time.Sleep(time.Until(changed.Add(36 * time.Second)))
	if n := strings.Count(p.log.String(), failed); n != 2 {
		t.Errorf("the failure in database squat was logged %d times over %s; want once before the pooler block changed and once after",
			n, time.Since(failedAt).Round(time.Second))
	}

	// A locked-out primary refuses the lookup role: the pooler takes its session as the
	// sign that the primary accepts writes.
	p.proxy.setCut(true)
	standby.kill9()
	testutil.Eventually(t, 3*primarylease.Duration+10*time.Second, func() error {
		st, err := p.status()
		if err != nil || !st.LockedOut {
			return fmt.Errorf("the primary cut off from the API server and its standby: lockedOut %v (%v)", st.LockedOut, err)
		}
		return nil
	})
	// lockedOut says the locked-out file is written and a reload sent: the postmaster
	// loads it a moment later (on a loaded machine, after a login or two, whose sessions
	// the lockout's next tick terminates).
	testutil.Eventually(t, 5*time.Second, func() error {
		err := p.asPooler(cert, "app", func(context.Context, *pgx.Conn) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "pg_hba.conf") {
			return fmt.Errorf("%s on a locked-out primary: %v; want refused by pg_hba.conf", poolerauth.Role, err)
		}
		return nil
	})
	p.proxy.setCut(false)
	testutil.Eventually(t, 30*time.Second, func() error {
		return p.asPooler(cert, "app", func(context.Context, *pgx.Conn) error { return nil })
	})
}

// asPooler runs f on a session of the pooler's lookup role in database, logged in with
// its client certificate over TLS.
func (in *instance) asPooler(cert *pki.KeyPair, database string, f func(ctx context.Context, conn *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=%s user=%s sslmode=require connect_timeout=3", in.ip, database, poolerauth.Role))
	if err != nil {
		return err
	}
	cfg.TLSConfig.Certificates = []tls.Certificate{pair}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(ctx, conn)
}

// superQueryErr runs a query that returns one value as the superuser, over the local
// socket, in database.
func (in *instance) superQueryErr(database, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "runuser", "-u", "postgres", "--", filepath.Join(PGBin, "psql"), "-X", "-At",
		"-v", "ON_ERROR_STOP=1", "-h", filepath.Join(in.dir, "run"), "-p", "5432", "-U", "postgres", "-d", database, "-c", sql)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		return "", fmt.Errorf("psql as the superuser in %s: %w: %s", database, err, stderr)
	}
	return strings.TrimSpace(string(out)), nil
}

// superQuery is superQueryErr, and ends the test if it fails.
func (in *instance) superQuery(t *testing.T, database, sql string) string {
	t.Helper()
	out, err := in.superQueryErr(database, sql)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
