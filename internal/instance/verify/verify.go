// Package verify proves that a base backup restores: it restores the newest base backup
// of a store (or a named one) into a scratch directory, starts PostgreSQL on it as a
// throw-away instance that reaches no one and archives nothing, and checks what it
// opened: every database accepts a connection and, with amcheck, every table and B-tree
// index is structurally sound. It runs in a pod of its own (`agent verify-backup`),
// never in an instance's: a restore needs the room of the whole data directory.
package verify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/verification"
)

// Options say what to verify and where.
type Options struct {
	Store store.Store
	// BackupID names the backup; empty picks the newest one of BinDir's major.
	BackupID string
	// Dir is the scratch directory; it must be empty or absent, and is emptied after.
	Dir string
	// BinDir holds postgres, pg_verifybackup and pg_amcheck.
	BinDir string
	// Amcheck runs pg_amcheck over every database (heap and B-tree checks).
	Amcheck bool
	Log     logr.Logger
}

// Run verifies a backup. Its error is also in the verification.Result's Message.
func Run(ctx context.Context, o Options) (verification.Result, error) {
	res := verification.Result{StartedAt: time.Now().UTC(), Amcheck: o.Amcheck}
	err := run(ctx, o, &res)
	res.FinishedAt = time.Now().UTC()
	res.Succeeded = err == nil
	if err != nil {
		res.Message = err.Error()
	}
	return res, err
}

