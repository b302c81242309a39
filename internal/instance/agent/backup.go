package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// OpenStore opens a backup store as config.json describes it, reading the S3 access
// key pair from its mounted Secret.
func OpenStore(sc clusterconfig.Store) (store.Store, error) {
	cfg := store.Config{Directory: sc.Directory, Prefix: sc.Prefix}
	if s3 := sc.S3; s3 != nil {
		read := func(name string) (string, error) {
			b, err := os.ReadFile(filepath.Join(s3.CredentialsDir, name))
			if err != nil {
				return "", fmt.Errorf("reading the S3 credentials: %w (is the credentials Secret mounted, with the keys spec.backup.store.s3.credentials names?)", err)
			}
			return strings.TrimSpace(string(b)), nil
		}
		id, err := read("ACCESS_KEY_ID")
		if err != nil {
			return nil, err
		}
		secret, err := read("SECRET_ACCESS_KEY")
		if err != nil {
			return nil, err
		}
		cfg.S3 = &store.S3Config{Endpoint: s3.Endpoint, Bucket: s3.Bucket, Region: s3.Region,
			AccessKeyID: id, SecretAccessKey: secret, InsecureSkipVerify: s3.InsecureSkipVerify, CAFile: s3.CAFile}
	}
	return store.New(cfg)
}

// ArchiveStatusFile is what the archive command writes after each attempt, for the
// agent's status: the archiver's last error in words, which pg_stat_archiver lacks.
type ArchiveStatusFile struct {
	WAL   string    `json:"wal"`
	At    time.Time `json:"at"`
	Error string    `json:"error,omitempty"`
}

// WriteArchiveStatus records the outcome of archiving wal.
func WriteArchiveStatus(path, wal string, err error) {
	st := ArchiveStatusFile{WAL: wal, At: time.Now().UTC()}
	if err != nil {
		st.Error = err.Error()
	}
	b, _ := json.Marshal(st)
	_ = pgconf.WriteFileAtomic(path, b, 0o600)
}

func (a *Agent) archiveStatusFile() string {
	return filepath.Join(a.cfg.SocketDir, "pgpilot-archive.json")
}

func (a *Agent) commands() pgconf.Commands {
	return pgconf.Commands{Agent: a.cfg.AgentBinary, ConfigPath: a.cfg.ClusterConfigPath, StatusFile: a.archiveStatusFile()}
}

// archiver reports continuous archiving on a primary.
func (a *Agent) archiver(arch *agentapi.ArchiverStatus, st *agentapi.Status) {
	a.mu.Lock()
	arch.Enabled = a.cluster.Backup != nil
	a.mu.Unlock()
	if ready, err := filepath.Glob(filepath.Join(a.cfg.PGData, "pg_wal", "archive_status", "*.ready")); err == nil {
		arch.Pending = len(ready)
		arch.PendingBytes = pendingBytes(filepath.Join(a.cfg.PGData, "pg_wal"), ready)
	}
	if b, err := os.ReadFile(a.archiveStatusFile()); err == nil {
		var f ArchiveStatusFile
		if json.Unmarshal(b, &f) == nil && f.Error != "" {
			arch.LastError = f.Error
		}
	}
	st.Archiver = arch
}

// pendingBytes is the size of the WAL files whose archive_status/<name>.ready files are
// ready: every segment has the same size, so one is looked at; history and backup
// label files are small and not counted.
func pendingBytes(walDir string, ready []string) int64 {
	segments := 0
	var size int64
	for _, r := range ready {
		name := strings.TrimSuffix(filepath.Base(r), ".ready")
		if len(name) != 24 || strings.Trim(name, "0123456789ABCDEF") != "" {
			continue
		}
		segments++
		if size == 0 {
			if fi, err := os.Stat(filepath.Join(walDir, name)); err == nil {
				size = fi.Size()
			}
		}
	}
	return int64(segments) * size
}

// backupJob is one base backup this agent took or takes.
type backupJob struct {
	status agentapi.BackupStatus
	cancel context.CancelFunc
}

