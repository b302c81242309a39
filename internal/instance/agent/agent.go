package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/pgsql"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

// LeaseSource is where the agent learns who is primary, and how it writes the two
// changes an agent makes to the Lease: renewals and its release.
type LeaseSource interface {
	View() LeaseView
	Record() primarylease.Record
	// LastSeen is when the API server last answered.
	LastSeen() time.Time
	Changed() <-chan struct{}
	// RenewalSeen is the Lease's renewTime and when it was first read; ok once it was
	// seen to change.
	RenewalSeen() (renewTime, seen time.Time, ok bool)
	Refresh(ctx context.Context) (LeaseView, error)
	Apply(ctx context.Context, change primarylease.Change) error
}

// Agent supervises one instance. Its Run loop is the only place postgres is started,
// stopped, promoted or rewound; the HTTP API's requests are carried out by that loop.
// Each step observes, decides with the pure Decide, then acts.
type Agent struct {
	cfg      Config
	cluster  clusterconfig.Config
	creds    pgconf.Credentials
	pg       *postgres.Postgres
	db       *pgsql.DB
	lease    LeaseSource
	log      logr.Logger
	peerHTTP agentapi.HTTPClients

	requests chan request
	kick     chan struct{} // a renewal now
	wakeCh   chan struct{} // a step now

	conf confirmation
	// handingOver and fencedNow close the commit gate at once; the gate reads them on
	// every reply, without the lock.
	handingOver atomic.Bool
	// promoting is set from just before pg_promote until the role is set after it: the
	// guard (lockout.go) then treats the instance as the primary it is becoming.
	promoting atomic.Bool
	fencedNow atomic.Bool
	// lossLimit is how far the commit gate may confirm WAL (lossbudget.go).
	lossLimit atomic.Uint64
	// gateImpostors counts the walsenders that took the gate's name, terminated.
	gateImpostors atomic.Int64

	// rolesMu runs one PUT /roles at a time.
	rolesMu sync.Mutex

	mu            sync.Mutex
	proc          *postgres.Process
	role          string // an agentapi.Role* constant
	upstream      string // the primary a standby streams from; "" when frozen
	fenced        bool   // stopped on request or after a handover ...
	fencedTerm    int32  // ... in this term: stays down while the Lease is in it
	frozen        bool   // a standby told to stop receiving ...
	frozenTerm    int32  // ... until the Lease names a holder in a later term
	gate          *gate.Gate
	gateStop      func()
	sync          syncState
	failsafeGiven failsafeGiven
	lastHandover  *agentapi.Handover
	lastErr       string
	lastCrash     string // why postgres last exited unexpectedly
	oomKills      int64  // the container's OOM kill count when postgres last exited
	lastRefusal   string
	// setAsides are the set-aside data directories as keepVolume last found them;
	// asidePending counts those not yet superseded; volumeDone is when it looked.
	setAsides    []agentapi.SetAside
	asidePending int
	volumeDone   time.Time
	crashes      int     // consecutive failed steps, for the backoff
	crashTimes   []crash // postmaster exits and failed starts
	binVersion   string  // the image's major version, once read
	// upgrade is the major version upgrade this agent last checked or ran
	// (upgrade.go); upgradeFailed the major an upgrade to failed, not tried again.
	upgrade       *agentapi.Upgrade
	upgradeFailed string
	// upgradingNow is set while the primary is down for pg_upgrade, from its stop to
	// its start on either major: its status role is then RoleUpgrading.
	upgradingNow atomic.Bool
	// confirmingHBA is set while letIn waits for postgres to load pg_hba.conf.
	confirmingHBA atomic.Bool
	// backedUpSince is when the newest base backup of the data's major that
	// newMajorBackedUp found began; backedUpLooked when it last read the store.
	backedUpSince, backedUpLooked time.Time
	// backupWaitLooked is when upgradeBackupWait last read the store, and
	// backupWaitWhy what it found (loop only).
	backupWaitLooked time.Time
	backupWaitWhy    string
	// upgradeChecked is the major pg_upgrade --check passed for, against the running
	// primary (loop only; its new data directory is kept for the upgrade).
	upgradeChecked string
	downSince      time.Time
	// primarySince is when this instance first became primary in term primaryTerm,
	// and primaryReady whether it has been ready since (Status.PromotingForMillis).
	primarySince time.Time
	primaryTerm  int32
	primaryReady bool
	lastAct      Act
	slotsDone    time.Time
	// walGapsDone is whether this primary readied the segments its earlier timelines
	// left unarchived since it last started or was promoted (readyWALGaps).
	walGapsDone bool
	// slotIdle is, on a primary, since when each of its idle slots holding WAL has been
	// seen idle (keepSlots).
	slotIdle map[string]idleSlot
	// volume is the data volume's free space over the last minutes (guarded by mu).
	volume volumeTrend
	// walGone is since when this standby's WAL receiver has been failing because the
	// primary no longer has the WAL it needs; zero while it is not.
	walGone time.Time
	// recv watches a standby's WAL receiver (receiver.go).
	recv     receiverWatcher
	recovery *pgconf.Recovery // set while restoring from a backup
	backups  map[string]*backupJob
	runCtx   context.Context // Run's context: background work ends with it
	custom   customQueries   // the custom queries' file (stats)
	pooler   poolerAuth      // the pooler's lookup role and function (poolerauth.go)
	// durability is what keepDurability reset or kept (guarded by mu).
	durability durabilityResets
	// confCheck is what postgres said of the settings last written (confcheck.go).
	confCheck configCheck
}