func run(ctx context.Context, o Options, res *verification.Result) error {
	major, err := postgres.ProgramsMajor(ctx, o.BinDir)
	if err != nil {
		return err
	}
	infos, err := backup.List(ctx, o.Store)
	if err != nil {
		return fmt.Errorf("listing the backups in %s: %w", o.Store, err)
	}
	info, err := backup.Choose(backup.OfMajor(infos, major), o.BackupID, backup.Target{})
	if err != nil {
		return fmt.Errorf("choosing a backup of PostgreSQL %s in %s: %w", major, o.Store, err)
	}
	res.Backup, res.BackupStoppedAt, res.DataBytes = info.ID, &info.StoppedAt, info.DataBytes
	o.Log.Info("Verifying a base backup", "backup", info.ID, "takenAt", info.StoppedAt, "store", o.Store.String(), "dataBytes", info.DataBytes)

	pgdata, run := filepath.Join(o.Dir, "pgdata"), filepath.Join(o.Dir, "run")
	defer func() { _ = os.RemoveAll(pgdata); _ = os.RemoveAll(run) }()
	start := time.Now()
	if err := backup.Restore(ctx, o.Store, info, pgdata, o.BinDir); err != nil {
		return err
	}
	res.RestoreSeconds = seconds(time.Since(start))

	// The restored directory is the source instance's: it must not act as one. It starts
	// as a primary (the backup's WAL is inside it, so PostgreSQL replays to consistency
	// from pg_wal alone), listening on a private socket only, archiving nothing.
	// postgresql.auto.conf is the source's ALTER SYSTEM: it would override the
	// throw-away's settings.
	for _, name := range []string{"standby.signal", "recovery.signal", "postgresql.auto.conf"} {
		if err := os.Remove(filepath.Join(pgdata, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Mkdir(run, 0o700); err != nil {
		return err
	}
	conf := filepath.Join(run, "postgresql.conf")
	if err := os.WriteFile(conf, []byte(config(run)), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(run, "pg_hba.conf"), []byte("local all all trust\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(run, "pg_ident.conf"), nil, 0o600); err != nil {
		return err
	}
	start = time.Now()
	pg, err := startPostgres(o.BinDir, pgdata, conf, filepath.Join(run, "postgres.log"))
	if err != nil {
		return err
	}
	defer func() { _ = pg.stop() }()
	conn, err := pg.waitOpen(ctx, run, "postgres")
	if err != nil {
		return err
	}
	res.RecoverySeconds = seconds(time.Since(start))

	start = time.Now()
	dbs, err := databases(ctx, conn)
	_ = conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	for _, db := range dbs {
		n, err := relations(ctx, run, db)
		if err != nil {
			return fmt.Errorf("database %q of backup %s: %w", db, info.ID, err)
		}
		res.Databases++
		res.Relations += n
	}
	if o.Amcheck {
		if err := amcheck(ctx, o.BinDir, run); err != nil {
			return fmt.Errorf("backup %s: %w", info.ID, err)
		}
	}
	res.CheckSeconds = seconds(time.Since(start))
	res.Message = fmt.Sprintf("backup %s restored (%d MB) in %.1f s, opened in %.1f s; %d databases, %d relations",
		info.ID, info.DataBytes/1_000_000, res.RestoreSeconds, res.RecoverySeconds, res.Databases, res.Relations)
	if o.Amcheck {
		res.Message += ", pg_amcheck found no corruption"
	}
	return pg.stop()
}

// config is the throw-away instance's postgresql.conf; the restored one (an instance's,
// naming its certificates, archive command and peers) is not read.
func config(run string) string {
	return fmt.Sprintf(`listen_addresses = ''
unix_socket_directories = '%[1]s'
port = 5432
hba_file = '%[1]s/pg_hba.conf'
ident_file = '%[1]s/pg_ident.conf'
ssl = off
archive_mode = off
synchronous_standby_names = ''
logging_collector = off
max_connections = 20
shared_buffers = 128MB
`, run)
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}

type postgresProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startPostgres(binDir, pgdata, conf, logFile string) (*postgresProcess, error) {
	out, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	// What keeps the instance from reaching anyone is on the command line too, which no
	// file can override.
	cmd := exec.Command(filepath.Join(binDir, "postgres"), "-D", pgdata, "-c", "config_file="+conf,
		"-c", "listen_addresses=", "-c", "archive_mode=off", "-c", "primary_conninfo=", "-c", "restore_command=")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("starting postgres on the restored backup: %w", err)
	}
	p := &postgresProcess{cmd: cmd, done: make(chan struct{}), log: logFile}
	go func() { _ = cmd.Wait(); _ = out.Close(); close(p.done) }()
	return p, nil
}

// waitOpen waits until postgres accepts connections, and returns one to database db.
func (p *postgresProcess) waitOpen(ctx context.Context, run, db string) (*pgx.Conn, error) {
	for {
		conn, err := connect(ctx, run, db)
		if err == nil {
			return conn, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("postgres stopped before the restored backup opened: %s", p.lastLog(5))
		case <-ctx.Done():
			return nil, fmt.Errorf("the restored backup did not open: %w; %s", ctx.Err(), p.lastLog(3))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop shuts postgres down fast and waits for it.
func (p *postgresProcess) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("postgres on the restored backup did not stop within a minute")
	}
}

func (p *postgresProcess) lastLog(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

func connect(ctx context.Context, run, db string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database = run, 5432, "postgres", db
	cfg.TLSConfig = nil
	cfg.ConnectTimeout = 5 * time.Second
	return pgx.ConnectConfig(ctx, cfg)
}

func databases(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// relations connects to db and counts its relations: a database whose catalog cannot be
// read fails here.
func relations(ctx context.Context, run, db string) (int64, error) {
	conn, err := connect(ctx, run, db)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_class").Scan(&n)
	return n, err
}

// amcheck runs pg_amcheck over every database: the heap of every table and the structure
// of every B-tree index (it installs the amcheck extension where it is missing; the
// instance is thrown away).
func amcheck(ctx context.Context, binDir, run string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "pg_amcheck"), "--host", run, "--port", "5432",
		"--username", "postgres", "--no-password", "--all", "--install-missing")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		return fmt.Errorf("pg_amcheck: %w: %s", err, strings.Join(lines[:min(len(lines), 5)], " | "))
	}
	return nil
}
