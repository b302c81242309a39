package pg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// PgBouncerBin is where Debian's pgbouncer package puts its program; make test-quick
// installs it.
const PgBouncerBin = "/usr/sbin/pgbouncer"

// PgBouncer as the pooler runs it (docs/pooler.md): clients authenticated through
// auth_query by a role that can run the lookup function and nothing else; PAUSE lets a
// transaction in flight finish and holds the next query; RELOAD with another server and
// RESUME run that query on the other server, and the clients see no error, which is how
// a handover will look to a pooler's clients.
func TestPgBouncerPausesAndMoves(t *testing.T) {
	t.Parallel()
	dir := poolerDir(t)
	a, b := startPlainPostgres(t, filepath.Join(dir, "a")), startPlainPostgres(t, filepath.Join(dir, "b"))
	a.psql(t, "CREATE ROLE alice LOGIN PASSWORD 'alice-pw'")
	// b stands for a standby promoted: the same catalog, so the same SCRAM secret (the
	// pooler authenticates to the server with what the client's SCRAM exchange proved,
	// which only the same secret accepts).
	secret := a.text(t, "SELECT rolpassword FROM pg_authid WHERE rolname = 'alice'")
	b.psql(t, "CREATE ROLE alice LOGIN PASSWORD '"+secret+"'")
	for _, s := range []plainPostgres{a, b} {
		s.psql(t, "CREATE ROLE boss LOGIN SUPERUSER PASSWORD 'boss-pw'", "CREATE ROLE heir LOGIN PASSWORD 'heir-pw' IN ROLE boss",
			"CREATE ROLE maker LOGIN CREATEROLE PASSWORD 'maker-pw'", "SET password_encryption = 'md5'; CREATE ROLE old LOGIN PASSWORD 'old-pw'",
			"CREATE ROLE "+poolerauth.Role+" LOGIN PASSWORD 'pooler-pw'", "CREATE TABLE t (id int)", "GRANT ALL ON t TO alice")
		s.psql(t, poolerauth.SetupSQL()...)
	}

	// A schema pgpilot that a database owner made first is refused, not used.
	a.psql(t, "CREATE DATABASE squat OWNER alice")
	squat := append([]string{"SET ROLE alice; CREATE SCHEMA pgpilot; RESET ROLE"}, poolerauth.SetupSQL()...)
	out, err := asPostgres("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", a.socket, "-p", strconv.Itoa(a.port), "-U", "postgres",
		"-d", "squat", "-c", strings.Join(squat, ";\n")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not owned by a superuser") {
		t.Errorf("the lookup function's setup in a database whose owner made the schema pgpilot: %v\n%s", err, out)
	}

	run := filepath.Join(dir, "pooler")
	cfg := pgbouncer.Config{Server: "127.0.0.1", Port: a.port, Mode: pgbouncer.Transaction, PoolSize: 2, MaxClients: 100,
		Parameters: map[string]string{"query_wait_timeout": "60"}}
	ini, admin := startPgBouncer(t, run, &cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	write := func() {
		text, err := cfg.Render()
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, ini, []byte(text))
	}
	port := cfg.ListenPort

	client := func(user, password string) (*pgx.Conn, error) {
		c, err := pgx.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres sslmode=disable", port, user, password))
		if err != nil {
			return nil, err
		}
		c.DefaultQueryExecMode = pgx.QueryExecModeExec // no named statements in transaction mode
		return pgx.ConnectConfig(ctx, c)
	}
	serverPort := func(c *pgx.Conn) int {
		var p int
		if err := c.QueryRow(ctx, "SELECT inet_server_port()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for user, why := range map[string]string{"boss": "a superuser", "heir": "a member of a superuser role", "maker": "a role with CREATEROLE",
		"old": "a role with an md5 password"} {
		if c, err := client(user, user+"-pw"); err == nil {
			_ = c.Close(ctx)
			t.Errorf("%s, %s, logged in through the pooler; the lookup must not answer for one", user, why)
		}
	}
	if c, err := client("alice", "alice-pw"); err != nil {
		t.Fatalf("alice, an ordinary role, through the pooler: %v", err)
	} else {
		_ = c.Close(ctx)
	}
	if c, err := client(poolerauth.Role, "pooler-pw"); err == nil {
		_ = c.Close(ctx)
		t.Errorf("%s logged in through the pooler as a client", poolerauth.Role)
	}
	if c, err := client("pgpilot_admin", "admin-pw"); err == nil {
		_ = c.Close(ctx)
		t.Error("the admin logged in through the pooler's TCP port")
	}
	if c, err := client("alice", "wrong"); err == nil {
		_ = c.Close(ctx)
		t.Error("alice logged in with a wrong password")
	}
	one, err := client("alice", "alice-pw")
	if err != nil {
		t.Fatalf("alice through the pooler: %v", err)
	}
	defer one.Close(ctx)
	two, err := client("alice", "alice-pw")
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close(ctx)
	if p := serverPort(one); p != a.port {
		t.Fatalf("the pool goes to port %d, want %d", p, a.port)
	}
	var n int
	if err := two.QueryRow(ctx, "SELECT count(*) FROM pgpilot.pooler_lookup('boss')").Scan(&n); err == nil {
		t.Error("alice ran the lookup function")
	}

	// A transaction in flight: PAUSE waits for it.
	tx, err := one.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	paused := make(chan error, 1)
	go func() { paused <- admin.Pause(ctx) }()
	select {
	case err := <-paused:
		t.Fatalf("PAUSE returned with a transaction in flight: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the transaction in flight did not commit during PAUSE: %v", err)
	}
	select {
	case err := <-paused:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PAUSE did not return 10 s after the last transaction ended")
	}
	if err := admin.Pause(ctx); err != nil {
		t.Errorf("PAUSE of a paused PgBouncer: %v, want no error", err)
	}

	// Paused: a query waits, and runs on the new server once the pool moved.
	held := time.Now()
	ran := make(chan error, 1)
	go func() {
		_, err := two.Exec(ctx, "INSERT INTO t VALUES (2)")
		ran <- err
	}()
	select {
	case err := <-ran:
		t.Fatalf("a query ran while the pooler was paused: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	cfg.Port = b.port
	write()
	if err := admin.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.Resume(ctx); err != nil {
		t.Errorf("RESUME of a running PgBouncer: %v, want no error", err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("the held query failed after RESUME: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held query did not run 10 s after RESUME")
	}
	t.Logf("a query held %s by PAUSE ran after RELOAD and RESUME", time.Since(held).Round(time.Millisecond))
	for _, c := range []*pgx.Conn{one, two} {
		if p := serverPort(c); p != b.port {
			t.Errorf("after the move a client's queries go to port %d, want %d", p, b.port)
		}
	}
	if got := b.count(t, "SELECT count(*) FROM t WHERE id = 2"); got != 1 {
		t.Errorf("the held insert is on the new server %d times, want once", got)
	}
	if got := a.count(t, "SELECT count(*) FROM t WHERE id = 1"); got != 1 {
		t.Errorf("the insert committed before the pause is on the old server %d times, want once", got)
	}
	pools, err := admin.Pools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pools {
		if p.Database == "postgres" && p.User == "alice" {
			found = true
			if p.ClientsWaiting != 0 {
				t.Errorf("pool %+v: clients still waiting", p)
			}
		}
	}
	if !found {
		t.Errorf("SHOW POOLS has no pool of alice on postgres: %+v", pools)
	}
}

// plainPostgres is a postgres of its own, on 127.0.0.1, password logins over TCP.
type plainPostgres struct {
	socket string
	port   int
}

// startPlainPostgres initialises and starts a postgres in dir, stopped when the test ends.
func startPlainPostgres(t *testing.T, dir string) plainPostgres {
	t.Helper()
	mustMkdir(t, dir, 0o755)
	if err := os.Chown(dir, int(pgUID), int(pgGID)); err != nil {
		t.Fatal(err)
	}
	data, run := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	s := plainPostgres{socket: run, port: freeTCPPort(t)}
	if out, err := asPostgres("initdb", "-D", data, "--encoding=UTF8", "--locale=C", "--auth-local=peer", "--auth-host=scram-sha-256").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	mustMkdir(t, run, 0o755)
	if err := os.Chown(run, int(pgUID), int(pgGID)); err != nil {
		t.Fatal(err)
	}
	log := startLogged(t, asPostgres("postgres", "-D", data, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(s.port),
		"-c", "unix_socket_directories="+run, "-c", "fsync=off"))
	deadline := time.Now().Add(30 * time.Second)
	for asPostgres("pg_isready", "-h", run, "-p", strconv.Itoa(s.port)).Run() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not start:\n%s", log.bytes())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s
}

// psql runs each statement as the postgres superuser, through the socket.
// poolerDir is a directory of the test's under the run's work directory, which the
// postgres OS user can traverse; removed when the test ends.
func poolerDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(workDir, "pooler-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startPgBouncer fills in cfg's listening port, files, lookup role and admin, writes its
// files in run (created) and starts PgBouncer as the postgres OS user, stopped when the
// test ends; it returns the configuration file and an admin session (password
// "admin-pw"; the lookup role's is "pooler-pw").
func startPgBouncer(t *testing.T, run string, cfg *pgbouncer.Config) (string, *pgbouncer.Admin) {
	t.Helper()
	mustMkdir(t, run, 0o700)
	cfg.ListenPort, cfg.SocketDir = freeTCPPort(t), run
	cfg.AuthFile, cfg.HBAFile = filepath.Join(run, "users.txt"), filepath.Join(run, "hba.conf")
	cfg.AuthUser, cfg.AuthQuery, cfg.Admin = poolerauth.Role, poolerauth.Query, "pgpilot_admin"
	ini := filepath.Join(run, "pgbouncer.ini")
	text, err := cfg.Render()
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, ini, []byte(text))
	mustWrite(t, cfg.HBAFile, []byte(cfg.HBA()))
	mustWrite(t, cfg.AuthFile, []byte(pgbouncer.AuthFileLine(poolerauth.Role, "pooler-pw")+pgbouncer.AuthFileLine("pgpilot_admin", "admin-pw")))
	chownR(t, run)
	cmd := exec.Command(PgBouncerBin, ini)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	log := startLogged(t, cmd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", lastBytes(log.bytes(), 4000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		admin, err := pgbouncer.Dial(context.Background(), run, cfg.ListenPort, "pgpilot_admin", "admin-pw")
		if err == nil {
			t.Cleanup(func() { _ = admin.Close(context.Background()) })
			return ini, admin
		}
		if time.Now().After(deadline) {
			t.Fatalf("PgBouncer's admin console did not answer: %v\n%s", err, log.bytes())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s plainPostgres) psql(t *testing.T, statements ...string) {
	t.Helper()
	for _, sql := range statements {
		cmd := asPostgres("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", s.socket, "-p", strconv.Itoa(s.port),
			"-U", "postgres", "-d", "postgres", "-c", sql)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", sql, err, out)
		}
	}
}

// count runs a query that returns one number, as the postgres superuser.
func (s plainPostgres) count(t *testing.T, sql string) int {
	t.Helper()
	out := s.text(t, sql)
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("%s: %q", sql, out)
	}
	return n
}

// text runs a query that returns one value, as the postgres superuser.
func (s plainPostgres) text(t *testing.T, sql string) string {
	t.Helper()
	out, err := asPostgres("psql", "-X", "-At", "-h", s.socket, "-p", strconv.Itoa(s.port), "-U", "postgres", "-d", "postgres", "-c", sql).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("%s: %v\n%s", sql, err, exit.Stderr)
		}
		t.Fatal(err)
	}
	return string(bytes.TrimSpace(out))
}

// freeTCPPort is a port of 127.0.0.1 that nothing listened on a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