// StartBackup implements agentapi.BackupInstance.
func (a *Agent) StartBackup(_ context.Context, id string) error {
	if err := backup.CheckID(id); err != nil {
		return fmt.Errorf("%w: %v", agentapi.ErrConflict, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.backups[id]; ok {
		return nil
	}
	for other, job := range a.backups {
		if job.status.Phase == agentapi.BackupRunning {
			return fmt.Errorf("%w: backup %s is running on this instance", agentapi.ErrConflict, other)
		}
	}
	if a.cluster.Backup == nil {
		return fmt.Errorf("%w: the cluster has no spec.backup.store", agentapi.ErrConflict)
	}
	if a.proc == nil || (a.role != agentapi.RolePrimary && a.role != agentapi.RoleReplica) {
		return fmt.Errorf("%w: postgres is %s", agentapi.ErrConflict, a.role)
	}
	st, err := OpenStore(a.cluster.Backup.Store)
	if err != nil {
		return err
	}
	// What the backup goroutine needs of the cluster, read under a.mu: a new config.json
	// replaces a.cluster.
	clusterName, compression := a.cluster.ClusterName, a.cluster.Backup.Compression
	ctx, cancel := context.WithCancel(a.runCtx)
	job := &backupJob{status: agentapi.BackupStatus{ID: id, Phase: agentapi.BackupRunning, StartedAt: time.Now().UTC(),
		Location: st.String() + "/base/" + id}, cancel: cancel}
	a.backups[id] = job
	a.log.Info("Starting a base backup", "backup", id, "store", st.String())
	go func() {
		defer cancel()
		info, err := func() (backup.Info, error) {
			if err := CheckStore(ctx, st, a.cfg.PGData); err != nil {
				return backup.Info{}, err
			}
			return backup.TakeBase(ctx, st, backup.BaseBackupOptions{
				BinDir: a.pg.Programs(), Host: a.cfg.SocketDir, Port: a.cfg.Port, User: a.creds.Superuser.Username,
				ID: id, Cluster: clusterName, Instance: a.cfg.PodName, Compression: compression,
			})
		}()
		a.mu.Lock()
		defer a.mu.Unlock()
		now := time.Now().UTC()
		job.status.StoppedAt = &now
		if err != nil {
			job.status.Phase, job.status.Error = agentapi.BackupFailed, err.Error()
			a.log.Error(err, "Base backup failed", "backup", id)
			return
		}
		job.status.Phase = agentapi.BackupCompleted
		job.status.StartedAt, job.status.StoppedAt = info.StartedAt, &info.StoppedAt
		job.status.BeginLSN, job.status.EndLSN, job.status.Timeline = info.BeginLSN, info.EndLSN, info.Timeline
		job.status.SizeBytes = info.SizeBytes
		a.log.Info("Base backup completed", "backup", id, "bytes", info.SizeBytes, "took",
			info.StoppedAt.Sub(info.StartedAt).Round(time.Millisecond).String())
	}()
	return nil
}

// Backup implements agentapi.BackupInstance.
func (a *Agent) Backup(_ context.Context, id string) (agentapi.BackupStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	job, ok := a.backups[id]
	if !ok {
		return agentapi.BackupStatus{}, fmt.Errorf("%w: this agent has not taken backup %s since it started", agentapi.ErrNotFound, id)
	}
	return job.status, nil
}

// Retention implements agentapi.BackupInstance.
func (a *Agent) Retention(ctx context.Context, req agentapi.RetentionRequest) (agentapi.RetentionResult, error) {
	res := agentapi.RetentionResult{Deleted: []string{}}
	a.mu.Lock()
	cfg := a.cluster.Backup
	a.mu.Unlock()
	if cfg == nil {
		return res, fmt.Errorf("%w: the cluster has no spec.backup.store", agentapi.ErrConflict)
	}
	st, err := OpenStore(cfg.Store)
	if err != nil {
		return res, err
	}
	for _, id := range req.Delete {
		if err := backup.Delete(ctx, st, id); err != nil {
			return res, fmt.Errorf("deleting backup %s from %s: %w", id, st, err)
		}
		res.Deleted = append(res.Deleted, id)
	}
	res.WALDeleted, err = backup.PruneWAL(ctx, st)
	if err != nil {
		return res, fmt.Errorf("pruning archived WAL in %s: %w", st, err)
	}
	if len(res.Deleted) > 0 || res.WALDeleted > 0 {
		a.log.Info("Applied the backup retention", "deleted", res.Deleted, "walDeleted", res.WALDeleted)
	}
	return res, nil
}

// restoreFromBackup fills an empty data directory from the restore source's base backup
// and prepares an archive recovery to the target; postgres then promotes itself there.
func (a *Agent) restoreFromBackup(ctx context.Context) error {
	r := a.cluster.Restore
	st, err := OpenStore(r.Store)
	if err != nil {
		return err
	}
	target := backup.Target{LSN: r.TargetLSN}
	if r.TargetTime != "" {
		t, err := time.Parse(time.RFC3339, r.TargetTime)
		if err != nil {
			return fmt.Errorf("the recovery target time %q is not RFC 3339: %w", r.TargetTime, err)
		}
		target.Time = &t
	}
	infos, err := backup.List(ctx, st)
	if err != nil {
		return fmt.Errorf("listing the backups in %s: %w", st, err)
	}
	// Only a base backup of the image's major can be restored with it: a store holds
	// both majors' after an upgrade.
	major, err := a.binMajor(ctx)
	if err != nil {
		return err
	}
	info, err := backup.Choose(backup.OfMajor(infos, major), r.BackupID, target)
	if err != nil {
		if other, oerr := backup.Choose(infos, r.BackupID, target); oerr == nil && other.PostgresMajor != major {
			return fmt.Errorf("restoring from %s: the base backup for this target, %s, is of PostgreSQL %s, and this cluster runs PostgreSQL %s: set spec.version to %q to restore it (a point before a major version upgrade), or pick a later target", st, other.ID, other.PostgresMajor, major, other.PostgresMajor)
		}
		return fmt.Errorf("restoring from %s: %w", st, err)
	}
	a.log.Info("Restoring a base backup", "backup", info.ID, "store", st.String(), "endedAt", info.StoppedAt,
		"targetTime", r.TargetTime, "targetLSN", r.TargetLSN)
	start := time.Now()
	if err := backup.Restore(ctx, st, info, a.cfg.PGData, a.pg.Programs()); err != nil {
		return err
	}
	// Files of the source instance that must not carry over: its role and its
	// bootstrap marker (the roles and database are checked again, passwords reset).
	for _, name := range []string{"standby.signal", postgres.BootstrapMarker} {
		if err := os.Remove(filepath.Join(a.cfg.PGData, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// A restored cluster is a history of its own from here on, even with the source's
	// system identifier: it must never archive where the source, or another cluster
	// restored from the same backup, does (backup.CheckSystem).
	if _, err := backup.NewLineage(a.cfg.PGData); err != nil {
		return err
	}
	if err := pgconf.WriteFileAtomic(filepath.Join(a.cfg.PGData, "recovery.signal"), nil, 0o600); err != nil {
		return err
	}
	a.log.Info("Restored the base backup; replaying archived WAL", "backup", info.ID,
		"took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// waitRecovered waits until postgres has left recovery (it promotes itself at the
// target or at the end of the archive), or exited.
func (a *Agent) waitRecovered(ctx context.Context) error {
	proc := a.process()
	for {
		inRecovery, err := a.db.InRecovery(ctx)
		if err == nil && !inRecovery {
			return nil
		}
		select {
		case <-proc.Done():
			a.setState(nil, agentapi.RoleStopped, "")
			return fmt.Errorf("postgres stopped while recovering from the backup: %s", proc.Complaint())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
