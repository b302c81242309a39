package pg

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/pgpilot/pgpilot/internal/instance/backup"
)

// BenchmarkBackupStages splits a base backup's throughput into its stages, on the data
// of BenchmarkBackupRestore (PGPILOT_BENCH_BACKUP_MB), b.N times each, all from the
// replica's local socket as the postgres OS user:
//   - tar: pg_basebackup -Ft -D - -X fetch with the backup's manifest checksums, read
//     and thrown away;
//   - zstd: the same through the backup's zstd encoder, thrown away;
//   - zstd+s3: the same stored in the real S3 server;
//   - takebase-zstd, -s2, -none: backup.TakeBase, what the agent runs (adds the tar's
//     inspection, the digest and backup.json), with each compression.
//
// It prints the median MB/s of each (MB of the tar). It asserts nothing about them.
func BenchmarkBackupStages(b *testing.B) {
	s := newS3Store(b)
	c, r := backupBenchCluster(b, s)
	ctx := context.Background()
	st := s.open(b, c.name)
	bin := binAsPostgres(b, c)

	basebackup := func(sink func(io.Reader) error) (int64, time.Duration) {
		cmd := exec.Command(filepath.Join(PGBin, "pg_basebackup"), "-h", filepath.Join(r.dir, "run"), "-U", "postgres",
			"-D", "-", "-F", "tar", "-X", "fetch", "--checkpoint=fast", "--manifest-checksums=CRC32C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		counted := &countReader{r: out}
		if err := sink(counted); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		return counted.n, time.Since(start)
	}
	compress := func(dst io.Writer) func(io.Reader) error {
		return func(src io.Reader) error {
			enc, err := zstd.NewWriter(dst, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
			if err != nil {
				return err
			}
			if _, err := io.Copy(enc, src); err != nil {
				return err
			}
			return enc.Close()
		}
	}
	stages := []struct {
		name string
		run  func(i int) (int64, time.Duration)
	}{
		{"tar", func(int) (int64, time.Duration) {
			return basebackup(func(src io.Reader) error { _, err := io.Copy(io.Discard, src); return err })
		}},
		{"zstd", func(int) (int64, time.Duration) { return basebackup(compress(io.Discard)) }},
		{"zstd+s3", func(i int) (int64, time.Duration) {
			return basebackup(func(src io.Reader) error {
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(compress(pw)(src)) }()
				return st.Put(ctx, fmt.Sprintf("stages/%d", i), pr)
			})
		}},
	}
	for _, compression := range []string{backup.CompressionZstd, backup.CompressionS2, backup.CompressionNone} {
		stages = append(stages, struct {
			name string
			run  func(i int) (int64, time.Duration)
		}{"takebase-" + compression, func(i int) (int64, time.Duration) {
			start := time.Now()
			info, err := backup.TakeBase(ctx, st, backup.BaseBackupOptions{BinDir: bin, Host: filepath.Join(r.dir, "run"), Port: 5432,
				User: "postgres", ID: fmt.Sprintf("stages-%s-%d", compression, i), Cluster: c.name, Instance: r.pod, Compression: compression})
			if err != nil {
				b.Fatal(err)
			}
			if i == 0 {
				b.Logf("%s: %d MB stored as %d MB", compression, info.DataBytes/1_000_000, info.SizeBytes/1_000_000)
			}
			return info.DataBytes, time.Since(start)
		}})
	}
	b.ResetTimer()
	for _, stage := range stages {
		var rates []float64
		for i := range b.N {
			n, took := stage.run(i)
			rates = append(rates, mbps(n, took))
		}
		b.ReportMetric(median(rates), stage.name+"-MB/s")
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
