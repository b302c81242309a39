package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/instance/carry"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// A major version upgrade (docs/operations.md, "Major version upgrades"): while
// spec.version is newer than the data, the pods run the new major's image, and an init
// container carries the data's own programs into them (package carry). Every agent
// runs its data on the programs of its major; the primary's then checks, stops,
// runs pg_upgrade with both, and starts the new major; each standby sets its old data
// aside and clones the upgraded primary.

// errNoPrograms: the data directory is of another major than the image, and no
// programs of its major were carried into the pod.
var errNoPrograms = errors.New("no PostgreSQL programs for the data directory's major version")

// chooseBinaries picks the programs the data directory needs: the image's, or those
// carried for an older major. Called before every start.
func (a *Agent) chooseBinaries(ctx context.Context) error {
	image, err := a.binMajor(ctx)
	if err != nil {
		return err
	}
	data, err := a.pg.Major()
	if err != nil || data == image {
		a.pg.UseBinaries("")
		return nil //nolint:nilerr // no data directory yet: the image's programs make it
	}
	if c, err := carry.Load(a.cfg.CarriedDir); err == nil && c.Major == data {
		if a.pg.Programs() != c.BinDir {
			a.log.Info("Running the data directory on the PostgreSQL programs carried for its major", "data", data, "image", image, "programs", c.BinDir)
		}
		a.pg.UseBinaries(c.BinDir)
		return nil
	}
	if older(data, image) {
		return fmt.Errorf("%w: the data directory is PostgreSQL %s and this image runs PostgreSQL %s; the operator carries the %s programs into the pod while spec.version is newer than the data (docs/operations.md, Major version upgrades)", errNoPrograms, data, image, data)
	}
	return fmt.Errorf("%w: the data directory is PostgreSQL %s but this image runs PostgreSQL %s, and PostgreSQL cannot move data to an older major; set spec.version back to %q", errNoPrograms, data, image, data)
}

// older reports whether major a is older than major b.
func older(a, b string) bool {
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	return err1 == nil && err2 == nil && x < y
}

// upgradeDue is the major version this primary should upgrade its data to now, ""
// when none: spec.version is newer than the data, the image runs it, the data runs on
// carried programs, and no upgrade to it failed since this agent started.
func (a *Agent) upgradeDue(ctx context.Context) (from, to string) {
	to = a.cluster.Version
	data, err := a.pg.Major()
	if err != nil || !older(data, to) || a.pg.Programs() == a.cfg.BinDir {
		return "", ""
	}
	if image, err := a.binMajor(ctx); err != nil || image != to {
		return "", ""
	}
	a.mu.Lock()
	failed := a.upgradeFailed == to
	a.mu.Unlock()
	if failed {
		return "", ""
	}
	return data, to
}

// setUpgrade records the upgrade's phase for the agent's status (and so the operator's
// condition and events).
func (a *Agent) setUpgrade(from, to, phase, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.upgrade; u != nil && u.From == from && u.To == to && u.Phase == phase && u.Message == msg {
		return
	}
	u := &agentapi.Upgrade{From: from, To: to, Phase: phase, Message: msg, Since: time.Now().UTC()}
	if a.upgrade != nil && a.upgrade.To == to {
		u.WritesStoppedMillis = a.upgrade.WritesStoppedMillis
	}
	a.upgrade = u
	a.log.Info("Major version upgrade", "from", from, "to", to, "phase", phase, "message", msg)
}

// upgradeFailedNow ends an upgrade that left the data on its old major: not tried again
// until the agent starts again (a new image, a new pod) or spec.version changes.
func (a *Agent) upgradeFailedNow(from, to, msg string) {
	a.mu.Lock()
	a.upgradeFailed = to
	a.mu.Unlock()
	a.setUpgrade(from, to, agentapi.UpgradeFailed, msg)
}

// upgradeMargin is the free space pg_upgrade needs beyond a copy of the data (or, with
// --link, at all): the new catalogs and WAL.
const upgradeMargin = 256 << 20

