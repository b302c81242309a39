package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

// LeaseSource is where the agent learns who is primary.
type LeaseSource interface {
	View() LeaseView
	// LastSeen is when the API server last answered.
	LastSeen() time.Time
	Changed() <-chan struct{}
	Refresh(ctx context.Context) (LeaseView, error)
}

// Agent supervises one instance. Its Run loop is the only place postgres is started,
// stopped, promoted or rewound; the HTTP API's requests are carried out by that loop.
type Agent struct {
	cfg     Config
	cluster ClusterConfig
	creds   Credentials
	pg      *Postgres
	db      *DB
	lease   LeaseSource
	log     logr.Logger

	requests chan request

	mu        sync.Mutex
	proc      *Process
	role      string    // an agentapi.Role* constant
	upstream  string    // the primary a standby streams from
	fenced    bool      // stopped on request; stays down while the Lease still names it
	isolated  bool      // stopped because it reached neither the API server nor a peer
	alone     time.Time // since when a primary reached neither; zero while it reaches one
	lastErr   string
	crashes   int
	slotsDone time.Time
	// walGone is since when this standby's WAL receiver has been failing because the
	// primary no longer has the WAL it needs; zero while it is not.
	walGone  time.Time
	recovery *Recovery // set while restoring from a backup
	backups  map[string]*backupJob
	runCtx   context.Context // Run's context: background work ends with it
}

type request struct {
	action string
	done   chan error
}

// New returns an agent for cfg.
func New(cfg Config, cluster ClusterConfig, creds Credentials, lease LeaseSource, log logr.Logger) *Agent {
	passfile := cfg.SocketDir + "/.pgpass-pgpilot"
	return &Agent{
		cfg: cfg, cluster: cluster, creds: creds, lease: lease, log: log,
		pg:       &Postgres{BinDir: cfg.BinDir, PGData: cfg.PGData, Env: []string{"PGPASSFILE=" + passfile, "PGCONNECT_TIMEOUT=5"}},
		db:       &DB{SocketDir: cfg.SocketDir, Port: cfg.Port, User: creds.Superuser.Username},
		requests: make(chan request),
		role:     agentapi.RoleStopped,
		backups:  map[string]*backupJob{},
		runCtx:   context.Background(),
	}
}

func (a *Agent) passFile() string { return a.cfg.SocketDir + "/.pgpass-pgpilot" }

// Run supervises postgres until ctx ends, then stops it within cfg.ShutdownTimeout.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	a.runCtx = ctx
	a.mu.Unlock()
	if err := writeFileAtomic(a.passFile(), []byte(PassFile(a.creds)), 0o600); err != nil {
		return fmt.Errorf("writing the pgpass file: %w", err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var retryAt time.Time
	for {
		if time.Now().After(retryAt) {
			if err := a.step(ctx); err != nil {
				a.setErr(err)
				delay := a.backoff()
				a.log.Error(err, "Instance step failed", "retryIn", delay.String())
				retryAt = time.Now().Add(delay)
			} else {
				a.setErr(nil)
			}
		}
		var procDone <-chan struct{}
		if p := a.process(); p != nil {
			procDone = p.Done()
		}
		select {
		case <-ctx.Done():
			a.stop(false)
			return nil
		case <-a.lease.Changed():
			retryAt = time.Time{}
		case <-procDone:
			a.postmasterExited()
		case r := <-a.requests:
			r.done <- a.handle(ctx, r.action)
			retryAt = time.Time{}
		case <-tick.C:
		}
	}
}

// backoff grows with consecutive failures: 1 s, 2 s, 4 s ... up to 30 s.
func (a *Agent) backoff() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.crashes++
	d := time.Second << min(a.crashes-1, 5)
	return min(d, 30*time.Second)
}

func (a *Agent) setErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		a.lastErr = ""
		return
	}
	a.lastErr = err.Error()
}

func (a *Agent) process() *Process {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc
}

func (a *Agent) setState(p *Process, role, upstream string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proc, a.role, a.upstream = p, role, upstream
}

func (a *Agent) postmasterExited() {
	p := a.process()
	a.log.Error(p.Err(), "Postgres exited unexpectedly; restarting it", "ranFor", time.Since(p.Started).Round(time.Millisecond).String())
	a.setState(nil, agentapi.RoleStopped, "")
	if time.Since(p.Started) > time.Minute {
		a.mu.Lock()
		a.crashes = 0
		a.mu.Unlock()
	}
}

