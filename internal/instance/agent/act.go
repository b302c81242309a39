package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// reloadClusterConfig re-reads the cluster configuration (the ConfigMap the kubelet
// updates in place); the next start uses it, and a running standby gets a rewritten
// postgresql.conf and a reload (a primary's is rewritten by maintainSync, which owns
// its synchronous rule). A broken file keeps the configuration in force and is
// reported.
func (a *Agent) reloadClusterConfig(ctx context.Context, running bool, role, upstream string) error {
	next, err := clusterconfig.Load(a.cfg.ClusterConfigPath)
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
	as := pgconf.AsPrimary
	if role == agentapi.RoleReplica {
		as = pgconf.AsStandby
	}
	if err := a.writeConfig(a.confInput(as, upstream)); err != nil {
		return err
	}
	return a.db.Reload(ctx)
}

// binMajor is the image's PostgreSQL major version (the programs in BinDir). They do
// not change while the agent runs, so it is read once, at the first start (a start
// that ran postgres --version again was one more process for a crash to kill); a
// failed read is tried again at the next start.
func (a *Agent) binMajor(ctx context.Context) (string, error) {
	if a.binVersion != "" {
		return a.binVersion, nil
	}
	major, err := postgres.ProgramsMajor(ctx, a.cfg.BinDir)
	if err != nil {
		return "", err
	}
	a.binVersion = major
	return major, nil
}

func (a *Agent) confInput(role pgconf.Role, upstream string) pgconf.ConfInput {
	in := pgconf.ConfInput{
		Cluster: a.cluster, Pod: a.cfg.PodName, Listen: a.cfg.ListenAddress, Port: a.cfg.Port,
		Socket: a.cfg.SocketDir, Role: role, TLS: a.cfg.TLS, ReplicationUser: a.creds.Replication.Username,
		Commands: a.commands(), Recovery: a.recovery,
		// A primary starts with its clients locked out until its Lease is confirmed
		// (lockout.go lets them in at the next tick when it is).
		LockedOut: role == pgconf.AsPrimary && !a.allowed(),
	}
	if upstream != "" {
		up := a.upstreamOf(upstream)
		in.Upstream = &up
	}
	if _, total, err := postgres.VolumeSpace(filepath.Dir(a.cfg.PGData)); err == nil {
		in.VolumeBytes = total
	}
	// A frozen standby (no upstream) keeps the rule of a standby of the primary it
	// last followed.
	primary := upstream
	if primary == "" {
		a.mu.Lock()
		primary = a.upstream
		a.mu.Unlock()
	}
	in.SyncRule = pgconf.StandbyRule(a.cluster, a.cfg.PodName, primary)
	if role == pgconf.AsPrimary {
		in.SyncRule = a.syncRule()
	}
	return in
}

// startInstance starts postgres in the role d gives it.
func (a *Agent) startInstance(ctx context.Context, d Decision, view LeaseView) (err error) {
	// Every failed start counts towards a crash loop, whatever step failed: a start that
	// fails before the postmaster runs (reading the data directory, the version check)
	// must not leave an asynchronous primary waiting out spec.failover.startTimeout
	// while the operator sees a single crash (make chaos, crash-loop: 65 s rounds).
	defer func() {
		if err != nil && ctx.Err() == nil && !a.postmasterDied() {
			a.crashed()
		}
	}()
	if err := a.resumeUpgrade(); err != nil {
		return err
	}
	if d.Act == StartStandby && d.Target != "" {
		// The primary runs a database upgraded from this standby's: clone it
		// (upgrade.go).
		if upgraded, err := a.upgradedPrimary(ctx, d.Target); err != nil {
			return err
		} else if upgraded {
			a.setState(nil, agentapi.RoleStarting, "")
			if err := a.cloneUpgraded(ctx, d.Target); err != nil {
				return err
			}
			if err := a.chooseBinaries(ctx); err != nil {
				return err
			}
			return a.runStandby(ctx, d.Target)
		}
	}
	if err := a.chooseBinaries(ctx); err != nil {
		return err
	}
	state, err := a.pg.State()
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.fenced = false
	a.mu.Unlock()
	a.fencedNow.Store(false)
	a.setState(nil, agentapi.RoleStarting, "")
	if d.Act == StartPrimary {
		a.initSync(a.lease.Record().Sync)
		return a.startPrimary(ctx, state, view)
	}
	return a.startStandby(ctx, state, d.Target)
}

