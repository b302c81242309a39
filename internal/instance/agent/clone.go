package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
)

// A standby is cloned only from a primary that is out of recovery.
//
// The Lease's holder is not always one. It is still in archive recovery while it
// restores the cluster from a backup (until its promotion onto the next timeline), and
// a standby the Lease has just named is one until its agent has promoted it. A clone
// taken from a server in recovery is a backup "from standby": PostgreSQL then requires
// the control file copied last to say the server was in recovery, and a server that
// leaves recovery while pg_basebackup copies it (its end-of-recovery checkpoint marks
// the control file shut down while it still counts as in recovery) gives a clone that
// never starts: "backup_label contains data inconsistent with control file", at every
// start (make e2e, TestScheduledBackupRestores, on a loaded machine: restored-1 cloned
// from restored-0 while restored-0 replayed the backup's WAL, and retried that data
// directory every 30 s for 18 minutes).
//
// The Lease's Bootstrapped mark is not the check: it says the cluster's first primary
// came up once, and it stays set through every later failover, while the new holder is
// still a standby until its promotion. So the clone asks the upstream itself, twice:
//   - before it starts (waitOutOfRecovery): the upstream's postgres reports
//     in_hot_standby off on a fresh connection (PostgreSQL 14+);
//   - after it is complete (Postgres.BaseBackup): its backup_label says "BACKUP FROM:
//     primary". A server that is promoted or goes into recovery while pg_basebackup
//     copies it fails this one, and the clone is discarded before it replaces anything.

// cloneWaitFor is how long a step waits for the upstream to leave recovery before it
// fails and is retried: the holder's agent promotes it within a second or two of the
// Lease naming it, while a restore can take minutes.
const cloneWaitFor = 30 * time.Second

// waitOutOfRecovery returns nil once the postgres at host, the primary the Lease names,
// answers out of recovery; an error otherwise (it does not answer, it is still in
// recovery after cloneWaitFor, or the Lease names another primary), so the step is
// retried.
func (a *Agent) waitOutOfRecovery(ctx context.Context, host pgconf.Upstream, primary string) error {
	if host.Standby {
		return nil // a replica cluster's designated primary: in recovery by design
	}
	deadline := time.Now().Add(cloneWaitFor)
	logged := false
	for {
		peer, err := peerSystem(ctx, host, 0)
		if err != nil {
			return fmt.Errorf("cloning from %s: asking whether it is out of recovery: %w", primary, err)
		}
		if !peer.inRecovery {
			return nil
		}
		if !logged {
			a.log.Info("Waiting for the primary to leave recovery before cloning from it: a clone of a server in recovery may not start", "primary", primary)
			logged = true
		}
		if holder := a.lease.View().Holder; !host.Source && holder != primary {
			return fmt.Errorf("cloning from %s: the Lease names %q now", primary, holder)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cloning from %s: it is still in recovery after %s (restoring the cluster from a backup, or a standby not yet promoted): a standby is cloned only from a primary out of recovery", primary, cloneWaitFor)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// clone clones the empty data directory from primary, once it is out of recovery.
func (a *Agent) clone(ctx context.Context, host pgconf.Upstream, primary string) error {
	if err := a.waitOutOfRecovery(ctx, host, primary); err != nil {
		return err
	}
	a.log.Info("Cloning from the primary", "primary", primary)
	if err := a.pg.BaseBackup(ctx, host); err != nil {
		return fmt.Errorf("cloning from %s: %w", primary, err)
	}
	// A clone is nobody's demoted primary, whatever its upstream's data was.
	if err := os.Remove(filepath.Join(a.cfg.PGData, demotedMarker)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if host.Source {
		// The source's bootstrap is not this cluster's: once promoted, its roles,
		// database and passwords are set up from this cluster's spec and Secrets, as
		// after a restore (adoptData).
		if err := os.Remove(filepath.Join(a.cfg.PGData, postgres.BootstrapMarker)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// cloneRefusals are the FATAL messages with which postgres refuses, at every start, a
// clone it has not yet started from: the clone itself is inconsistent (taken from a
// server that left recovery meanwhile, or incomplete), and no retry can change that.
var cloneRefusals = []string{
	"backup_label contains data inconsistent with control file",
	"could not locate required checkpoint record",
	"could not find redo location referenced by checkpoint record",
	`invalid data in file "backup_label"`,
}

// unstartableClone says why the standby data directory that postgres failed to start
// from (startErr) must be set aside and cloned again, "" when it must not: only when
// the Lease names another instance, and the directory is a clone postgres refused
// before it ever ran (cloneRefused). Such a directory never served as a primary nor
// acknowledged a commit; a primary's data is never set aside here.
func (a *Agent) unstartableClone(startErr error) string {
	if a.lease.View().Holder == a.cfg.PodName {
		return ""
	}
	return cloneRefused(a.cfg.PGData, startErr)
}

// cloneRefused says why postgres refused, with startErr, the standby data directory
// pgdata as a clone it cannot start from, "" otherwise. That is a refusal of
// cloneRefusals while pg_basebackup's backup_label is still there ("BACKUP METHOD:
// streamed"): postgres renames it backup_label.old as soon as it has accepted it, so
// the directory never got past its first start; pg_rewind writes a method of its own.
// Any other failure is retried on the same data as before.
func cloneRefused(pgdata string, startErr error) string {
	if startErr == nil {
		return ""
	}
	refusal := ""
	for _, r := range cloneRefusals {
		if strings.Contains(startErr.Error(), r) {
			refusal = r
			break
		}
	}
	if refusal == "" {
		return ""
	}
	if _, err := os.Stat(filepath.Join(pgdata, "standby.signal")); err != nil {
		return ""
	}
	label, err := postgres.ReadBackupLabel(pgdata)
	if err != nil || label["BACKUP METHOD"] != "streamed" {
		return ""
	}
	return fmt.Sprintf("postgres refuses to start from this clone, which never ran (%q; backup_label says it was taken from a %s)", refusal, label["BACKUP FROM"])
}
