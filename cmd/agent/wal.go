package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/agent"
	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// archiveWAL is postgres's archive_command: it stores one WAL file in the cluster's
// backup store, or does nothing when the cluster has none. A non-zero exit makes
// postgres keep the file and retry; the outcome is recorded for the agent's status.
func archiveWAL(args []string) error {
	fs := flag.NewFlagSet("archive-wal", flag.ExitOnError)
	config := fs.String("config", env("PGPILOT_CONFIG", "/etc/pgpilot/config/config.json"), "The cluster's config.json.")
	statusFile := fs.String("status-file", "", "Where to record the outcome for the agent.")
	pgdata := fs.String("pgdata", ".", "The data directory (postgres runs the archive command in it).")
	timeout := fs.Duration("timeout", 5*time.Minute, "How long one attempt may take.")
	_ = fs.Parse(args)
	if fs.NArg() != 2 {
		return errors.New("usage: agent archive-wal [flags] PATH NAME (archive_command's placeholders, in that order)")
	}
	path, name := fs.Arg(0), fs.Arg(1)
	cluster, err := clusterconfig.Load(*config)
	if err != nil {
		return err
	}
	if cluster.Backup == nil {
		return nil
	}
	// A placeholder (internal/instance/postgres/timeline.go) names a timeline this cluster may use
	// elsewhere: the archive keeps only real history files.
	if postgres.IsPlaceholderHistory(path) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err = func() error {
		st, err := agent.OpenStore(cluster.Backup.Store)
		if err != nil {
			return err
		}
		// postgres runs the archive command in the data directory.
		if err := agent.CheckStore(ctx, st, *pgdata); err != nil {
			return err
		}
		return backup.ArchiveWAL(ctx, st, path, name)
	}()
	if *statusFile != "" {
		agent.WriteArchiveStatus(*statusFile, name, err)
	}
	return err
}

// restoreWAL is postgres's restore_command while a new cluster recovers from a backup.
// Its exit code is what postgres reads: 0 restored, 1 not archived (the end of the
// archive), 255 when the store keeps failing after retries. Above 125 postgres aborts
// recovery and the agent starts it again, where a failure taken for "not archived"
// would end recovery early, short of the target.
func restoreWAL(args []string) int {
	fs := flag.NewFlagSet("restore-wal", flag.ExitOnError)
	config := fs.String("config", env("PGPILOT_CONFIG", "/etc/pgpilot/config/config.json"), "The cluster's config.json.")
	_ = fs.Parse(args)
	if fs.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: agent restore-wal [flags] NAME PATH (restore_command's placeholders, in that order)")
		return 2
	}
	name, path := fs.Arg(0), fs.Arg(1)
	cluster, err := clusterconfig.Load(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent restore-wal:", err)
		return 2
	}
	if cluster.Restore == nil {
		return 1
	}
	var last error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * time.Second)
		}
		last = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			st, err := agent.OpenStore(cluster.Restore.Store)
			if err != nil {
				return err
			}
			return backup.RestoreWAL(ctx, st, name, path)
		}()
		if last == nil {
			return 0
		}
		if errors.Is(last, store.ErrNotFound) {
			return 1
		}
	}
	fmt.Fprintln(os.Stderr, "agent restore-wal:", last)
	// Abort recovery (postgres exits and the agent starts it again) rather than let
	// postgres take an unreachable store for the end of the archive.
	return 255
}