func (a *Agent) startPrimary(ctx context.Context, state postgres.DataState, view LeaseView) error {
	fresh := false
	switch state {
	case postgres.DataEmpty:
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
		// Before postgres starts, so that every clone of it has the lineage.
		if _, err := backup.NewLineage(a.cfg.PGData); err != nil {
			return err
		}
		fresh = true
	case postgres.DataStandby:
		return a.startFormerStandby(ctx, view)
	case postgres.DataPrimary:
		if a.pg.Recovering() && a.cluster.Restore != nil {
			a.log.Info("Resuming the recovery from the backup")
			return a.startRestored(ctx)
		}
	}
	if err := a.writeConfig(a.confInput(pgconf.AsPrimary, "")); err != nil {
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
	a.recovery = &pgconf.Recovery{TargetTime: r.TargetTime, TargetLSN: r.TargetLSN}
	defer func() { a.recovery = nil }()
	if err := a.writeConfig(a.confInput(pgconf.AsPrimary, "")); err != nil {
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
	if err := a.writeConfig(a.confInput(pgconf.AsPrimary, "")); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	return a.finishPrimaryStart(ctx, true)
}

// finishPrimaryStart runs on a primary that accepts connections: the commit gate,
// roles, database and passwords, slots, then the primary role. The agent's own
// sessions commit locally (synchronous_commit = local), so they need no gate.
func (a *Agent) finishPrimaryStart(ctx context.Context, fresh bool) error {
	a.startGate()
	a.kickLease()
	adopted, err := a.adoptData(ctx, fresh)
	if err != nil {
		return err
	}
	// The lineage the WAL archive is bound to: made with the cluster (or by a restore);
	// a data directory from before lineages gets one here, on its primary, and its
	// standbys with their next clone or rewind.
	if lineage, err := backup.ReadLineage(a.cfg.PGData); err != nil {
		return err
	} else if lineage == "" {
		if lineage, err = backup.NewLineage(a.cfg.PGData); err != nil {
			return err
		}
		a.log.Info("Gave the data directory its lineage", "lineage", lineage)
	}
	if !adopted {
		changed, err := a.db.SyncPasswords(ctx, a.creds)
		if err != nil {
			return err
		}
		if len(changed) > 0 {
			a.log.Info("Set passwords from the credentials Secrets", "roles", changed)
		}
	}
	a.slotsDone = time.Time{}
	a.walGapsDone = false
	a.setState(a.process(), agentapi.RolePrimary, "")
	return a.maintainPrimary(ctx)
}

// adoptData makes a primary's data this cluster's, once. Until the bootstrap marker
// exists (a new cluster, one restored from a backup, a promoted replica cluster whose
// clone of the source dropped the marker, or an agent stopped midway) the bootstrap
// owner and database may be missing or half made, and the passwords another cluster's.
// It creates what is missing and sets the passwords from the credentials Secrets, and
// only then marks it done, so that a failure is tried again. It reports whether it
// had to (fresh: a new database, whatever the marker says).
func (a *Agent) adoptData(ctx context.Context, fresh bool) (bool, error) {
	if !fresh && a.pg.Bootstrapped() {
		return false, nil
	}
	if err := a.db.Bootstrap(ctx, a.cluster.Bootstrap, a.creds); err != nil {
		return false, err
	}
	changed, err := a.db.SyncPasswords(ctx, a.creds)
	if err != nil {
		return false, err
	}
	if err := a.pg.MarkBootstrapped(); err != nil {
		return false, err
	}
	a.log.Info("Bootstrapped the cluster", "database", a.cluster.Bootstrap.Database, "owner", a.cluster.Bootstrap.Owner, "passwordsSet", changed)
	return true, nil
}

// upstreamOf is how to reach pod's postgres as the replication role.
func (a *Agent) upstreamOf(pod string) pgconf.Upstream {
	a.mu.Lock()
	r := a.cluster.Replica
	a.mu.Unlock()
	if r != nil && pod == r.Host {
		// A replica cluster's source: a host name, never a pod's (no dots in those).
		u := pgconf.Upstream{Host: r.Host, Source: true, Port: r.Port, User: a.creds.Replication.Username, TLS: a.cfg.TLS}
		if addr := a.cfg.PeerHost(r.Host); addr != a.cfg.PeerName(r.Host) {
			u.Addr = addr // an address given for the source's host (--peers)
		}
		return u
	}
	u := pgconf.Upstream{Host: a.cfg.PeerName(pod), Port: a.cfg.Port, User: a.creds.Replication.Username, TLS: a.cfg.TLS,
		Standby: r != nil && r.Enabled}
	if addr := a.cfg.PeerHost(pod); addr != u.Host {
		u.Addr = addr
	}
	return u
}

// startStandby starts postgres as a standby of primary, cloning or rewinding first as
// the data directory needs; primary "" starts it frozen, with no upstream.
func (a *Agent) startStandby(ctx context.Context, state postgres.DataState, primary string) error {
	if primary == "" {
		if state != postgres.DataStandby {
			return fmt.Errorf("cannot start a %s data directory frozen", state)
		}
		return a.runStandby(ctx, "")
	}
	host := a.upstreamOf(primary)
	if host.Source && state == postgres.DataPrimary {
		return a.startDemoted(ctx, primary)
	}
	switch state {
	case postgres.DataEmpty:
		if err := a.clone(ctx, host, primary); err != nil {
			return err
		}
	case postgres.DataStandby:
		// A clone postgres refuses at every start (clone.go) is cloned again, its data
		// directory set aside; any other failure is retried as it is.
		err := a.runStandby(ctx, primary)
		why := a.unstartableClone(err)
		if why == "" {
			return err
		}
		a.log.Info("Cloning again: postgres refuses to start from this clone", "primary", primary, "why", why)
		if err := a.reclone(ctx, host, primary, why); err != nil {
			return err
		}
	case postgres.DataPrimary:
		// pg_rewind reads the source's control file: before the new primary has finished
		// its first checkpoint on the new timeline, it would compute the wrong
		// divergence point.
		if err := a.waitPromoted(ctx, primary); err != nil {
			return err
		}
		why, err := a.checkRewindSource(ctx, host, primary)
		if err != nil {
			return err
		}
		if why != "" {
			a.log.Info("Cloning again: pg_rewind would take this data directory for one history with the primary's", "primary", primary, "why", why)
			if err := a.reclone(ctx, host, primary, "pg_rewind would take it for one history with the primary's: "+why); err != nil {
				return err
			}
			return a.runStandby(ctx, primary)
		}
		a.log.Info("Rewinding a former primary to follow the new one", "primary", primary)
		said, err := a.pg.Rewind(ctx, host)
		if err != nil {
			a.log.Error(err, "Rewind failed; cloning again", "primary", primary)
			if err := a.reclone(ctx, host, primary, "pg_rewind failed: "+err.Error()); err != nil {
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
func (a *Agent) maintainStandby(ctx context.Context, proc *postgres.Process, primary string) error {
	a.watchReceiver(ctx, proc, primary)
	if a.receiverReady(time.Now()) == nil {
		a.dropDemotion()
	}
	if err := a.keepSlots(ctx, true); err != nil {
		// The slots only make a later promotion faster: never a reason to stop here.
		a.log.Info("Could not keep the replication slots on this standby", "error", err.Error())
		a.slotsDone = time.Now()
	}
	if fatal := lastReceiverFatal(proc.Tail()); strings.Contains(fatal, "database system identifier differs") {
		if upgraded, err := a.upgradedPrimary(ctx, primary); err != nil {
			return err
		} else if upgraded {
			a.stopPostgres(postgres.StopFast)
			if err := a.cloneUpgraded(ctx, primary); err != nil {
				return err
			}
			if err := a.chooseBinaries(ctx); err != nil {
				return err
			}
			return a.runStandby(ctx, primary)
		}
		// postgres refuses it by itself; the agent says what it means.
		return refused("%s holds another database than this standby (its WAL receiver says %q): this instance's data is kept and it does not follow %s. "+
			"If this instance holds the cluster's data, the primary Lease must name an instance of it (see docs/data-safety.md); "+
			"to clone this instance from %s anyway, delete its PersistentVolumeClaim", primary, strings.TrimSpace(fatal), primary, primary)
	}
	if !walRemovedUpstream(proc.Tail()) {
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
	if token := a.demotionToken(); token != "" {
		return refused("%s no longer has the WAL this instance needs to follow it, and this data directory was a primary's until its demotion (%s): it may hold commits %s lacks, and is not replaced by a clone. "+
			"To clone it anyway, delete its PersistentVolumeClaim", primary, token, primary)
	}
	a.walGone = time.Time{}
	a.log.Info("Cloning again: the primary no longer has the WAL this standby needs", "primary", primary, "waited", walGoneFor.String())
	a.stopPostgres(postgres.StopFast)
	if err := a.reclone(ctx, a.upstreamOf(primary), primary, "the primary no longer has the WAL this standby needs"); err != nil {
		return err
	}
	return a.runStandby(ctx, primary)
}

// walRemovedUpstream reports whether postgres's last FATAL message in log is the WAL
// receiver's "requested WAL segment ... has already been removed": the primary no longer
// has WAL this standby needs. Any later FATAL (the primary restarting, say) means the
// standby is waiting for something else.
func walRemovedUpstream(log string) bool {
	fatal := lastReceiverFatal(log)
	return strings.Contains(fatal, "requested WAL segment") && strings.Contains(fatal, "has already been removed")
}

// lastReceiverFatal is lastFatal without the FATALs postgres answers its own clients
// with while it cannot take connections ("the database system is starting up", "... is
// not yet accepting connections"): those say nothing of the WAL receiver.
func lastReceiverFatal(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if fatal := lastFatal(lines[i]); fatal != "" && !strings.HasPrefix(fatal, "the database system is ") {
			return fatal
		}
	}
	return ""
}

// lastFatal is the last line of log with a FATAL message, from the message on; "" when
// there is none.
func lastFatal(log string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if _, msg, ok := strings.Cut(lines[i], "FATAL:"); ok {
			return strings.TrimSpace(msg)
		}
	}
	return ""
}

// runStandby writes the standby configuration for primary ("" for none: frozen) and
// starts postgres as its replica.
func (a *Agent) runStandby(ctx context.Context, primary string) error {
	if err := a.writeConfig(a.confInput(pgconf.AsStandby, primary)); err != nil {
		return err
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	a.setState(a.process(), agentapi.RoleReplica, primary)
	return nil
}

// waitPromoted returns nil once primary's agent reports it a ready primary whose last
// checkpoint is on its current timeline (the first checkpoint after a promotion is
// done); an error otherwise, so the step is retried.
func (a *Agent) waitPromoted(ctx context.Context, primary string) error {
	client := a.peerClient(primary)
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := client.Status(sctx)
		cancel()
		if err == nil && st.Role == agentapi.RolePrimary && st.Ready && st.CheckpointTimeline == st.Timeline {
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

// reclone replaces a data directory that cannot be rewound or catch up by a new clone
// of primary's. The clone must be of the same database; the old directory is set aside
// on the volume, never deleted (package postgres, aside.go).
func (a *Agent) reclone(ctx context.Context, host pgconf.Upstream, primary, why string) error {
	own, err := a.pg.SystemIdentifier()
	if err != nil {
		return err
	}
	peer, err := peerSystem(ctx, host, 0)
	if err != nil {
		return fmt.Errorf("asking %s for its system identifier: %w", primary, err)
	}
	if err := sameSystem(primary, peer.systemID, own); err != nil {
		return err
	}
	aside, err := a.cloneAside(ctx, host, primary, why, false)
	if err != nil {
		return err
	}
	a.log.Info("Cloned again; the replaced data directory is set aside until the new clone is verified", "primary", primary, "setAside", aside, "why", why)
	return nil
}

// cloneAside sets this instance's data directory aside (why says what it is), once
// primary is out of recovery, and clones primary's in its place; a clone that fails
// puts the directory back. olderMajor marks the set-aside data as an older major's,
// kept until the new one is backed up. It returns where the data was set aside.
func (a *Agent) cloneAside(ctx context.Context, host pgconf.Upstream, primary, why string, olderMajor bool) (string, error) {
	if err := a.waitOutOfRecovery(ctx, host, primary); err != nil {
		return "", err
	}
	a.makeRoom(postgres.DirSize(a.cfg.PGData))
	aside, err := a.pg.SetAside(why, time.Now())
	if err != nil {
		return "", err
	}
	if olderMajor {
		if err := postgres.MarkOlderMajor(aside); err != nil {
			return "", err
		}
	}
	a.noteSetAside()
	if err := a.pg.BaseBackup(ctx, host); err != nil {
		if restore := a.pg.PutBack(aside); restore != nil {
			return "", errors.Join(fmt.Errorf("cloning from %s: %w", primary, err), fmt.Errorf("putting the data directory back from %s: %w", aside, restore))
		}
		return "", fmt.Errorf("cloning from %s: %w", primary, err)
	}
	return aside, nil
}

// start starts postgres and waits until it accepts connections. The role stays
// "starting" until the caller has finished what the role needs.
func (a *Agent) start(ctx context.Context) error {
	// The postmaster loads pg_hba.conf as written so far before it accepts a session.
	hba := a.pg.HBAGeneration()
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
			proc.KillAll()
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
	a.pg.HBALoaded(hba)
	a.log.Info("Postgres is up", "pid", proc.Pid())
	return nil
}

// promote makes the running standby the primary the Lease names in view's term: its
// synchronous rule from the Lease's record first, then pg_promote, the commit gate and
// a renewal; the first checkpoint on the new timeline follows in the background.
func (a *Agent) promote(ctx context.Context, view LeaseView) error {
	if err := a.promotionAllowed(ctx); err != nil {
		return err
	}
	a.log.Info("Promoting", "term", view.Term)
	start := time.Now()
	rec := a.lease.Record()
	if rec.Term != view.Term {
		rec.Sync = nil
	}
	a.initSync(rec.Sync)
	// Confirm the Lease while postgres promotes: the gate acknowledges nothing before
	// the first confirmation in this term, and a renewal is a round trip to the API
	// server. The gate connects now too, to the standby, and follows it onto the new
	// timeline (gate.Gate.nextTimeline): the first commits need not wait for a connection.
	a.kickLease()
	a.startGate()
	promoted := false
	defer func() {
		if !promoted {
			a.stopGate()
		}
	}()
	a.mu.Lock()
	upstream := a.upstream
	a.mu.Unlock()
	if err := a.applyRule(ctx, a.syncRule(), pgconf.AsStandby, upstream); err != nil {
		return err
	}
	ruleTook := time.Since(start)
	timeline, err := a.promoteOnto(ctx, view)
	if err != nil {
		return err
	}
	promoted = true
	promoteTook := time.Since(start) - ruleTook
	// pgconf.Recovery ended: the configuration must not make it a standby at its next start.
	if err := a.writeConfigAsPrimary(ctx); err != nil {
		return err
	}
	a.startGate()
	a.kickLease()
	a.setState(a.process(), agentapi.RolePrimary, "")
	a.log.Info("Promoted", "timeline", timeline, "took", time.Since(start).Round(time.Millisecond).String(),
		"synchronousRuleTook", ruleTook.Round(time.Millisecond).String(), "pgPromoteTook", promoteTook.Round(time.Millisecond).String())
	// Until its first checkpoint a promoted server's control file still names the old
	// timeline, and pg_rewind (before PostgreSQL 16) then finds "no rewind required"
	// for a former primary that did diverge (waitPromoted waits for it).
	a.checkpointAfterPromotion()
	a.slotsDone = time.Time{}
	a.walGapsDone = false
	return a.maintainPrimary(ctx)
}

// writeConfigAsPrimary writes a just-promoted instance's configuration as a primary's
// and has postgres load its pg_hba.conf at once. A standby's pg_hba.conf lets clients
// in (it serves reads); a primary whose Lease is not confirmed yet must not, and the
// file written says so, but the guard (lockout.go) reloads only when it writes a change,
// and it would find none: clients, a pooler's probe among them, could log in to a
// primary that may not acknowledge until its Lease is confirmed. The sessions the
// standby had are ended by the guard's next sweep.
func (a *Agent) writeConfigAsPrimary(ctx context.Context) error {
	if err := a.writeConfig(a.confInput(pgconf.AsPrimary, "")); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		// The guard's next write then reloads whatever it finds.
		a.pg.ForgetHBA()
		a.log.Error(err, "Reloading pg_hba.conf after the promotion")
	}
	return nil
}

// promoteOnto promotes the running standby onto the timeline the Lease reserved for
// view's term (prepareTimeline) and returns it.
func (a *Agent) promoteOnto(ctx context.Context, view LeaseView) (int64, error) {
	timeline, err := a.prepareTimeline(ctx, view)
	if err != nil {
		return 0, err
	}
	// A standby's pg_hba.conf lets clients in (it serves reads). Once promoted it may
	// acknowledge nothing until its Lease is confirmed (I1), and a client that set
	// synchronous_commit = local commits without the gate: unless the Lease is
	// confirmed already, clients are locked out before pg_promote, and the guard keeps
	// them out until it is (promoting makes it see a primary).
	a.promoting.Store(true)
	if !a.allowed() {
		a.lockOut(ctx, "promoting before the primary Lease is confirmed")
	}
	if err := a.db.Promote(ctx); err != nil {
		a.promoting.Store(false)
		return 0, fmt.Errorf("promoting: %w", err)
	}
	if chose, err := a.db.CurrentTimeline(ctx); err == nil && chose != timeline {
		// Only a history file that appeared after prepareTimeline looked can do this.
		a.log.Error(nil, "The promotion chose another timeline than the one the Lease reserved", "chose", chose, "reserved", timeline)
		timeline = chose
	}
	return timeline, nil
}

// checkpointAfterPromotion runs the first checkpoint on the new timeline in the
// background.
func (a *Agent) checkpointAfterPromotion() {
	go func() {
		if err := a.db.Checkpoint(a.runCtx); err != nil {
			a.log.Error(err, "The checkpoint after the promotion failed")
		}
	}()
}

// startFormerStandby starts as the primary a standby that stopped before its
// promotion chose a new timeline (killed while promoting, or named by the Lease while
// down). Started without recovery it would carry on writing the old timeline after
// its own replay position, and the old primary, which wrote that timeline further,
// would find "no rewind required" and then wait forever for WAL it already has
// (make chaos, back-to-back: a new primary killed while it promoted). So it recovers
// as a standby of nobody and is promoted: a new timeline, from which every other
// instance rewinds or follows.
func (a *Agent) startFormerStandby(ctx context.Context, view LeaseView) error {
	a.log.Info("Starting a former replica as primary: recovering as a standby, then promoting it onto a new timeline")
	if err := a.writeConfig(a.confInput(pgconf.AsStandby, "")); err != nil {
		return err
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	timeline, err := a.promoteOnto(ctx, view)
	if err != nil {
		return err
	}
	a.log.Info("Promoted", "timeline", timeline)
	if err := a.writeConfigAsPrimary(ctx); err != nil {
		return err
	}
	a.checkpointAfterPromotion()
	return a.finishPrimaryStart(ctx, false)
}

// follow points a running standby at a new primary; primary_conninfo reloads without a
// restart. It ends a freeze.
func (a *Agent) follow(ctx context.Context, primary string) error {
	if err := a.writeConfig(a.confInput(pgconf.AsStandby, primary)); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	a.mu.Lock()
	a.frozen = false
	a.mu.Unlock()
	a.setState(a.process(), agentapi.RoleReplica, primary)
	a.log.Info("Following a new primary", "primary", primary)
	return nil
}

// maintainPrimary keeps the commit gate running, the synchronous rule, and a slot for
// every other instance; once per start or promotion it readies for the archiver what
// the earlier timelines left unarchived (package postgres, walgap.go).
func (a *Agent) maintainPrimary(ctx context.Context) error {
	a.startGate()
	if err := a.terminateGateImpostors(ctx); err != nil {
		return err
	}
	if err := a.maintainSync(ctx); err != nil {
		return err
	}
	// A promoted replica cluster's data was its source's: it is not ready until this
	// is done (Ready), so a client with this cluster's credentials finds them working.
	if _, err := a.adoptData(ctx, false); err != nil {
		return err
	}
	a.readyWALGaps(ctx)
	if err := a.keepSlots(ctx, false); err != nil {
		return err
	}
	a.keepPoolerAuth(ctx)
	if from, to := a.upgradeDue(ctx); to != "" && a.allowed() {
		return a.runUpgrade(ctx, from, to)
	}
	return nil
}

// terminateGateImpostors ends, at every step of a primary, any replication connection
// that took the commit gate's name (DB.TerminateGateImpostors), logs each and counts
// them (status gateImpostorsTerminated, metric pgpilot_gate_impostors_terminated_total).
// A failure fails the step, like the synchronous rule's, and is tried again at the next.
func (a *Agent) terminateGateImpostors(ctx context.Context) error {
	a.mu.Lock()
	g := a.gate
	a.mu.Unlock()
	var own uint32
	if g != nil {
		own = g.PID()
	}
	gone, err := a.db.TerminateGateImpostors(ctx, own)
	for _, imp := range gone {
		a.gateImpostors.Add(1)
		a.log.Info("Terminated a replication connection that took the commit gate's name: only the agent's own gate may acknowledge commits",
			"pid", imp.PID, "client", imp.Client, "user", imp.User, "gatePid", own)
	}
	if err != nil {
		return fmt.Errorf("looking for replication connections that took the commit gate's name: %w", err)
	}
	return nil
}

// readyWALGaps readies for the archiver the whole segments of this primary's earlier
// timelines that pg_wal holds with no archive status (package postgres, walgap.go), once per start or
// promotion; a failure is logged and tried again at the next step.
func (a *Agent) readyWALGaps(ctx context.Context) {
	if a.walGapsDone {
		return
	}
	tl, err := a.db.CurrentTimeline(ctx)
	if err != nil {
		a.log.Error(err, "Reading the timeline to archive the segments earlier timelines left")
		return
	}
	readied, err := a.pg.ReadyAncestorSegments(tl)
	if len(readied) > 0 {
		a.log.Info("Readied for archiving the segments an earlier timeline left unarchived", "timeline", tl, "segments", readied)
	}
	if err != nil {
		a.log.Error(err, "Readying the segments earlier timelines left unarchived", "timeline", tl)
		return
	}
	a.walGapsDone = true
}

// slotsEvery is how often the replication slots are checked.
const slotsEvery = 10 * time.Second

// keepSlots keeps a physical slot for every other instance, at most every slotsEvery,
// and drops pgpilot's slots of instances that are gone. A primary's slots advance with
// its standbys' feedback. A standby keeps them too, advanced to its replay position,
// so that the moment it is promoted the other standbys find their slots ready: without
// them they could not stream, and in synchronous mode no commit could be acknowledged,
// until the new primary created them after its promotion.
//
// On a primary, a slot idle for longer than spec.postgresql.idleSlotTimeout is released
// (made again without WAL reserved): an instance away for a day must not keep a day of
// WAL. The idle time is counted by this agent from when it first saw the slot idle, so
// an agent restart starts it again; max_slot_wal_keep_size bounds the WAL meanwhile.
// A slot whose restart position moved between two looks was streamed from in between,
// however briefly: its idle time starts at the second look.
// idleSlot is an idle slot as keepSlots last saw it.
type idleSlot struct {
	since   time.Time // when it was first seen idle at restart
	restart string    // its restart position
}

func (a *Agent) keepSlots(ctx context.Context, standby bool) error {
	if time.Since(a.slotsDone) < slotsEvery {
		return nil
	}
	var want []string
	for _, pod := range a.peers() {
		want = append(want, pgconf.SlotName(pod))
	}
	now := time.Now()
	var release []string
	if timeout := a.cluster.SlotTimeout(); timeout > 0 && !standby {
		for s, idle := range a.slotIdle {
			if now.Sub(idle.since) >= timeout {
				release = append(release, s)
			}
		}
	}
	ch, err := a.db.EnsureSlots(ctx, want, standby, release)
	if err != nil {
		return err
	}
	if len(ch.Created)+len(ch.Dropped) > 0 {
		a.log.Info("Replication slots changed", "created", ch.Created, "dropped", ch.Dropped)
	}
	if len(ch.Released) > 0 {
		a.log.Info("Released the replication slots of instances idle for longer than spec.postgresql.idleSlotTimeout: they keep no WAL until their instances stream again, from the WAL archive or a new clone if what they need is gone",
			"slots", ch.Released, "idleSlotTimeout", a.cluster.SlotTimeout().String())
	}
	idle := map[string]idleSlot{}
	if !standby {
		for s, restart := range ch.Idle {
			idle[s] = idleSlot{since: now, restart: restart}
			if was, ok := a.slotIdle[s]; ok && was.restart == restart {
				idle[s] = was
			}
		}
	}
	a.slotIdle = idle
	a.slotsDone = now
	return nil
}