type request struct {
	action string
	done   chan error
	once   *sync.Once
}

// answer gives the request its outcome, the first time only: an action may answer
// before it is over (demote, once the Lease records the release).
func (r request) answer(err error) {
	r.once.Do(func() { r.done <- err })
}

// New returns an agent for cfg.
func New(cfg Config, cluster clusterconfig.Config, creds pgconf.Credentials, lease LeaseSource, log logr.Logger) *Agent {
	passfile := cfg.SocketDir + "/.pgpass-pgpilot"
	a := &Agent{
		cfg: cfg, cluster: cluster, creds: creds, lease: lease, log: log,
		pg: &postgres.Postgres{BinDir: cfg.BinDir, PGData: cfg.PGData, Env: []string{"PGPASSFILE=" + passfile, "PGCONNECT_TIMEOUT=5"},
			SocketLock: fmt.Sprintf("%s/.s.PGSQL.%d.lock", cfg.SocketDir, cfg.Port),
			StaleLockRemoved: func(file string) {
				log.Info("Removed a stale lock file: no postgres of this data directory runs", "file", file)
			}},
		db:       &pgsql.DB{SocketDir: cfg.SocketDir, Port: cfg.Port, User: creds.Superuser.Username},
		requests: make(chan request),
		kick:     make(chan struct{}, 1),
		wakeCh:   make(chan struct{}, 1),
		role:     agentapi.RoleStopped,
		backups:  map[string]*backupJob{},
		runCtx:   context.Background(),
	}
	a.lossLimit.Store(uint64(unlimited))
	a.oomKills, _ = oomKills() // those before this agent are not postgres's
	return a
}

// tlsCheckInterval is how often the mounted certificates are compared with those in use.
const tlsCheckInterval = 5 * time.Second

func (a *Agent) passFile() string { return a.cfg.SocketDir + "/.pgpass-pgpilot" }

// wake asks for a step now.
func (a *Agent) wake() {
	select {
	case a.wakeCh <- struct{}{}:
	default:
	}
}

