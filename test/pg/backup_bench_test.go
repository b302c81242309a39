package pg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// BenchmarkBackupRestore measures, on about 300 MB of data (PGPILOT_BENCH_BACKUP_MB sets
// another size, e.g. 5120), b.N times each:
//   - plain: pg_basebackup -Ft -X fetch to the local disk (the yardstick);
//   - backup: a pgpilot base backup from a replica to a real S3 server on this machine
//     (compressed, with its digest and manifest);
//   - restore: that backup from S3 into an empty directory, digest and pg_verifybackup
//     included.
//
// It prints the median MB/s and seconds of each (MB of the data directory's tar) and
// the ratios of backup and restore to plain. It asserts nothing about the figures.
func BenchmarkBackupRestore(b *testing.B) {
	s := newS3Store(b)
	c, r := backupBenchCluster(b, s)
	ctx := context.Background()
	st := s.open(b, c.name)
	scratch := filepath.Join(c.dir, "bench")
	mustMkdir(b, scratch, 0o755)
	chownR(b, scratch)

	var plain, backups, restores, plainS, backupS, restoreS []float64
	b.ResetTimer()
	for i := range b.N {
		// The yardstick, from the same replica, as the postgres OS user.
		dst := filepath.Join(scratch, fmt.Sprintf("plain-%d", i))
		start := time.Now()
		cmd := exec.Command(filepath.Join(PGBin, "pg_basebackup"), "-h", filepath.Join(r.dir, "run"), "-U", "postgres",
			"-D", dst, "-F", "tar", "-X", "fetch", "--checkpoint=fast", "--no-manifest")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("pg_basebackup: %v: %s", err, out)
		}
		took := time.Since(start)
		size := dirSize(b, dst)
		plain, plainS = append(plain, mbps(size, took)), append(plainS, took.Seconds())
		_ = os.RemoveAll(dst)

		id := fmt.Sprintf("bench-%d", i)
		start = time.Now()
		if bs := r.takeBackup(id); bs.Phase != agentapi.BackupCompleted {
			b.Fatalf("backup: %+v", bs)
		}
		took = time.Since(start)
		infos, err := backup.List(ctx, st)
		if err != nil {
			b.Fatal(err)
		}
		info, err := backup.Choose(infos, id, backup.Target{})
		if err != nil {
			b.Fatal(err)
		}
		backups, backupS = append(backups, mbps(info.DataBytes, took)), append(backupS, took.Seconds())

		dst = filepath.Join(scratch, fmt.Sprintf("restore-%d", i))
		start = time.Now()
		if err := backup.Restore(ctx, st, info, dst, PGBin); err != nil {
			b.Fatal(err)
		}
		took = time.Since(start)
		restores, restoreS = append(restores, mbps(info.DataBytes, took)), append(restoreS, took.Seconds())
		_ = os.RemoveAll(dst)
		if i == 0 {
			b.Logf("data %.0f MB, stored %.0f MB compressed in %d volume(s)", float64(info.DataBytes)/1e6, float64(info.SizeBytes)/1e6, max(info.Volumes, 1))
		}
	}
	b.StopTimer()
	mp, mb, mr := median(plain), median(backups), median(restores)
	b.ReportMetric(mp, "plain-MB/s")
	b.ReportMetric(mb, "backup-MB/s")
	b.ReportMetric(mr, "restore-MB/s")
	b.ReportMetric(mb/mp, "backup/plain")
	b.ReportMetric(mr/mp, "restore/plain")
	b.ReportMetric(median(plainS), "plain-s")
	b.ReportMetric(median(backupS), "backup-s")
	b.ReportMetric(median(restoreS), "restore-s")
	b.ReportMetric(0, "ns/op")
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / 1e6 / d.Seconds() }

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

func dirSize(b testing.TB, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// backupBenchCluster is the backup benchmarks' cluster: two instances archiving to s,
// the primary's table big holding the data (about 300 MB, PGPILOT_BENCH_BACKUP_MB sets
// another size), and the replica, which the backups are taken from, holding it all.
func backupBenchCluster(b *testing.B, s *s3Store) (*cluster, *instance) {
	c := backedUpCluster(b, s, 2)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	// A million rows make about 300 MB of the backup's tar (3,017 MB for 9.85 million),
	// inserted half a million at a time (one statement must end within the harness's
	// timeout).
	rows := 1_000_000
	if mb, err := strconv.Atoi(os.Getenv("PGPILOT_BENCH_BACKUP_MB")); err == nil && mb > 0 {
		rows = mb * 1_000_000 / 300
	}
	p.mustExec("CREATE TABLE big (id int, pad text)")
	for from := 1; from <= rows; from += 500_000 {
		p.mustExec(fmt.Sprintf("INSERT INTO big SELECT g, md5(g::text) || repeat('x', 150) FROM generate_series(%d, %d) g", from, min(from+499_999, rows)))
	}
	r.waitRoleB(b, agentapi.RoleReplica, 1)
	r.waitCount("big", int64(rows), 30*time.Minute)
	return c, r
}
