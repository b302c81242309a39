package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/instance/agent"
	"github.com/pgpilot/pgpilot/internal/instance/verify"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/verification"
)

// verifyBackup restores the newest base backup of the cluster's store (or -backup) into
// -dir, opens it with a throw-away PostgreSQL and checks it (internal/instance/verify).
// The result goes to -result as JSON (the pod's termination message, which the
// operator reads) and to the log; the exit code is 0 only when the backup verified.
func verifyBackup(args []string) error {
	fs := flag.NewFlagSet("verify-backup", flag.ExitOnError)
	config := fs.String("config", env("PGPILOT_CONFIG", "/etc/pgpilot/config/config.json"), "The cluster's config.json.")
	id := fs.String("backup", "", "The backup to verify (default: the newest of this image's PostgreSQL major).")
	dir := fs.String("dir", "/var/lib/pgpilot/verify", "An empty scratch directory with room for the whole data directory.")
	bin := fs.String("bin-dir", "", "Directory of the PostgreSQL programs (default: where postgres is on PATH, else /usr/lib/postgresql/$PG_MAJOR/bin).")
	amcheck := fs.Bool("amcheck", true, "Check every table and B-tree index with pg_amcheck.")
	result := fs.String("result", "/dev/termination-log", "Where to write the result as JSON (empty: nowhere).")
	timeout := fs.Duration("timeout", 0, "Give up after this long (0: never; the Job's deadline still applies).")
	_ = fs.Parse(args)
	if fs.NArg() != 0 {
		return errors.New("usage: agent verify-backup [flags]")
	}
	if *bin == "" {
		*bin = binDir()
	}
	log := zap.New()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}

	res, err := func() (verification.Result, error) {
		failed := func(err error) (verification.Result, error) {
			now := time.Now().UTC()
			return verification.Result{StartedAt: now, FinishedAt: now, Message: err.Error()}, err
		}
		cluster, err := clusterconfig.Load(*config)
		if err != nil {
			return failed(err)
		}
		if cluster.Backup == nil {
			return failed(errors.New("the cluster has no backup store (spec.backup.store)"))
		}
		st, err := agent.OpenStore(cluster.Backup.Store)
		if err != nil {
			return failed(err)
		}
		return verify.Run(ctx, verify.Options{Store: st, BackupID: *id, Dir: *dir, BinDir: *bin, Amcheck: *amcheck, Log: log})
	}()
	if *result != "" {
		// The termination message holds 4 KiB: the message is the only long field.
		if len(res.Message) > verification.MaxMessage/2 {
			res.Message = res.Message[:verification.MaxMessage/2] + "..."
		}
		b, merr := json.Marshal(res)
		if merr == nil {
			merr = os.WriteFile(*result, b, 0o644) //nolint:gosec // the termination message is read by the kubelet
		}
		if merr != nil {
			log.Error(merr, "Could not write the result", "file", *result)
		}
	}
	if err != nil {
		log.Error(err, "The backup did not verify", "backup", res.Backup)
		return fmt.Errorf("verifying backup %s: %w", res.Backup, err)
	}
	log.Info("The backup verified", "backup", res.Backup, "message", res.Message)
	return nil
}