// Run supervises postgres until ctx ends. Then a primary hands over (docs/failover.md)
// and a standby stops, within cfg.ShutdownTimeout.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	a.runCtx = ctx
	a.mu.Unlock()
	if err := pgconf.WriteFileAtomic(a.passFile(), []byte(pgconf.PassFile(a.creds)), 0o600); err != nil {
		return fmt.Errorf("writing the pgpass file: %w", err)
	}
	if _, err := a.cfg.TLS.Sync(); err != nil {
		return fmt.Errorf("the instance's certificates (the operator's Secrets %s, or spec.tls.serverSecretName): %w", a.cfg.TLS.Source, err)
	}
	go a.keepTLS(ctx, tlsCheckInterval)
	lock, err := postgres.Interlock(ctx, a.cfg.PGData, func() {
		a.log.Info("Waiting for another postgres on this volume to stop (a container of this pod still running?)", "lock", a.cfg.PGData+".lock")
	})
	if err != nil {
		return err
	}
	defer lock.Close()
	a.pg.Lock = lock
	go a.keepLease(ctx)
	go a.guardPrimary(ctx)
	go a.keepPrimary(ctx)
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
		// A retry happens when its backoff ends, not at the next tick: in a crash loop
		// the tick's slack added up to a second to every backoff.
		var retry <-chan time.Time
		var timer *time.Timer
		if wait := time.Until(retryAt); wait > 0 {
			timer = time.NewTimer(wait)
			retry = timer.C
		}
		select {
		case <-ctx.Done():
			a.shutdown()
			return nil
		case <-a.lease.Changed():
			retryAt = time.Time{}
		case <-a.wakeCh:
			retryAt = time.Time{}
		case <-procDone:
			// The first crash in a minute restarts postgres at once, whatever backoff an
			// earlier failed step left; a second one within the minute keeps it.
			if a.postmasterExited() == 1 {
				retryAt = time.Time{}
			}
		case <-retry:
		case r := <-a.requests:
			r.answer(a.handle(ctx, r))
			retryAt = time.Time{}
		case <-tick.C:
		}
		if timer != nil {
			timer.Stop()
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
		a.lastErr, a.lastRefusal = "", ""
		return
	}
	a.lastErr, a.lastRefusal = err.Error(), refusal(err)
}

func (a *Agent) process() *postgres.Process {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc
}

// postmasterDied reports whether the postmaster the agent runs has exited: the run
// loop's postmasterExited counts that crash, so a start that failed because of it must
// not count it again (a postmaster killed while its start's last steps ran was counted
// twice, and two crashes in a minute look like a crash loop).
func (a *Agent) postmasterDied() bool {
	p := a.process()
	if p == nil {
		return false
	}
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}

func (a *Agent) setState(p *postgres.Process, role, upstream string) {
	term := a.lease.View().Term
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proc, a.role, a.upstream = p, role, upstream
	a.promoting.Store(false)
	if role == agentapi.RolePrimary && (a.primarySince.IsZero() || a.primaryTerm != term) {
		a.primarySince, a.primaryTerm, a.primaryReady = time.Now(), term, false
	}
	if role != agentapi.RoleReplica {
		a.recv.reset()
	}
	switch {
	case role == agentapi.RolePrimary || role == agentapi.RoleReplica:
		a.downSince = time.Time{}
	case a.downSince.IsZero():
		a.downSince = time.Now()
	}
}

// crash is a postmaster exit or a failed start, and the Lease's term at that moment.
type crash struct {
	at   time.Time
	term int32
}

// crashed records a crash and returns how many the last minute holds.
func (a *Agent) crashed() int {
	term := a.lease.View().Term
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.crashTimes = append(a.crashTimes, crash{at: now, term: term})
	for len(a.crashTimes) > 0 && now.Sub(a.crashTimes[0].at) > time.Minute {
		a.crashTimes = a.crashTimes[1:]
	}
	return len(a.crashTimes)
}