// step moves the instance one step towards what the Lease says.
func (a *Agent) step(ctx context.Context) error {
	view := a.lease.View()
	if !view.Known {
		return nil // the API server has not answered yet; change nothing
	}
	me := view.Holder == a.cfg.PodName
	a.mu.Lock()
	proc, role, upstream, fenced := a.proc, a.role, a.upstream, a.fenced
	a.mu.Unlock()

	if err := a.reloadClusterConfig(ctx, proc != nil, role, upstream); err != nil {
		return err
	}
	if proc != nil {
		switch {
		case role == agentapi.RolePrimary && !me && view.Holder != "":
			// Stopping a primary is costly: confirm with a fresh read first. When the
			// API server cannot answer, the last view stands: it named another primary.
			if fresh, err := a.lease.Refresh(ctx); err == nil && (fresh.Holder == a.cfg.PodName || fresh.Holder == "") {
				return nil
			}
			a.log.Info("The Lease names another primary; stopping to rejoin as its replica", "primary", view.Holder)
			a.stop(true)
			return nil
		case role == agentapi.RoleReplica && me:
			return a.promote(ctx)
		case role == agentapi.RoleReplica && view.Holder != "" && view.Holder != upstream:
			return a.follow(ctx, view.Holder)
		case role == agentapi.RoleReplica:
			return a.maintainStandby(ctx, proc, upstream)
		case role == agentapi.RolePrimary:
			if a.isolatedTooLong(ctx) {
				a.log.Info("Isolated: neither the API server nor any other instance answered; stopped accepting writes",
					"for", a.cfg.IsolationTimeout.String())
				a.stop(true)
				a.mu.Lock()
				a.isolated, a.role = true, agentapi.RoleFenced
				a.mu.Unlock()
				return nil
			}
			return a.maintainPrimary(ctx)
		}
		return nil
	}
	a.mu.Lock()
	isolated := a.isolated
	a.mu.Unlock()
	if isolated {
		if time.Since(a.lease.LastSeen()) > a.cfg.IsolationTimeout {
			return nil // still cut off: stay down
		}
		a.log.Info("The API server answers again; following the Lease")
		a.mu.Lock()
		a.isolated, a.alone = false, time.Time{}
		a.mu.Unlock()
	}
	if fenced && me {
		return nil // stays down until the Lease names another primary
	}
	if view.Holder == "" {
		return nil
	}
	a.mu.Lock()
	a.fenced = false
	a.mu.Unlock()
	if err := a.checkMajor(ctx); err != nil {
		return err
	}
	state, err := a.pg.State()
	if err != nil {
		return err
	}
	a.setState(nil, agentapi.RoleStarting, "")
	if me {
		return a.startPrimary(ctx, state, view)
	}
	return a.startStandby(ctx, state, view.Holder)
}

// reloadClusterConfig re-reads the cluster configuration (the ConfigMap the kubelet
// updates in place); the next start uses it, and a running postgres in a settled role
// gets a rewritten postgresql.conf and a reload. A broken file keeps the configuration
// in force and is reported.
func (a *Agent) reloadClusterConfig(ctx context.Context, running bool, role, upstream string) error {
	next, err := LoadClusterConfig(a.cfg.ClusterConfigPath)
	if err != nil {
		return fmt.Errorf("keeping the running configuration: %w", err)
	}
	if reflect.DeepEqual(next, a.cluster) {
		return nil
	}
	a.mu.Lock()
	a.cluster = next
	a.mu.Unlock()
	a.slotsDone = time.Time{}
	a.log.Info("The cluster configuration changed", "replicas", next.Replicas, "synchronousReplicas", next.SynchronousReplicas)
	if !running || (role != agentapi.RolePrimary && role != agentapi.RoleReplica) {
		return nil
	}
	as := AsPrimary
	if role == agentapi.RoleReplica {
		as = AsStandby
	}
	if err := a.pg.WriteConfig(a.confInput(as, upstream)); err != nil {
		return err
	}
	return a.db.Reload(ctx)
}