// upgradeTimeout bounds pg_upgrade: past it the upgrade fails and the old major starts
// again, rather than a primary reported upgrading for ever (the failover controller
// leaves one alone while its agent answers). A copy of a few terabytes fits.
const upgradeTimeout = 12 * time.Hour

// runUpgrade upgrades the primary's data from one major to the next (upgradeDue). It
// returns with postgres running as the primary: on the new major, or on the old one
// when a step failed before the new one ran (the data directory then is as it was).
func (a *Agent) runUpgrade(ctx context.Context, from, to string) error {
	// Checks, while the primary serves: every standby streams (each then has the old
	// major's final WAL after the stop, and stays the way back), the volume has room,
	// and pg_upgrade --check finds nothing the new major cannot take.
	if missing, err := a.standbysNotStreaming(ctx); err != nil {
		return err
	} else if len(missing) > 0 {
		a.setUpgrade(from, to, agentapi.UpgradeChecking, fmt.Sprintf("waiting for %s to stream from the primary before it stops", strings.Join(missing, ", ")))
		return nil
	}
	size := postgres.DirSize(a.cfg.PGData)
	free, _, err := postgres.VolumeSpace(filepath.Dir(a.cfg.PGData))
	if err != nil {
		return err
	}
	link := false
	switch {
	case free >= uint64(size)+upgradeMargin:
		// A copy: the old data directory stays whole whatever the new major does.
	case free >= upgradeMargin:
		link = true
		a.log.Info("Upgrading with pg_upgrade --link: the volume has no room for a copy of the data; the standbys keep the old major's data, set aside, as the way back", "data", size, "free", free)
	default:
		a.upgradeFailedNow(from, to, fmt.Sprintf("the volume has %d MiB free, pg_upgrade needs at least %d MiB: grow spec.storage.size, then restart the primary's pod to try again", free>>20, upgradeMargin>>20))
		return nil
	}
	up := postgres.Upgrade{NewBinDir: a.cfg.BinDir, Superuser: a.creds.Superuser.Username, Link: link, Jobs: runtime.NumCPU(), Port: a.cfg.Port}
	if a.upgradeChecked != to {
		a.setUpgrade(from, to, agentapi.UpgradeChecking, "checking the data with pg_upgrade --check against the running primary")
		check := up
		check.Check = true
		err = a.pg.PrepareUpgrade(ctx, up)
		if err == nil {
			err = a.pg.RunUpgrade(ctx, check)
		}
		if err != nil {
			undo := a.pg.UndoUpgrade()
			a.upgradeFailedNow(from, to, fmt.Sprintf("the data cannot be upgraded to PostgreSQL %s, nothing was stopped: %v", to, errors.Join(err, undo)))
			return nil
		}
		a.upgradeChecked = to
	}
	// Last, a recent backup (or the user's leave to go without): the one check a
	// person may have to act on, and it waits, rather than fails, until they have.
	if why := a.upgradeBackupWait(ctx, from); why != "" {
		a.setUpgrade(from, to, agentapi.UpgradeChecking, why)
		return nil
	}
	own, err := a.pg.SystemIdentifier()
	if err != nil {
		return err
	}
	lineage, err := backup.ReadLineage(a.cfg.PGData)
	if err != nil {
		return err
	}

	// The stop: as a switchover's, with nothing left unacknowledged, keeping the Lease.
	how := "--copy"
	if link {
		how = "--link"
	}
	a.setUpgrade(from, to, agentapi.UpgradeUpgrading, fmt.Sprintf("the primary stopped; pg_upgrade %s from PostgreSQL %s to %s", how, from, to))
	stopped := time.Now()
	// From the handover to the new start, the status says "upgrading", not "fenced",
	// "stopped" or "starting", which the failover controller takes for a failure.
	a.upgradingNow.Store(true)
	defer a.upgradingNow.Store(false)
	a.stopCleanly(ctx)
	a.mu.Lock()
	a.role = agentapi.RoleUpgrading
	a.mu.Unlock()
	view := a.lease.View()
	back := func(why error) error {
		if undo := a.pg.UndoUpgrade(); undo != nil {
			why = errors.Join(why, undo)
		}
		a.upgradeFailedNow(from, to, fmt.Sprintf("pg_upgrade failed; the primary runs PostgreSQL %s again on its data as it was: %v", from, why))
		return a.startInstance(ctx, Decision{Act: StartPrimary, Reason: "the upgrade failed: starting the old major again"}, view)
	}
	// The new data directory --check ran against is the one to upgrade into: pg_upgrade
	// --check changes nothing in it. (Made again if it went meanwhile.)
	a.upgradeChecked = ""
	if _, err := os.Stat(a.pg.UpgradeDir()); err != nil {
		if err := a.pg.PrepareUpgrade(ctx, up); err != nil {
			return back(err)
		}
	}
	uctx, cancel := context.WithTimeout(ctx, upgradeTimeout)
	err = a.pg.RunUpgrade(uctx, up)
	cancel()
	if err != nil {
		return back(err)
	}
	if err := a.pg.StartUpgradeOnTimeline(ctx, a.cfg.BinDir, a.upgradeTimeline(ctx)); err != nil {
		return back(err)
	}
	rec := postgres.UpgradeRecord{SystemIdentifier: own, Major: from, Lineage: lineage, At: time.Now().UTC()}
	why := fmt.Sprintf("upgraded to PostgreSQL %s by pg_upgrade %s: this is the PostgreSQL %s data directory as it was at the upgrade", to, how, from)
	if link {
		why += " (its files are shared with the new one: it cannot start again once the new one ran)"
	}
	aside, err := a.pg.FinishUpgrade(rec, why, time.Now())
	if err != nil {
		if aside == "" {
			return back(err)
		}
		return fmt.Errorf("finishing the upgrade: %w (the old data directory is %s)", err, aside)
	}
	if err := postgres.MarkOlderMajor(aside); err != nil {
		return err
	}
	a.noteSetAside()
	if _, err := backup.NewLineage(a.cfg.PGData); err != nil {
		return err
	}
	a.log.Info("Upgraded the data directory; starting PostgreSQL "+to, "from", from, "setAside", aside)
	if err := a.startInstance(ctx, Decision{Act: StartPrimary, Reason: "upgraded to PostgreSQL " + to}, view); err != nil {
		return err
	}
	a.mu.Lock()
	if a.upgrade != nil {
		a.upgrade.WritesStoppedMillis = time.Since(stopped).Milliseconds()
	}
	a.mu.Unlock()
	a.setUpgrade(from, to, agentapi.UpgradeAnalysing, "rebuilding the planner's statistics (vacuumdb --analyze-in-stages); the primary accepts writes")
	go a.analyze(a.runCtx, from, to)
	return nil
}