// postmasterExited handles an unexpected exit of the postmaster and returns how many
// crashes the agent counted in the last minute, this one included.
func (a *Agent) postmasterExited() int {
	p := a.process()
	a.log.Error(p.Err(), "Postgres exited unexpectedly; restarting it", "ranFor", time.Since(p.Started).Round(time.Millisecond).String())
	kills, known := oomKills() // files of the cgroup: read before taking the lock
	a.mu.Lock()
	a.lastCrash = crashMessage(p, a.cluster.Resources.MemoryLimitBytes, known && kills > a.oomKills, known)
	a.oomKills = kills
	a.mu.Unlock()
	p.KillAll()
	a.db.Reset()
	a.stopGate()
	recent := a.crashed()
	a.setState(nil, agentapi.RoleStopped, "")
	if time.Since(p.Started) > time.Minute {
		a.mu.Lock()
		a.crashes = 0
		a.mu.Unlock()
	}
	return recent
}

// crashMessage says why the postmaster p exited unexpectedly, for a person: its own
// last complaint, and for a SIGKILL whether the kernel killed it for memory (oomKilled,
// when the container's count is known) and what to change then.
func crashMessage(p *postgres.Process, memoryLimit int64, oomKilled, oomKnown bool) string {
	msg := fmt.Sprintf("postgres exited unexpectedly after %s (%v)", time.Since(p.Started).Round(100*time.Millisecond), p.Err())
	if why := p.Complaint(); why != "" {
		msg += ": " + why
	}
	if p.Signal() != syscall.SIGKILL {
		return msg
	}
	switch {
	case oomKilled:
		msg += "; the kernel killed it for memory (the container's OOM kill count rose)"
	case oomKnown:
		return msg + "; killed by signal 9, not by the kernel for memory (the container's OOM kill count did not change)"
	default:
		msg += "; killed by signal 9, most likely by the kernel for memory"
	}
	if memoryLimit > 0 {
		msg += "; its memory limit is " + tuning.Memory(memoryLimit)
	}
	return msg + ": raise spec.resources.limits.memory, or lower shared_buffers and work_mem"
}

// observe reads what Decide needs.
func (a *Agent) observe(view LeaseView) Observation {
	a.mu.Lock()
	o := Observation{Me: a.cfg.PodName, View: view, Running: a.proc != nil, Role: a.role, Upstream: a.upstream,
		Fenced: a.fenced, FencedTerm: a.fencedTerm, Frozen: a.frozen, FrozenTerm: a.frozenTerm,
		Source: a.cluster.Following()}
	a.mu.Unlock()
	if !o.Running {
		o.Data, _ = a.pg.State() // an unreadable directory is reported by the start
	}
	return o
}

// step moves the instance one step towards what the Lease says.
func (a *Agent) step(ctx context.Context) error {
	view := a.lease.View()
	a.mu.Lock()
	running, role, upstream := a.proc != nil, a.role, a.upstream
	a.mu.Unlock()
	if err := a.reloadClusterConfig(ctx, running, role, upstream); err != nil {
		return err
	}
	a.keepVolume(ctx, a.verified)
	d := Decide(a.observe(view))
	a.mu.Lock()
	changed := d.Act != a.lastAct
	a.lastAct = d.Act
	a.mu.Unlock()
	if changed && d.Act != Idle {
		a.log.Info("Acting on the primary Lease", "act", d.Act.String(), "target", d.Target, "term", view.Term, "reason", d.Reason)
	}
	return a.act(ctx, d, view)
}

// verified reports whether the data directory in use has proven sound: it serves as
// the primary, or it streams from one as a standby.
func (a *Agent) verified(ctx context.Context) bool {
	a.mu.Lock()
	running, role, upstream := a.proc != nil, a.role, a.upstream
	a.mu.Unlock()
	switch {
	case running && role == agentapi.RolePrimary:
		return true
	case running && role == agentapi.RoleReplica && upstream != "":
		streaming, err := a.db.Streaming(ctx)
		return err == nil && streaming
	}
	return false
}