// checkMajor refuses a data directory of another major version than the binaries: no
// in-place major upgrade exists yet, and postgres would refuse it less clearly.
func (a *Agent) checkMajor(ctx context.Context) error {
	data, err := a.pg.Major()
	if err != nil {
		return nil // no data directory yet
	}
	out, err := exec.CommandContext(ctx, a.pg.bin("postgres"), "--version").Output()
	if err != nil {
		return fmt.Errorf("running postgres --version: %w", err)
	}
	fields := strings.Fields(string(out)) // "postgres (PostgreSQL) 15.10 (Debian 15.10-0+deb12u1)"
	if len(fields) < 3 {
		return fmt.Errorf("cannot read the version from %q", out)
	}
	bin := strings.SplitN(fields[2], ".", 2)[0]
	if bin != data {
		return fmt.Errorf("the data directory is PostgreSQL %s but this image runs PostgreSQL %s: in-place major version upgrades are not supported yet; set spec.version back to %q", data, bin, data)
	}
	return nil
}

func (a *Agent) confInput(role Role, upstream string) ConfInput {
	return ConfInput{
		Cluster: a.cluster, Pod: a.cfg.PodName, Listen: a.cfg.ListenAddress, Port: a.cfg.Port,
		Socket: a.cfg.SocketDir, Role: role, PrimaryHost: a.cfg.PeerHost(upstream),
		PassFile: a.passFile(), ReplicationUser: a.creds.Replication.Username,
		Commands: a.commands(), Recovery: a.recovery,
	}
}

func (a *Agent) startPrimary(ctx context.Context, state DataState, view LeaseView) error {
	fresh := false
	switch state {
	case DataEmpty:
		if view.Bootstrapped {
			return errors.New("the Lease names this instance primary of a cluster that was bootstrapped before, but its data directory is empty: refusing to initialise a new, empty database over a lost volume; move the primary to an instance that has the data")
		}
		if a.cluster.Restore != nil {
			if err := a.restoreFromBackup(ctx); err != nil {
				return err
			}
			return a.startRestored(ctx)
		}
		a.log.Info("Initialising a new cluster")
		if err := a.pg.InitDB(ctx, a.creds.Superuser); err != nil {
			return err
		}
		fresh = true
	case DataStandby:
		a.log.Info("Starting a former replica as primary")
	case DataPrimary:
		if a.pg.Recovering() && a.cluster.Restore != nil {
			a.log.Info("Resuming the recovery from the backup")
			return a.startRestored(ctx)
		}
	}
	if err := a.pg.WriteConfig(a.confInput(AsPrimary, "")); err != nil {
		return err
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	return a.finishPrimaryStart(ctx, fresh)
}

// startRestored starts the cluster's first primary on a restored data directory:
// recover to the target, then finish as any new primary does. A recovery interrupted
// (the agent restarted, postgres exited) resumes here: recovery.signal stays until
// postgres leaves recovery.
func (a *Agent) startRestored(ctx context.Context) error {
	r := a.cluster.Restore
	a.recovery = &Recovery{TargetTime: r.TargetTime, TargetLSN: r.TargetLSN}
	defer func() { a.recovery = nil }()
	if err := a.pg.WriteConfig(a.confInput(AsPrimary, "")); err != nil {
		return err
	}
	start := time.Now()
	if err := a.start(ctx); err != nil {
		return err
	}
	if err := a.waitRecovered(ctx); err != nil {
		return err
	}
	a.log.Info("Recovered from the backup", "took", time.Since(start).Round(time.Millisecond).String())
	// The restore settings go: this instance must never read the source's archive again.
	a.recovery = nil
	if err := a.pg.WriteConfig(a.confInput(AsPrimary, "")); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	return a.finishPrimaryStart(ctx, true)
}

// finishPrimaryStart runs on a primary that accepts connections: roles, database and
// passwords, slots, then the primary role.
func (a *Agent) finishPrimaryStart(ctx context.Context, fresh bool) error {
	// Until the bootstrap marker exists the roles and database may be missing or half
	// made (an agent stopped midway): create what is missing, then mark it done.
	if fresh || !a.pg.Bootstrapped() {
		if err := a.db.Bootstrap(ctx, a.cluster.Bootstrap, a.creds); err != nil {
			return err
		}
		if err := a.pg.MarkBootstrapped(); err != nil {
			return err
		}
		a.log.Info("Bootstrapped the cluster", "database", a.cluster.Bootstrap.Database, "owner", a.cluster.Bootstrap.Owner)
	}
	changed, err := a.db.SyncPasswords(ctx, a.creds)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		a.log.Info("Set passwords from the credentials Secrets", "roles", changed)
	}
	a.slotsDone = time.Time{}
	if err := a.maintainPrimary(ctx); err != nil {
		return err
	}
	a.setState(a.process(), agentapi.RolePrimary, "")
	return nil
}