// upgradeTimeline is the timeline the upgraded database begins on: two above every
// timeline the old database used or reserved, as its data directory's checkpoint and
// history files and the primary Lease know them, so that neither database's recovery
// takes the other's history files for its own (postgres.StartUpgradeOnTimeline).
func (a *Agent) upgradeTimeline(ctx context.Context) int64 {
	top := max(a.lease.Record().Timeline, 1)
	if cd, err := a.pg.ControlData(ctx); err == nil {
		top = max(top, cd.Timeline)
	}
	if h, err := a.pg.HistoryFiles(); err == nil {
		for id := range h {
			top = max(top, id)
		}
	}
	return top + 2
}

// backupWaitLook bounds how often upgradeBackupWait reads the store.
const backupWaitLook = 30 * time.Second

// upgradeBackupWait says why the upgrade waits for a base backup of the data's major,
// "" when it need not: spec.upgrade.withoutBackup, or one that ended within
// spec.upgrade.backupMaxAge. It reads the store at most every backupWaitLook.
func (a *Agent) upgradeBackupWait(ctx context.Context, major string) string {
	rules := a.cluster.Upgrade
	if rules.WithoutBackup {
		return ""
	}
	const how = "take one (kubectl pgpilot backup CLUSTER, or a PostgresBackup), or set spec.upgrade.withoutBackup: true"
	if a.cluster.Backup == nil {
		return "waiting for a base backup before the primary stops: the cluster has no backup store (spec.backup); " + how
	}
	if time.Since(a.backupWaitLooked) < backupWaitLook {
		return a.backupWaitWhy
	}
	a.backupWaitLooked = time.Now()
	a.backupWaitWhy = func() string {
		store, infos, err := backupsOf(ctx, a.cluster.Backup, major)
		if err != nil {
			return "waiting for a base backup before the primary stops: " + err.Error()
		}
		var newest *backup.Info
		for i := range infos {
			if newest == nil || infos[i].StoppedAt.After(newest.StoppedAt) {
				newest = &infos[i]
			}
		}
		bound := rules.BackupAgeBound()
		switch {
		case newest == nil:
			return fmt.Sprintf("waiting for a base backup before the primary stops: %s has none of PostgreSQL %s; %s", store, major, how)
		case time.Since(newest.StoppedAt) > bound:
			return fmt.Sprintf("waiting for a base backup before the primary stops: the newest, %s, ended %s ago, longer than spec.upgrade.backupMaxAge (%s); %s",
				newest.ID, time.Since(newest.StoppedAt).Round(time.Minute), bound, how)
		}
		return ""
	}()
	return a.backupWaitWhy
}