// act carries out a decision.
func (a *Agent) act(ctx context.Context, d Decision, view LeaseView) error {
	switch d.Act {
	case KeepPrimary:
		return a.maintainPrimary(ctx)
	case KeepStandby:
		if p := a.process(); p != nil && d.Target != "" {
			return a.maintainStandby(ctx, p, d.Target)
		} else if p != nil {
			a.watchReceiver(ctx, p, "") // frozen
		}
	case StartPrimary, StartStandby:
		return a.startInstance(ctx, d, view)
	case Promote:
		return a.promote(ctx, view)
	case Follow:
		return a.follow(ctx, d.Target)
	case Freeze:
		return a.freeze(ctx)
	case Stop:
		a.stopKept(ctx, d.Reason)
	case Demote:
		return a.demoteToFollow(ctx, d.Target)
	case StepDown:
		// Stopping a primary is costly: confirm with a fresh read first. When the API
		// server cannot answer, the last view stands. The gate withholds already.
		if fresh, err := a.lease.Refresh(ctx); err == nil && fresh.Holder == a.cfg.PodName && fresh.Term == view.Term {
			return nil
		}
		a.log.Info("Stepping down: stopped acknowledging commits, stopping postgres", "reason", d.Reason)
		a.fence(view.Term)
	}
	return nil
}

// handle carries out an API request inside the Run loop.
func (a *Agent) handle(ctx context.Context, r request) error {
	a.mu.Lock()
	role := a.role
	a.mu.Unlock()
	switch r.action {
	case "promote":
		if role == agentapi.RolePrimary {
			return nil
		}
		if role != agentapi.RoleReplica {
			return fmt.Errorf("%w: postgres is %s, not a running replica", agentapi.ErrConflict, role)
		}
		// The watch may lag behind the controller's Lease update: read it now, and never
		// promote an instance the Lease does not name.
		view, err := a.lease.Refresh(ctx)
		if err != nil {
			return fmt.Errorf("reading the primary Lease before promoting: %w", err)
		}
		if view.Holder != a.cfg.PodName {
			return fmt.Errorf("%w: the Lease names %q as primary, not this instance", agentapi.ErrConflict, view.Holder)
		}
		return a.promote(ctx, view)
	case "fence":
		a.fence(a.lease.View().Term)
		return nil
	case "demote":
		if role != agentapi.RolePrimary {
			return fmt.Errorf("%w: postgres is %s, not a running primary", agentapi.ErrConflict, role)
		}
		return a.demote(ctx, r.answer)
	case "freeze":
		return a.freeze(ctx)
	case "restart":
		return a.restart(ctx)
	}
	return fmt.Errorf("unknown action %q", r.action)
}