func (a *Agent) startStandby(ctx context.Context, state DataState, primary string) error {
	host := a.cfg.PeerHost(primary)
	switch state {
	case DataEmpty:
		a.log.Info("Cloning from the primary", "primary", primary)
		if err := a.pg.BaseBackup(ctx, host, a.cfg.Port, a.creds.Replication.Username); err != nil {
			return fmt.Errorf("cloning from %s: %w", primary, err)
		}
	case DataPrimary:
		// pg_rewind reads the source's control file: before the new primary has finished
		// promoting (its checkpoint on the new timeline), it would compute the wrong
		// divergence point.
		if err := a.waitPromoted(ctx, primary); err != nil {
			return err
		}
		a.log.Info("Rewinding a former primary to follow the new one", "primary", primary)
		said, err := a.pg.Rewind(ctx, host, a.cfg.Port, a.creds.Replication.Username)
		if err != nil {
			a.log.Error(err, "Rewind failed; cloning again", "primary", primary)
			if err := a.reclone(ctx, host, primary); err != nil {
				return err
			}
		} else {
			a.log.Info("Rewound", "pgRewind", said)
		}
	}
	return a.runStandby(ctx, primary)
}

// walGoneFor is how long a standby's WAL receiver may fail for WAL its primary no longer
// has before the standby is cloned again: long enough for several retries (500 ms
// apart), short enough that a cluster is not left without the standby for long.
const walGoneFor = 15 * time.Second

// maintainStandby clones a running standby again when it cannot catch up: its WAL
// receiver keeps failing because the primary has removed WAL the standby still needs
// (after several timeline switches within one WAL segment, say, which PostgreSQL's
// walsender cannot serve, or a standby away for longer than its slot existed) and
// there is no archive to restore it from. Without this it would stay a replica that
// never streams again.
func (a *Agent) maintainStandby(ctx context.Context, proc *Process, primary string) error {
	if !walRemovedUpstream(proc.tail.String()) {
		a.walGone = time.Time{}
		return nil
	}
	streaming, err := a.db.Streaming(ctx)
	if err != nil || streaming {
		a.walGone = time.Time{}
		return err
	}
	if a.walGone.IsZero() {
		a.walGone = time.Now()
		a.log.Info("The primary no longer has the WAL this standby needs", "primary", primary)
	}
	if time.Since(a.walGone) < walGoneFor {
		return nil
	}
	a.walGone = time.Time{}
	a.log.Info("Cloning again: the primary no longer has the WAL this standby needs", "primary", primary, "waited", walGoneFor.String())
	a.stop(true)
	if err := a.reclone(ctx, a.cfg.PeerHost(primary), primary); err != nil {
		return err
	}
	return a.runStandby(ctx, primary)
}

// walRemovedUpstream reports whether postgres's last FATAL message in log is the WAL
// receiver's "requested WAL segment ... has already been removed": the primary no longer
// has WAL this standby needs. Any later FATAL (the primary restarting, say) means the
// standby is waiting for something else.
func walRemovedUpstream(log string) bool {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "FATAL:") {
			return strings.Contains(lines[i], "requested WAL segment") && strings.Contains(lines[i], "has already been removed")
		}
	}
	return false
}

