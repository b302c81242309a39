package pooler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
)

// Bouncer is a Pool on a running PgBouncer: its configuration file, rewritten to
// move the pool, and its admin console, a session per command.
type Bouncer struct {
	// Config is the configuration; Point changes its Server.
	Config pgbouncer.Config
	// Ini is the configuration file PgBouncer was started with.
	Ini string
	// Address is a pod's address (its name in the headless Service).
	Address func(pod string) string
	// AdminPassword is Config.Admin's, from the auth file.
	AdminPassword string
	// PauseTimeout bounds PAUSE, which waits for the queries in flight: one stuck on a
	// primary that died would hold it for as long as TCP takes to notice. Past it the
	// pool counts as paused (PgBouncer holds new queries from the moment it is asked),
	// and the move goes on; those queries fail, as they would without a pooler.
	PauseTimeout time.Duration

	// mu serialises the configuration's changes: a move and a change of settings.
	mu sync.Mutex
	// rendered is the file as last written (Written); written, whether it was.
	rendered string
	written  bool
}

// adminTimeout bounds a session on the admin console and each command but PAUSE
// (PauseTimeout): a PgBouncer that stopped answering must not hold the follower.
const adminTimeout = 5 * time.Second

// Pause implements Pool.
func (b *Bouncer) Pause(ctx context.Context) error {
	return b.admin(ctx, func(a *pgbouncer.Admin, ctx context.Context) error { return b.pause(ctx, a) })
}

// pause sends PAUSE on a.
func (b *Bouncer) pause(ctx context.Context, a *pgbouncer.Admin) error {
	// The deadline bounds the wait for PAUSE's answer only: once the command is sent,
	// PgBouncer pauses whether or not the answer comes in time. (pgx's default on a
	// deadline closes the connection and sends PgBouncer no cancel request, which
	// would resume it.)
	pctx, cancel := context.WithTimeout(ctx, b.PauseTimeout)
	defer cancel()
	err := a.Pause(pctx)
	if err != nil && errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return nil
	}
	return err
}

// Resume implements Pool.
func (b *Bouncer) Resume(ctx context.Context) error { return b.admin(ctx, (*pgbouncer.Admin).Resume) }

// Point implements Pool: the configuration with the pool's server at pod, written
// whole (a rename) and reloaded. PgBouncer closes the server connections to the old
// address as they are released.
func (b *Bouncer) Point(ctx context.Context, pod string) error {
	return b.Configure(ctx, func(c *pgbouncer.Config) { c.Server = b.Address(pod) })
}

// Configure changes the configuration with change, writes it whole (a rename) and
// reloads it; a configuration that does not render is refused and the file left.
// Config is read under the same lock: read it through Current once PgBouncer runs.
// A configuration that renders as the one in force is neither written nor reloaded: a
// RELOAD may recycle PgBouncer's server connections.
func (b *Bouncer) Configure(ctx context.Context, change func(*pgbouncer.Config)) error {
	changed, err := b.write(change)
	if err != nil || !changed {
		return err
	}
	return b.admin(ctx, (*pgbouncer.Admin).Reload)
}

func (b *Bouncer) write(change func(*pgbouncer.Config)) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cfg := b.Config
	change(&cfg)
	text, err := cfg.Render()
	if err != nil {
		return false, err
	}
	if b.written && b.rendered == text {
		return false, nil
	}
	if err := replaceFile(b.Ini, []byte(text)); err != nil {
		return false, err
	}
	b.Config, b.rendered, b.written = cfg, text, true
	return true, nil
}

// Written records that PgBouncer was started with text as its configuration file.
func (b *Bouncer) Written(text string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rendered, b.written = text, true
}

// Current is the configuration as last written.
func (b *Bouncer) Current() pgbouncer.Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Config
}

// Reload makes PgBouncer read its files again: its certificates, once renewed.
func (b *Bouncer) Reload(ctx context.Context) error { return b.admin(ctx, (*pgbouncer.Admin).Reload) }

// Dial opens a session on PgBouncer's admin console.
func (b *Bouncer) Dial(ctx context.Context) (*pgbouncer.Admin, error) {
	b.mu.Lock()
	socket, port, user := b.Config.SocketDir, b.Config.ListenPort, b.Config.Admin
	b.mu.Unlock()
	return pgbouncer.Dial(ctx, socket, port, user, b.AdminPassword)
}

func (b *Bouncer) admin(ctx context.Context, cmd func(*pgbouncer.Admin, context.Context) error) error {
	// PAUSE is bounded by its own timeout (pause), which must not be cut short here.
	ctx, cancel := context.WithTimeout(ctx, adminTimeout+b.PauseTimeout)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, adminTimeout)
	a, err := b.Dial(dctx)
	dcancel()
	if err != nil {
		return err
	}
	defer a.Close(context.WithoutCancel(ctx))
	return cmd(a, ctx)
}

// Probe says whether a pod accepts writes: a session as User, straight to the pod's
// address, finds postgres out of recovery. An instance that is not yet confirmed as
// the primary refuses every session (its lockout), so a yes means clients can write.
type Probe struct {
	Address        func(pod string) string
	Port           int
	User, Password string
	// Database is where the session goes.
	Database string
	// SSLMode and SSLRootCert are libpq's: verify-full with the cluster's CA in a pod.
	// SSLCert and SSLKey are the client certificate User logs in with (in a pod, the
	// pooler's: pg_hba.conf's cert method, no Password).
	SSLMode, SSLRootCert string
	SSLCert, SSLKey      string
	// Timeout bounds one probe.
	Timeout time.Duration
}

// Writable implements Follower.Writable.
func (p Probe) Writable(ctx context.Context, pod string) bool {
	cctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	cfg := p.config(pod)
	if cfg == nil {
		return false
	}
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var recovery bool
	if err := conn.QueryRow(cctx, "SELECT pg_catalog.pg_is_in_recovery()").Scan(&recovery); err != nil {
		return false
	}
	return !recovery
}

// config is the probe's connection to pod; nil when the settings do not parse. The
// address goes in the settings, not after them: pgx derives the TLS server name that
// verify-full checks from the host it parses.
func (p Probe) config(pod string) *pgx.ConnConfig {
	settings := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=%s", quote(p.Address(pod)), p.Port, quote(p.User), quote(p.Database), quote(p.SSLMode))
	if p.SSLRootCert != "" {
		settings += " sslrootcert=" + quote(p.SSLRootCert)
	}
	if p.SSLCert != "" {
		settings += " sslcert=" + quote(p.SSLCert) + " sslkey=" + quote(p.SSLKey)
	}
	cfg, err := pgx.ParseConfig(settings)
	if err != nil {
		return nil
	}
	cfg.Password = p.Password
	cfg.ConnectTimeout = p.Timeout
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return cfg
}

// quote is a libpq keyword value in single quotes.
func quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// replaceFile writes path anew by a rename, so that PgBouncer never reads half of it,
// with the mode and owner the file had.
func replaceFile(path string, b []byte) error {
	old, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	if err := os.WriteFile(tmp, b, old.Mode().Perm()); err != nil {
		return err
	}
	if st, ok := old.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		if err := os.Chown(tmp, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	return os.Rename(tmp, path)
}