func (a *Agent) do(ctx context.Context, action string) error {
	r := request{action: action, done: make(chan error, 1), once: &sync.Once{}}
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

// Fence implements agentapi.Instance: the gate stops acknowledging at once (before the
// request waits for the Run loop), postgres stops, and stays down while the Lease
// stays in this term.
func (a *Agent) Fence(ctx context.Context) error {
	a.fencedNow.Store(true)
	return a.do(ctx, "fence")
}

// Demote implements agentapi.Instance: a handover (docs/failover.md).
func (a *Agent) Demote(ctx context.Context) error { return a.do(ctx, "demote") }

// Freeze implements agentapi.Instance. The standby refuses failsafe confirmations from
// the moment the request arrives, then stops its WAL receiver.
func (a *Agent) Freeze(ctx context.Context) error {
	a.markFrozen()
	return a.do(ctx, "freeze")
}

// Ready implements agentapi.Instance: postgres runs in its role, and a primary's
// commits can be acknowledged (its gate streams and it has confirmed the Lease).
func (a *Agent) Ready(ctx context.Context) error {
	a.mu.Lock()
	role, gate := a.role, a.gate
	a.mu.Unlock()
	if role != agentapi.RolePrimary && role != agentapi.RoleReplica {
		return fmt.Errorf("postgres is %s", role)
	}
	if role == agentapi.RolePrimary {
		if gate == nil || !gate.Connected() {
			return fmt.Errorf("the commit gate is not connected")
		}
		if !a.allowed() {
			return fmt.Errorf("the primary Lease is not confirmed: commits wait")
		}
		if !a.pg.Bootstrapped() {
			return fmt.Errorf("a promoted replica cluster: its owner, database and passwords are not yet this cluster's")
		}
	}
	if !a.pg.ClientsLetIn() {
		return fmt.Errorf("clients are not yet let in (pg_hba.conf): they are once postgres reloaded it, a moment after a primary confirmed the Lease")
	}
	inRecovery, err := a.db.InRecovery(ctx)
	if err != nil {
		return err
	}
	if inRecovery != (role == agentapi.RoleReplica) {
		return fmt.Errorf("postgres is not yet in its %s role", role)
	}
	if role == agentapi.RoleReplica {
		// I6: a standby serves reads only while it streams from the primary within
		// maxReadLag (receiver.go).
		return a.receiverReady(time.Now())
	}
	return nil
}

// allowed reports whether commits may be acknowledged now: the gate asks before every
// reply.
func (a *Agent) allowed() bool {
	if a.handingOver.Load() || a.fencedNow.Load() {
		return false
	}
	v := a.lease.View()
	return v.Holder == a.cfg.PodName && a.conf.valid(v.Term, time.Now())
}

// Status implements agentapi.Instance.
func (a *Agent) Status(ctx context.Context) agentapi.Status {
	view := a.lease.View()
	now := time.Now()
	a.mu.Lock()
	st := agentapi.Status{Pod: a.cfg.PodName, Role: a.role, Fenced: a.fenced, Error: a.lastErr, Refusal: a.lastRefusal, Term: view.Term, Holder: view.Holder,
		Frozen: a.frozen, Handover: a.lastHandover, SetAside: slices.Clone(a.setAsides), ParametersHash: a.cluster.ParametersHash()}
	if a.proc != nil {
		st.Running = true
		started := a.proc.Started
		st.StartedAt = &started
	}
	// Only this term's crashes: they tell whether the instance can hold the role the
	// Lease gives it now. A standby promoted right after a crash loop of its own as the
	// previous primary would otherwise be failed at once for crashes of another role
	// (make chaos, crash-loop: the third round's new primary had crashed 30 times in the
	// first round, 30 s before, and every instance in turn was failed over).
	for _, c := range a.crashTimes {
		if ago := now.Sub(c.at); ago < time.Minute && c.term == view.Term {
			st.RecentCrashes++
			st.FirstRecentCrashMillisAgo = max(st.FirstRecentCrashMillisAgo, ago.Milliseconds())
		}
	}
	if !a.downSince.IsZero() {
		st.DownForMillis = max(now.Sub(a.downSince).Milliseconds(), 1)
	}
	var promotedAt time.Time
	if a.role == agentapi.RolePrimary && a.primaryTerm == view.Term && !a.primaryReady {
		promotedAt = a.primarySince
	}
	if renewTime, seen, ok := a.lease.RenewalSeen(); ok {
		st.RenewalSeen = &agentapi.RenewalSeen{RenewTime: renewTime, AgoMillis: now.Sub(seen).Milliseconds()}
	}
	if g := a.failsafeGiven; !g.at.IsZero() {
		st.FailsafeConfirmed = &agentapi.FailsafeConfirmation{Primary: g.primary, Term: g.term, AgoMillis: now.Sub(g.at).Milliseconds()}
	}
	// A postmaster that keeps dying is restarted at once each time, and the start
	// succeeds: the reason is its last exit while crashes are recent.
	if st.Error == "" && st.RecentCrashes > 0 {
		st.Error = a.lastCrash
	}
	st.DurabilityResets, st.LastDurabilityReset = a.durability.Count, a.durability.Last
	st.DurabilityOverridesKept = slices.Clone(a.durability.Kept)
	st.ConfigRejected = a.confCheck.problem
	checking := a.confCheck.done != a.confCheck.gen
	gate := a.gate
	if a.upgrade != nil && a.cluster.Version == a.upgrade.To {
		u := *a.upgrade
		st.Upgrade = &u
	}
	if a.upgradingNow.Load() && st.Role != agentapi.RolePrimary {
		st.Role = agentapi.RoleUpgrading
	}
	a.mu.Unlock()
	st.LockedOut = a.pg.HBALocked()
	st.DemotionToken = a.demotionToken()
	if st.Running && st.Role == agentapi.RoleReplica {
		st.Receiver = a.receiverStatus(now)
	}
	if st.Role == agentapi.RolePrimary || view.Holder == a.cfg.PodName {
		st.Confirmation = a.conf.status(view.Term, now)
		st.Gate = gateState(gate, a.allowed())
	}
	st.GateImpostorsTerminated = a.gateImpostors.Load()
	var arch agentapi.ArchiverStatus
	if st.Running && (st.Role == agentapi.RolePrimary || st.Role == agentapi.RoleReplica) {
		if err := a.db.Observe(ctx, &st, &arch, st.Role == agentapi.RolePrimary); err != nil {
			st.Error = strings.TrimPrefix(st.Error+"; "+err.Error(), "; ")
		} else {
			if checking {
				st.PendingRestart = nil // not to be applied before it is checked
			}
			// An instance is ready once clients may connect, and a primary once it
			// also acknowledges commits: pg_hba.conf is let in by the lockout loop
			// (a moment after the gate acks, on a primary) and loaded by the
			// postmaster a moment after that; a client sent to it before then was
			// refused.
			st.Ready = a.pg.ClientsLetIn() && (st.Role == agentapi.RoleReplica || st.Gate == agentapi.GateAcking && a.pg.Bootstrapped())
		}
	} else if !st.Running {
		if cd, err := a.pg.ControlData(ctx); err == nil {
			st.Position, st.Timeline = cd.Checkpoint, cd.Timeline
		}
	}
	if !promotedAt.IsZero() {
		if st.Ready {
			a.mu.Lock()
			a.primaryReady = a.primaryReady || a.primarySince.Equal(promotedAt)
			a.mu.Unlock()
		} else {
			st.PromotingForMillis = max(now.Sub(promotedAt).Milliseconds(), 1)
		}
	}
	if free, total, err := postgres.VolumeSpace(filepath.Dir(a.cfg.PGData)); err == nil {
		st.VolumeBytes, st.VolumeFreeBytes = int64(total), int64(free)
		a.mu.Lock()
		a.volume.add(time.Now(), free)
		st.VolumeFullInSeconds = int64(a.volume.fullIn().Seconds())
		a.mu.Unlock()
	}
	if id, err := a.pg.SystemIdentifier(); err != nil {
		st.Error = strings.TrimPrefix(st.Error+"; "+err.Error(), "; ")
	} else {
		st.SystemIdentifier = id
	}
	st.UpgradedFrom = a.upgradedFrom()
	if st.Ready {
		a.archiver(&arch, &st)
	}
	return st
}

func gateState(g *gate.Gate, allowed bool) string {
	switch {
	case g == nil || !g.Connected():
		return agentapi.GateDisconnected
	case g.Draining():
		return agentapi.GateDraining
	case allowed:
		return agentapi.GateAcking
	}
	return agentapi.GateWithholding
}

var (
	_ agentapi.Instance       = (*Agent)(nil)
	_ agentapi.BackupInstance = (*Agent)(nil)
	_ agentapi.StatsInstance  = (*Agent)(nil)
)