// runStandby writes the standby configuration for primary and starts postgres as its
// replica.
func (a *Agent) runStandby(ctx context.Context, primary string) error {
	if err := a.pg.WriteConfig(a.confInput(AsStandby, primary)); err != nil {
		return err
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	a.setState(a.process(), agentapi.RoleReplica, primary)
	return nil
}

// waitPromoted returns nil once primary's agent reports it a ready primary (its role is
// set only after pg_promote and the checkpoint that follows); an error otherwise, so the
// step is retried.
func (a *Agent) waitPromoted(ctx context.Context, primary string) error {
	url := "http://" + net.JoinHostPort(a.cfg.PeerHost(primary), strconv.Itoa(a.cfg.AgentPort))
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := agentapi.NewClient(url, "", nil).Status(sctx)
		cancel()
		if err == nil && st.Role == agentapi.RolePrimary && st.Ready {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s to finish its promotion before rewinding: role %q, %v", primary, st.Role, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// reclone replaces a data directory that cannot be rewound. The old one is kept aside
// until the new clone is complete, then removed.
func (a *Agent) reclone(ctx context.Context, host, primary string) error {
	aside := fmt.Sprintf("%s.rewind-failed-%d", a.cfg.PGData, time.Now().Unix())
	if err := os.Rename(a.cfg.PGData, aside); err != nil {
		return err
	}
	if err := a.pg.BaseBackup(ctx, host, a.cfg.Port, a.creds.Replication.Username); err != nil {
		if restore := os.Rename(aside, a.cfg.PGData); restore != nil {
			return errors.Join(fmt.Errorf("cloning from %s: %w", primary, err), restore)
		}
		return fmt.Errorf("cloning from %s: %w", primary, err)
	}
	return os.RemoveAll(aside)
}

// start starts postgres and waits until it accepts connections. The role stays
// "starting" until the caller has finished what the role needs.
func (a *Agent) start(ctx context.Context) error {
	proc, err := a.pg.Start()
	if err != nil {
		return err
	}
	a.setState(proc, agentapi.RoleStarting, "")
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := a.db.Ping(pingCtx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-proc.Done():
			a.setState(nil, agentapi.RoleStopped, "")
			if why := proc.Complaint(); why != "" {
				return fmt.Errorf("postgres exited while starting: %s", why)
			}
			return fmt.Errorf("postgres exited while starting: %v", proc.Err())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	a.mu.Lock()
	a.crashes = 0
	a.mu.Unlock()
	a.log.Info("Postgres is up", "pid", proc.Pid())
	return nil
}

// stop stops postgres; fast skips the smart phase (a demotion must not wait for clients).
func (a *Agent) stop(fast bool) {
	p := a.process()
	if p == nil {
		return
	}
	p.Stop(a.cfg.ShutdownTimeout, fast)
	a.setState(nil, agentapi.RoleStopped, "")
	a.log.Info("Postgres stopped")
}

func (a *Agent) promote(ctx context.Context) error {
	a.log.Info("Promoting")
	start := time.Now()
	if err := a.db.Promote(ctx); err != nil {
		return fmt.Errorf("promoting: %w", err)
	}
	// Recovery ended: the config must not make it a standby at its next start.
	if err := a.pg.WriteConfig(a.confInput(AsPrimary, "")); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	a.setState(a.process(), agentapi.RolePrimary, "")
	a.log.Info("Promoted", "took", time.Since(start).Round(time.Millisecond).String())
	a.slotsDone = time.Time{}
	return a.maintainPrimary(ctx)
}

// follow points a running standby at a new primary; primary_conninfo reloads without a
// restart.
func (a *Agent) follow(ctx context.Context, primary string) error {
	if err := a.pg.WriteConfig(a.confInput(AsStandby, primary)); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	a.setState(a.process(), agentapi.RoleReplica, primary)
	a.log.Info("Following a new primary", "primary", primary)
	return nil
}

// isolatedTooLong reports whether this primary has reached neither the API server nor
// any other instance for longer than the isolation timeout. A primary that still
// reaches a peer keeps serving while the API server is away: a failover needs the API
// server, so none can happen behind its back.
func (a *Agent) isolatedTooLong(ctx context.Context) bool {
	if a.cfg.IsolationTimeout <= 0 || a.cluster.Replicas < 2 {
		return false
	}
	if time.Since(a.lease.LastSeen()) < a.cfg.IsolationTimeout || a.reachesPeer(ctx) {
		a.alone = time.Time{}
		return false
	}
	if a.alone.IsZero() {
		a.alone = time.Now()
		a.log.Info("Reaching neither the API server nor any other instance")
	}
	return time.Since(a.alone) >= a.cfg.IsolationTimeout
}

// reachesPeer reports whether any other instance's agent accepts a connection.
func (a *Agent) reachesPeer(ctx context.Context) bool {
	d := net.Dialer{Timeout: 500 * time.Millisecond}
	for i := range a.cluster.Replicas {
		pod := fmt.Sprintf("%s-%d", a.cluster.ClusterName, i)
		if pod == a.cfg.PodName {
			continue
		}
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a.cfg.PeerHost(pod), strconv.Itoa(a.cfg.AgentPort)))
		if err == nil {
			conn.Close()
			return true
		}
	}
	return false
}

// maintainPrimary keeps a slot for every other instance, every 10 s at most.
func (a *Agent) maintainPrimary(ctx context.Context) error {
	if time.Since(a.slotsDone) < 10*time.Second {
		return nil
	}
	var want []string
	for i := range a.cluster.Replicas {
		pod := fmt.Sprintf("%s-%d", a.cluster.ClusterName, i)
		if pod != a.cfg.PodName {
			want = append(want, SlotName(pod))
		}
	}
	created, dropped, err := a.db.EnsureSlots(ctx, want)
	if err != nil {
		return err
	}
	if len(created)+len(dropped) > 0 {
		a.log.Info("Replication slots changed", "created", created, "dropped", dropped)
	}
	a.slotsDone = time.Now()
	return nil
}

// handle carries out an API request inside the Run loop.
func (a *Agent) handle(ctx context.Context, action string) error {
	a.mu.Lock()
	role := a.role
	a.mu.Unlock()
	switch action {
	case "promote":
		if role == agentapi.RolePrimary {
			return nil
		}
		if role != agentapi.RoleReplica {
			return fmt.Errorf("%w: postgres is %s, not a running replica", agentapi.ErrConflict, role)
		}
		// The watch may lag behind the sidecar's Lease update: read it now, and never
		// promote an instance the Lease does not name.
		view, err := a.lease.Refresh(ctx)
		if err != nil {
			return fmt.Errorf("reading the primary Lease before promoting: %w", err)
		}
		if view.Holder != a.cfg.PodName {
			return fmt.Errorf("%w: the Lease names %q as primary, not this instance", agentapi.ErrConflict, view.Holder)
		}
		return a.promote(ctx)
	case "fence", "demote":
		a.mu.Lock()
		a.fenced = true
		a.mu.Unlock()
		if role == agentapi.RoleReplica {
			return nil
		}
		a.stop(true)
		a.mu.Lock()
		a.role = agentapi.RoleFenced
		a.mu.Unlock()
		return nil
	}
	return fmt.Errorf("unknown action %q", action)
}

func (a *Agent) do(ctx context.Context, action string) error {
	r := request{action: action, done: make(chan error, 1)}
	select {
	case a.requests <- r:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Promote implements agentapi.Instance.
func (a *Agent) Promote(ctx context.Context) error { return a.do(ctx, "promote") }

// Fence implements agentapi.Instance: postgres stops at once and stays down while the
// Lease still names this instance.
func (a *Agent) Fence(ctx context.Context) error { return a.do(ctx, "fence") }

// Demote implements agentapi.Instance: a fast shutdown, in which postgres sends every
// WAL record to the connected standbys before it exits, then down as with Fence.
func (a *Agent) Demote(ctx context.Context) error { return a.do(ctx, "demote") }

// Ready implements agentapi.Instance.
func (a *Agent) Ready(ctx context.Context) error {
	a.mu.Lock()
	role := a.role
	a.mu.Unlock()
	if role != agentapi.RolePrimary && role != agentapi.RoleReplica {
		return fmt.Errorf("postgres is %s", role)
	}
	inRecovery, err := a.db.InRecovery(ctx)
	if err != nil {
		return err
	}
	if inRecovery != (role == agentapi.RoleReplica) {
		return fmt.Errorf("postgres is not yet in its %s role", role)
	}
	return nil
}

// Status implements agentapi.Instance.
func (a *Agent) Status(ctx context.Context) agentapi.Status {
	a.mu.Lock()
	st := agentapi.Status{Pod: a.cfg.PodName, Role: a.role, Fenced: a.fenced, Error: a.lastErr}
	if a.proc != nil {
		st.Running = true
		started := a.proc.Started
		st.StartedAt = &started
	}
	a.mu.Unlock()
	if st.Running && (st.Role == agentapi.RolePrimary || st.Role == agentapi.RoleReplica) {
		if err := a.db.Observe(ctx, &st); err != nil {
			st.Error = strings.TrimPrefix(st.Error+"; "+err.Error(), "; ")
		} else {
			st.Ready = true
		}
	}
	if st.Ready {
		a.archiver(ctx, &st)
	}
	return st
}

var (
	_ agentapi.Instance       = (*Agent)(nil)
	_ agentapi.BackupInstance = (*Agent)(nil)
)