// analyze rebuilds the planner's statistics after an upgrade: pg_upgrade carries none
// before PostgreSQL 18, which carries them and leaves only the missing ones.
func (a *Agent) analyze(ctx context.Context, from, to string) {
	args := []string{"--all", "--analyze-in-stages", "--host=" + a.cfg.SocketDir, "--port=" + strconv.Itoa(a.cfg.Port), "--username=" + a.creds.Superuser.Username}
	if !older(to, "18") {
		args = append(args, "--missing-stats-only")
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(a.cfg.BinDir, "vacuumdb"), args...)
	cmd.Env = append(os.Environ(), a.pg.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		a.setUpgrade(from, to, agentapi.UpgradeCompleted, fmt.Sprintf("upgraded to PostgreSQL %s; rebuilding the statistics failed (run ANALYZE): %v: %s", to, err, postgres.LastLines(out, 3)))
		return
	}
	a.setUpgrade(from, to, agentapi.UpgradeCompleted, fmt.Sprintf("upgraded to PostgreSQL %s; statistics rebuilt in %s", to, time.Since(start).Round(time.Second)))
}

// standbysNotStreaming are the cluster's other instances that do not stream from
// this primary.
func (a *Agent) standbysNotStreaming(ctx context.Context) ([]string, error) {
	streaming, err := a.db.StreamingStandbys(ctx)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range a.peers() {
		if !streaming[p] {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	return missing, nil
}

// upgradedPrimary reports whether primary runs a database pg_upgrade made from this
// standby's (the same system identifier and major its upgrade record names): this
// standby's data can then never follow it, and is set aside for a clone of it.
func (a *Agent) upgradedPrimary(ctx context.Context, primary string) (bool, error) {
	data, err := a.pg.Major()
	if err != nil || !older(data, a.cluster.Version) {
		return false, nil //nolint:nilerr // no data, or no upgrade under way
	}
	own, err := a.pg.SystemIdentifier()
	if err != nil {
		return false, nil //nolint:nilerr // no control file: the usual paths handle it
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := a.peerClient(primary).Status(sctx)
	if err != nil || st.UpgradedFrom == nil {
		return false, nil //nolint:nilerr // not known to be upgraded: follow it as before
	}
	if st.UpgradedFrom.SystemIdentifier != own || st.UpgradedFrom.Major != data || st.SystemIdentifier == own {
		return false, nil
	}
	if st.Role != agentapi.RolePrimary || !st.Ready {
		return false, fmt.Errorf("waiting for %s, upgraded to PostgreSQL %s, to be a ready primary before cloning it", primary, a.cluster.Version)
	}
	return true, nil
}

// cloneUpgraded replaces this standby's data of the old major, set aside, by a clone
// of primary's upgraded data, on the image's programs.
func (a *Agent) cloneUpgraded(ctx context.Context, primary string) error {
	a.pg.UseBinaries("")
	data, _ := a.pg.Major()
	why := fmt.Sprintf("the primary %s upgraded this database to PostgreSQL %s; this is this standby's PostgreSQL %s copy, as it was", primary, a.cluster.Version, data)
	aside, err := a.cloneAside(ctx, a.upstreamOf(primary), primary, why, true)
	if err != nil {
		return err
	}
	a.log.Info("Cloned the upgraded primary; the old major's data directory is set aside", "primary", primary, "setAside", aside)
	return nil
}

// backupLookEvery bounds how often newMajorBackedUp reads the store.
const backupLookEvery = 5 * time.Minute

// newMajorBackedUp reports whether the backup store holds a base backup of the data's
// major taken after since (an upgrade left data set aside then): the set-aside data of
// the older major is no longer the only way back. Without a store, never: that data
// stays until a person removes it (docs/operations.md, "Major version upgrades").
func (a *Agent) newMajorBackedUp(ctx context.Context, since time.Time) bool {
	a.mu.Lock()
	cfg, known, looked := a.cluster.Backup, a.backedUpSince, a.backedUpLooked
	a.mu.Unlock()
	if cfg == nil {
		return false
	}
	if !known.IsZero() && known.After(since) {
		return true
	}
	if time.Since(looked) < backupLookEvery {
		return false
	}
	major, err := a.pg.Major()
	if err != nil {
		return false
	}
	a.mu.Lock()
	a.backedUpLooked = time.Now()
	a.mu.Unlock()
	_, infos, err := backupsOf(ctx, cfg, major)
	if err != nil {
		a.log.Info("Could not tell whether the new major is backed up", "error", err.Error())
		return false
	}
	for _, info := range infos {
		if info.StartedAt.After(since) {
			a.mu.Lock()
			a.backedUpSince = info.StartedAt
			a.mu.Unlock()
			a.log.Info("A base backup of the new major exists: the older major's set-aside data may go when the volume needs the space", "backup", info.ID)
			return true
		}
	}
	return false
}

// backupsOf lists the base backups of PostgreSQL major in cfg's store, and names the
// store.
func backupsOf(ctx context.Context, cfg *clusterconfig.Backup, major string) (store.Store, []backup.Info, error) {
	st, err := OpenStore(cfg.Store)
	if err != nil {
		return nil, nil, fmt.Errorf("the backup store cannot be opened: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	infos, err := backup.List(lctx, st)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the backups in %s: %w", st, err)
	}
	return st, slices.DeleteFunc(infos, func(i backup.Info) bool { return i.PostgresMajor != major }), nil
}

// resumeUpgrade finishes or undoes, before anything starts, an upgrade this agent did
// not see through (postgres.ResumeUpgrade).
func (a *Agent) resumeUpgrade() error {
	did, err := a.pg.ResumeUpgrade()
	if did != "" {
		a.log.Info("Found an upgrade the agent did not finish: "+did, "dir", a.pg.UpgradeDir())
	}
	return err
}

// upgradedFrom is the data directory's upgrade record for the status: the database it
// was upgraded from.
func (a *Agent) upgradedFrom() *agentapi.UpgradedFrom {
	rec, err := postgres.ReadUpgradeRecord(a.cfg.PGData)
	if err != nil || rec == nil {
		return nil
	}
	return &agentapi.UpgradedFrom{SystemIdentifier: rec.SystemIdentifier, Major: rec.Major}
}

// CheckStore binds the store st to the database in pgdata before it archives or backs
// up there (backup.CheckSystem): its system identifier, its lineage, and the database
// it was upgraded from, which it succeeds there.
func CheckStore(ctx context.Context, st store.Store, pgdata string) error {
	system, err := postgres.SystemIdentifier(pgdata)
	if err != nil {
		return err
	}
	lineage, err := backup.ReadLineage(pgdata)
	if err != nil {
		return err
	}
	var from *backup.Predecessor
	if rec, err := postgres.ReadUpgradeRecord(pgdata); err != nil {
		return err
	} else if rec != nil {
		from = &backup.Predecessor{SystemIdentifier: rec.SystemIdentifier, Lineage: rec.Lineage, Major: rec.Major}
	}
	return backup.CheckSystem(ctx, st, system, lineage, from)
}
