// Package backup takes physical base backups with pg_basebackup, archives and restores
// WAL segments, restores base backups into an empty data directory, and prunes a store
// to its retention. Everything is stored zstd-compressed in a store.Store, laid out as:
//
//	base/<id>/data.tar.zst   the base backup: one tar of the data directory, with the
//	                         WAL that makes it consistent and PostgreSQL's backup_manifest,
//	                         zstd-compressed (data.tar.s2 with s2, data.tar uncompressed:
//	                         Compression)
//	base/<id>/data.tar.zst.0001, .0002, ...
//	                         its continuation when it is larger than one volume
//	                         (DefaultVolumeSize): the objects, concatenated in order, are
//	                         the compressed tar
//	base/<id>/backup.json    Info; written last, so a backup without it is incomplete
//	wal/<segment>.zst        archived WAL segments, .history and .partial files
package backup

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Info describes one completed base backup; it is stored as base/<id>/backup.json.
type Info struct {
	ID        string    `json:"id"`
	Cluster   string    `json:"cluster"`
	Instance  string    `json:"instance"`
	StartedAt time.Time `json:"startedAt"`
	StoppedAt time.Time `json:"stoppedAt"`
	// BeginLSN is where recovery from this backup starts replaying; BeginWAL is its
	// segment file.
	BeginLSN string `json:"beginLSN"`
	BeginWAL string `json:"beginWAL"`
	// EndLSN is the earliest point the backup is consistent at.
	EndLSN   string `json:"endLSN"`
	Timeline int64  `json:"timeline"`
	// SizeBytes is the stored, compressed size; DataBytes the tar's size.
	SizeBytes int64 `json:"sizeBytes"`
	DataBytes int64 `json:"dataBytes"`
	// SHA256 is the digest of the stored data (its volumes concatenated), checked at
	// restore.
	SHA256 string `json:"sha256"`
	// Volumes is how many objects hold the data; 0 in backups taken before there were
	// volumes, which have one.
	Volumes int `json:"volumes,omitempty"`
	// Compression of the data: CompressionZstd (also when empty, as in backups taken
	// before there was a choice), CompressionS2 or CompressionNone.
	Compression string `json:"compression,omitempty"`
	// PostgresMajor is PG_VERSION of the backed-up data directory.
	PostgresMajor string `json:"postgresMajor"`
}

// ErrNoBackup is returned when no stored base backup fits a restore's request.
var ErrNoBackup = errors.New("no suitable base backup")

// The compressions of a base backup's data (spec.backup.compression).
const (
	// CompressionZstd is zstd at its fastest level: about 9:1 on typical table data, at
	// some 700 MB/s per core. The default.
	CompressionZstd = "zstd"
	// CompressionS2 is S2 (Snappy's extension): about half zstd's ratio at three times its
	// speed, for instances whose CPU, not their network, bounds a backup.
	CompressionS2 = "s2"
	// CompressionNone stores the tar as it is, for stores that compress or deduplicate.
	CompressionNone = "none"
)

// CheckCompression refuses a compression this package does not know.
func CheckCompression(c string) error {
	switch c {
	case "", CompressionZstd, CompressionS2, CompressionNone:
		return nil
	}
	return fmt.Errorf("compression %q: want zstd, s2 or none", c)
}

// dataKey is where volume i (from 0) of base backup id, compressed with compression, is
// stored.
func dataKey(id, compression string, i int) string {
	if i == 0 {
		return dataPrefix(id, compression)
	}
	return fmt.Sprintf("%s.%04d", dataPrefix(id, compression), i)
}

// dataPrefix is the key of base backup id's first volume, and the prefix of all of them.
func dataPrefix(id, compression string) string {
	switch compression {
	case CompressionS2:
		return "base/" + id + "/data.tar.s2"
	case CompressionNone:
		return "base/" + id + "/data.tar"
	}
	return "base/" + id + "/data.tar.zst"
}

// compressor returns compression's writer to w.
func compressor(compression string, w io.Writer) (io.WriteCloser, error) {
	switch compression {
	case CompressionS2:
		return s2.NewWriter(w, s2.WriterConcurrency(2)), nil
	case CompressionNone:
		return nopCloser{w}, nil
	}
	return zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
}

// decompressor returns compression's reader of r and what closes it.
func decompressor(compression string, r io.Reader) (io.Reader, func(), error) {
	switch compression {
	case CompressionS2:
		return s2.NewReader(r), func() {}, nil
	case CompressionNone:
		return r, func() {}, nil
	}
	dec, err := zstd.NewReader(r)
	if err != nil {
		return nil, nil, err
	}
	return dec, dec.Close, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// DefaultVolumeSize is the most stored bytes one object of a base backup holds; a larger
// backup continues in further objects. It keeps each object well inside the largest one
// an S3 multipart upload of the store's parts can make (156.25 GiB), so a backup's size
// has no limit but the store's capacity, and a Put's memory stays that of two parts.
const DefaultVolumeSize int64 = 100 << 30

func infoKey(id string) string { return "base/" + id + "/backup.json" }

// WALKey is where WAL file name is archived.
func WALKey(name string) string { return "wal/" + name + ".zst" }

var (
	validID  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	walName  = regexp.MustCompile(`^[0-9A-F]{24}(\.partial|\.[0-9A-F]{8}\.backup)?$|^[0-9A-F]{8}\.history$`)
	segments = regexp.MustCompile(`^[0-9A-F]{24}`)
)

// CheckID refuses IDs that are not Kubernetes object names (they become store keys).
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("backup ID %q is not a valid name: lowercase letters, digits, '-' and '.'", id)
	}
	return nil
}

// BaseBackupOptions say how to run pg_basebackup against the local instance.
type BaseBackupOptions struct {
	// BinDir holds pg_basebackup.
	BinDir string
	// Host is the local socket directory (or a host), Port postgres's port, User a role
	// with REPLICATION that may connect without a prompt (peer, or a pgpass file in Env).
	Host string
	Port int
	User string
	Env  []string
	// ID, Cluster and Instance name the backup.
	ID, Cluster, Instance string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// VolumeSize is the most stored bytes one object holds; DefaultVolumeSize when 0.
	VolumeSize int64
	// Compression is CompressionZstd (also when empty), CompressionS2 or
	// CompressionNone.
	Compression string
}

// TakeBase runs pg_basebackup (tar format, with the WAL fetched at its end, so the
// backup is consistent on its own) and streams its output, compressed, to st. The
// backup becomes visible (backup.json) only once the data is stored completely; on any
// failure the partial data is deleted.
func TakeBase(ctx context.Context, st store.Store, o BaseBackupOptions) (Info, error) {
	if err := CheckID(o.ID); err != nil {
		return Info{}, err
	}
	if err := CheckCompression(o.Compression); err != nil {
		return Info{}, err
	}
	compression := o.Compression
	if compression == "" {
		compression = CompressionZstd
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	info := Info{ID: o.ID, Cluster: o.Cluster, Instance: o.Instance, StartedAt: now().UTC()}
	if _, err := st.Stat(ctx, infoKey(o.ID)); err == nil {
		return Info{}, fmt.Errorf("%w: backup %s already exists in %s", agentapi.ErrConflict, o.ID, st)
	} else if !errors.Is(err, store.ErrNotFound) {
		return Info{}, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(o.BinDir, "pg_basebackup"),
		"-h", o.Host, "-p", strconv.Itoa(o.Port), "-U", o.User, "-w",
		"-D", "-", "-F", "tar", "-X", "fetch", "--checkpoint=fast", "--verbose",
		"--label=pgpilot "+o.ID, "--manifest-checksums=CRC32C")
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Info{}, err
	}
	if err := cmd.Start(); err != nil {
		return Info{}, fmt.Errorf("starting pg_basebackup: %w", err)
	}

	// The tar goes three ways: counted, inspected for backup_label and PG_VERSION, and
	// compressed into the store with a digest of what is stored.
	label := &tarInspector{}
	inspectR, inspectW := io.Pipe()
	inspected := make(chan error, 1)
	go func() {
		err := label.inspect(inspectR)
		_, _ = io.Copy(io.Discard, inspectR) // never block the writer
		inspected <- err
	}()
	storedR, storedW := io.Pipe()
	digest := sha256.New()
	stored := &countingWriter{w: io.MultiWriter(storedW, digest)}
	compressed := make(chan error, 1)
	raw := &countingWriter{w: inspectW}
	go func() {
		enc, err := compressor(compression, stored)
		if err == nil {
			_, err = io.Copy(enc, io.TeeReader(stdout, raw))
			if cerr := enc.Close(); err == nil {
				err = cerr
			}
		}
		inspectW.CloseWithError(err)
		storedW.CloseWithError(err)
		compressed <- err
	}()

	volumeSize := o.VolumeSize
	if volumeSize <= 0 {
		volumeSize = DefaultVolumeSize
	}
	volumes, putErr := putVolumes(ctx, st, o.ID, compression, storedR, volumeSize)
	if putErr != nil {
		storedR.CloseWithError(putErr) // unblocks the compressor
		cancel()
	}
	compErr := <-compressed
	waitErr := cmd.Wait()
	inspectErr := <-inspected
	fail := func(err error) (Info, error) {
		_ = deleteData(context.WithoutCancel(ctx), st, o.ID)
		return Info{}, err
	}
	switch {
	case waitErr != nil:
		return fail(fmt.Errorf("pg_basebackup: %w: %s", waitErr, lastLines(stderr.String(), 3)))
	case putErr != nil:
		return fail(fmt.Errorf("storing the base backup in %s: %w", st, putErr))
	case compErr != nil:
		return fail(fmt.Errorf("compressing the base backup: %w", compErr))
	case inspectErr != nil:
		return fail(fmt.Errorf("reading the base backup: %w", inspectErr))
	}

	info.StoppedAt = now().UTC()
	info.BeginLSN, info.BeginWAL, info.Timeline = label.startLSN, label.startWAL, label.timeline
	info.PostgresMajor = label.major
	info.EndLSN = endLSN(stderr.String())
	info.SizeBytes, info.DataBytes = stored.n, raw.n
	info.SHA256 = hex.EncodeToString(digest.Sum(nil))
	info.Volumes, info.Compression = volumes, compression
	if info.BeginLSN == "" || info.EndLSN == "" || !label.manifest {
		return fail(fmt.Errorf("the base backup is incomplete: backup_label start %q, end %q, manifest %v", info.BeginLSN, info.EndLSN, label.manifest))
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := st.Put(ctx, infoKey(o.ID), bytes.NewReader(b)); err != nil {
		return fail(fmt.Errorf("storing the backup's description in %s: %w", st, err))
	}
	return info, nil
}

// putVolumes stores r as base backup id's data: in objects of at most size bytes each,
// dataKey(id, 0), dataKey(id, 1), ..., one after the other. It returns how many it stored.
// Each object is stored atomically; a failure leaves the earlier ones for the caller to
// delete.
func putVolumes(ctx context.Context, st store.Store, id, compression string, r io.Reader, size int64) (int, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for i := 0; ; i++ {
		if i > 0 {
			// The previous volume ended at its limit: another starts only if the data goes on.
			if _, err := br.Peek(1); errors.Is(err, io.EOF) {
				return i, nil
			} else if err != nil {
				return i, err
			}
		}
		src := &io.LimitedReader{R: br, N: size}
		if err := st.Put(ctx, dataKey(id, compression, i), src); err != nil {
			return i, err
		}
		if src.N > 0 {
			return i + 1, nil // the data ended inside this volume
		}
	}
}

// deleteData deletes every volume of base backup id's data, whatever its compression.
func deleteData(ctx context.Context, st store.Store, id string) error {
	prefix := dataPrefix(id, CompressionNone)
	objs, err := st.List(ctx, prefix)
	if err != nil {
		return err
	}
	keys := []string{dataKey(id, CompressionZstd, 0)}
	for _, o := range objs {
		if o.Key == prefix || strings.HasPrefix(o.Key, prefix+".") {
			keys = append(keys, o.Key)
		}
	}
	return st.Delete(ctx, keys...)
}

// volumeReader reads base backup info's volumes one after the other.
type volumeReader struct {
	ctx  context.Context
	st   store.Store
	info Info
	next int           // the next volume to open
	cur  io.ReadCloser // the open volume; nil between volumes
}

func (v *volumeReader) Read(p []byte) (int, error) {
	volumes := max(v.info.Volumes, 1)
	for {
		if v.cur == nil {
			if v.next == volumes {
				return 0, io.EOF
			}
			r, err := v.st.Get(v.ctx, dataKey(v.info.ID, v.info.Compression, v.next))
			if err != nil {
				return 0, fmt.Errorf("reading volume %d of %d of backup %s from %s: %w", v.next+1, volumes, v.info.ID, v.st, err)
			}
			v.cur, v.next = r, v.next+1
		}
		n, err := v.cur.Read(p)
		if errors.Is(err, io.EOF) {
			err = v.cur.Close()
			v.cur = nil
			if n > 0 || err != nil {
				return n, err
			}
			continue
		}
		return n, err
	}
}

func (v *volumeReader) Close() error {
	if v.cur == nil {
		return nil
	}
	err := v.cur.Close()
	v.cur = nil
	return err
}

// endLSN reads "write-ahead log end point: 0/2000100" from pg_basebackup --verbose.
func endLSN(stderr string) string {
	const marker = "write-ahead log end point: "
	for _, line := range strings.Split(stderr, "\n") {
		if _, rest, ok := strings.Cut(line, marker); ok {
			return strings.Fields(rest)[0]
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// tarInspector reads the facts a backup's Info needs from its tar stream.
type tarInspector struct {
	startLSN, startWAL, major string
	timeline                  int64
	manifest                  bool
}

func (t *tarInspector) inspect(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch path.Clean(h.Name) {
		case "backup_label":
			b, err := io.ReadAll(io.LimitReader(tr, 64<<10))
			if err != nil {
				return err
			}
			t.parseLabel(string(b))
		case "PG_VERSION":
			b, err := io.ReadAll(io.LimitReader(tr, 64))
			if err != nil {
				return err
			}
			t.major = strings.TrimSpace(string(b))
		case "backup_manifest":
			t.manifest = true
		}
	}
}

// parseLabel reads "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)" and
// "START TIMELINE: 1".
func (t *tarInspector) parseLabel(label string) {
	for _, line := range strings.Split(label, "\n") {
		key, value, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		switch key {
		case "START WAL LOCATION":
			var lsn, file string
			if _, err := fmt.Sscanf(value, "%s (file %24s)", &lsn, &file); err == nil {
				t.startLSN, t.startWAL = lsn, file
			}
		case "START TIMELINE":
			t.timeline, _ = strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		}
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// List returns the completed base backups in st, oldest first.
func List(ctx context.Context, st store.Store) ([]Info, error) {
	objs, err := st.List(ctx, "base/")
	if err != nil {
		return nil, err
	}
	var infos []Info
	for _, o := range objs {
		if path.Base(o.Key) != "backup.json" {
			continue
		}
		info, err := readInfo(ctx, st, o.Key)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].StoppedAt.Before(infos[j].StoppedAt) })
	return infos, nil
}

func readInfo(ctx context.Context, st store.Store, key string) (Info, error) {
	var info Info
	r, err := st.Get(ctx, key)
	if err != nil {
		return info, err
	}
	defer r.Close()
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&info); err != nil {
		return info, fmt.Errorf("reading %s in %s: %w", key, st, err)
	}
	return info, nil
}

// Target is where a restore stops replaying WAL; the zero Target replays all of it.
type Target struct {
	Time *time.Time
	LSN  string
}

// OfMajor are the backups of infos that PostgreSQL major can restore: those of that
// major, and those that do not say (taken before backups recorded it).
func OfMajor(infos []Info, major string) []Info {
	return slices.DeleteFunc(slices.Clone(infos), func(i Info) bool { return i.PostgresMajor != "" && i.PostgresMajor != major })
}

// Choose picks the base backup to restore: the one named id, or else the newest that
// completed before the target (a backup is only consistent from its end, so one that
// ended after the target cannot reach it).
func Choose(infos []Info, id string, target Target) (Info, error) {
	if id != "" {
		for _, in := range infos {
			if in.ID == id {
				return in, checkReachable(in, target)
			}
		}
		return Info{}, fmt.Errorf("%w: backup %q is not in the store", ErrNoBackup, id)
	}
	for i := len(infos) - 1; i >= 0; i-- {
		if checkReachable(infos[i], target) == nil {
			return infos[i], nil
		}
	}
	if len(infos) == 0 {
		return Info{}, fmt.Errorf("%w: the store holds no completed base backup", ErrNoBackup)
	}
	return Info{}, fmt.Errorf("%w: every base backup in the store ended after the recovery target; the oldest ended at %s (%s)",
		ErrNoBackup, infos[0].StoppedAt.Format(time.RFC3339), infos[0].EndLSN)
}

func checkReachable(in Info, target Target) error {
	if target.Time != nil && in.StoppedAt.After(*target.Time) {
		return fmt.Errorf("%w: backup %s ended at %s, after the recovery target time %s",
			ErrNoBackup, in.ID, in.StoppedAt.Format(time.RFC3339), target.Time.UTC().Format(time.RFC3339))
	}
	if target.LSN != "" {
		want, err := agentapi.ParseLSN(target.LSN)
		if err != nil {
			return fmt.Errorf("the recovery target LSN %q: %w", target.LSN, err)
		}
		end, err := agentapi.ParseLSN(in.EndLSN)
		if err != nil || end > want {
			return fmt.Errorf("%w: backup %s is consistent from %s, after the recovery target LSN %s", ErrNoBackup, in.ID, in.EndLSN, target.LSN)
		}
	}
	return nil
}

// Restore unpacks base backup info from st into pgdata, which must be empty or absent,
// checks the stored digest and PostgreSQL's backup manifest (pg_verifybackup in binDir),
// and leaves pgdata ready for recovery. On failure pgdata is removed again.
func Restore(ctx context.Context, st store.Store, info Info, pgdata, binDir string) error {
	if entries, err := os.ReadDir(pgdata); err == nil && len(entries) > 0 {
		return fmt.Errorf("refusing to restore into %s: it is not empty", pgdata)
	}
	if err := os.MkdirAll(pgdata, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(pgdata, 0o700); err != nil {
		return err
	}
	err := restore(ctx, st, info, pgdata, binDir)
	if err != nil {
		_ = removeContents(pgdata)
	}
	return err
}

func restore(ctx context.Context, st store.Store, info Info, pgdata, binDir string) error {
	first, err := st.Get(ctx, dataKey(info.ID, info.Compression, 0))
	if err != nil {
		return fmt.Errorf("reading backup %s from %s: %w", info.ID, st, err)
	}
	r := &volumeReader{ctx: ctx, st: st, info: info, cur: first, next: 1}
	defer r.Close()
	digest := sha256.New()
	if err := CheckCompression(info.Compression); err != nil {
		return fmt.Errorf("backup %s: %w", info.ID, err)
	}
	dec, closeDec, err := decompressor(info.Compression, bufio.NewReaderSize(io.TeeReader(r, digest), 1<<20))
	if err != nil {
		return err
	}
	defer closeDec()
	corrupt := func() error {
		if _, err := io.Copy(digest, r); err != nil {
			return err
		}
		if got := hex.EncodeToString(digest.Sum(nil)); info.SHA256 != "" && got != info.SHA256 {
			return fmt.Errorf("backup %s in %s is corrupt: its digest is %s, not %s as recorded", info.ID, st, got, info.SHA256)
		}
		return nil
	}
	if err := untar(dec, pgdata); err != nil {
		// Data that does not unpack was most likely changed in the store: say so when the
		// digest shows it.
		if cerr := corrupt(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("unpacking backup %s: %w", info.ID, err)
	}
	// Whatever follows the tar's end (the compression's frame end) must be read for the
	// digest.
	if _, err := io.Copy(io.Discard, dec); err != nil {
		if cerr := corrupt(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("reading backup %s to its end: %w", info.ID, err)
	}
	if err := corrupt(); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "pg_verifybackup"), "--quiet", "--exit-on-error", pgdata).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_verifybackup found backup %s damaged: %w: %s", info.ID, err, lastLines(string(out), 3))
	}
	return nil
}

// untar unpacks a tar stream under dir, refusing entries that would land outside it.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	root := filepath.Clean(dir) + string(os.PathSeparator)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(h.Name))
		if dst != filepath.Clean(dir) && !strings.HasPrefix(dst, root) {
			return fmt.Errorf("the archive entry %q points outside the data directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				return err
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			// pg_basebackup writes pg_tblspc links; pgpilot clusters have no tablespaces.
			return fmt.Errorf("the archive entry %q is a symbolic link: backups with tablespaces cannot be restored", h.Name)
		}
	}
}

func removeContents(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// ArchiveWAL stores the WAL file at src under name, unless the store has it already.
// Every instance archives (archive_mode = always): a standby archives what it received,
// so that WAL the primary could not archive before it died is not lost, and whichever
// instance stores a segment first wins. Their copies can differ only after a WAL switch,
// in the unused rest of the segment. That a store directory holds one cluster's WAL
// only is CheckSystem's job.
func ArchiveWAL(ctx context.Context, st store.Store, src, name string) error {
	if !walName.MatchString(name) {
		return fmt.Errorf("%q is not a WAL file name", name)
	}
	if _, err := st.Stat(ctx, WALKey(name)); err == nil {
		return nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	content, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return err
	}
	defer enc.Close()
	if err := st.Put(ctx, WALKey(name), bytes.NewReader(enc.EncodeAll(content, nil))); err != nil {
		return fmt.Errorf("archiving %s to %s: %w", name, st, err)
	}
	return nil
}

// systemKey holds the identifier of the PostgreSQL cluster whose WAL a store directory
// holds.
const systemKey = "system.json"

type systemFile struct {
	SystemIdentifier string `json:"systemIdentifier"`
	// Lineage is the data directory lineage (LineageFile) that archives here; empty in
	// a file written before lineages existed, and then taken by the first to archive.
	Lineage string `json:"lineage,omitempty"`
	// Previous are the databases this one succeeded by a major version upgrade, the
	// latest last: their WAL and base backups stay in the directory.
	Previous []Predecessor `json:"previous,omitempty"`
}

// Predecessor is the database a data directory was upgraded from (pg_upgrade makes a
// new system identifier), as its upgrade record names it.
type Predecessor struct {
	SystemIdentifier string `json:"systemIdentifier"`
	Lineage          string `json:"lineage,omitempty"`
	Major            string `json:"major,omitempty"`
}

// CheckSystem makes sure the store directory belongs to one PostgreSQL cluster: the one
// with systemID (pg_control's system identifier) and lineage (LineageFile). It records
// both on first use and refuses another afterwards. WAL file names repeat from one
// cluster to the next (a cluster deleted and created again under its name starts over
// at timeline 1), so without this a new cluster's WAL would be taken for the old one's.
// A cluster restored from a backup keeps the system identifier but gets a lineage of
// its own: two clusters restored from one backup into one directory would otherwise mix
// their WAL and timeline IDs, and point-in-time recovery would replay the wrong history.
// An empty lineage (a data directory from before lineages) is not checked.
//
// A database made by pg_upgrade from the one the directory records (from, its upgrade
// record) succeeds it: the directory records the new one from then on, and the old
// one among the previous. WAL names do not collide: pg_upgrade starts the new WAL after
// the old one's last segment, on the same timeline.
func CheckSystem(ctx context.Context, st store.Store, systemID, lineage string, from *Predecessor) error {
	r, err := st.Get(ctx, systemKey)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return putSystem(ctx, st, systemFile{SystemIdentifier: systemID, Lineage: lineage})
	case err != nil:
		return err
	}
	defer r.Close()
	var f systemFile
	if err := json.NewDecoder(io.LimitReader(r, 64<<10)).Decode(&f); err != nil {
		return fmt.Errorf("reading %s in %s: %w", systemKey, st, err)
	}
	if f.SystemIdentifier != systemID && from != nil && from.SystemIdentifier == f.SystemIdentifier && (f.Lineage == "" || from.Lineage == "" || f.Lineage == from.Lineage) {
		f.Previous = append(f.Previous, Predecessor{SystemIdentifier: f.SystemIdentifier, Lineage: f.Lineage, Major: from.Major})
		f.SystemIdentifier, f.Lineage = systemID, lineage
		return putSystem(ctx, st, f)
	}
	if f.SystemIdentifier != systemID {
		return fmt.Errorf("%s holds the backups of another PostgreSQL cluster (system identifier %s; this one is %s): give this cluster a store path of its own (spec.backup.store.path), or delete the old backups",
			st, f.SystemIdentifier, systemID)
	}
	switch {
	case lineage == "" || f.Lineage == lineage:
		return nil
	case f.Lineage == "":
		f.Lineage = lineage
		return putSystem(ctx, st, f)
	}
	return fmt.Errorf("%s holds the WAL of another cluster restored from the same backup, or of the cluster this one was restored from "+
		"(the same system identifier %s, but lineage %s; this cluster's is %s): two clusters archiving into one place would mix their WAL and timelines, "+
		"and point-in-time recovery would replay the wrong history. Give this cluster a store path of its own (spec.backup.store.path)",
		st, systemID, f.Lineage, lineage)
}

func putSystem(ctx context.Context, st store.Store, f systemFile) error {
	b, _ := json.Marshal(f)
	return st.Put(ctx, systemKey, bytes.NewReader(b))
}

// LineageFile in a data directory names the history it belongs to. It is made with the
// cluster, made anew by a restore from a backup, and carried along by clones and
// rewinds (they copy the data directory's files).
const LineageFile = "pgpilot.lineage"

// ReadLineage reads pgdata's lineage; "" when it has none.
func ReadLineage(pgdata string) (string, error) {
	b, err := os.ReadFile(filepath.Join(pgdata, LineageFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return strings.TrimSpace(string(b)), err
}

// NewLineage gives pgdata a new, random lineage and returns it.
func NewLineage(pgdata string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	path := filepath.Join(pgdata, LineageFile)
	if err := os.WriteFile(path+".tmp", []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	return id, os.Rename(path+".tmp", path)
}

// RestoreWAL writes archived WAL file name to dst. A file that is not archived wraps
// store.ErrNotFound (the restore command then tells postgres so, by its exit code).
func RestoreWAL(ctx context.Context, st store.Store, name, dst string) error {
	if !walName.MatchString(name) {
		return fmt.Errorf("%w: %q is not a WAL file name", store.ErrNotFound, name)
	}
	content, err := fetchWAL(ctx, st, name)
	if err != nil {
		return err
	}
	tmp := dst + ".pgpilot-tmp"
	if err := os.WriteFile(tmp, content, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func fetchWAL(ctx context.Context, st store.Store, name string) ([]byte, error) {
	r, err := st.Get(ctx, WALKey(name))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	b, err := io.ReadAll(dec)
	if err != nil {
		return nil, fmt.Errorf("reading archived WAL %s from %s: %w", name, st, err)
	}
	return b, nil
}

// Delete removes base backup id from st: its description first, so that it is never
// listed half-deleted.
func Delete(ctx context.Context, st store.Store, id string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	if err := st.Delete(ctx, infoKey(id)); err != nil {
		return err
	}
	return deleteData(ctx, st, id)
}

// PruneWAL deletes the archived WAL that no base backup left in st needs: segments
// before the oldest backup's first one, on any timeline. Timeline history files are
// kept. With no backup in the store nothing is deleted.
func PruneWAL(ctx context.Context, st store.Store) (int, error) {
	infos, err := List(ctx, st)
	if err != nil || len(infos) == 0 {
		return 0, err
	}
	oldest := infos[0].BeginWAL
	for _, in := range infos[1:] {
		if segmentNumber(in.BeginWAL) < segmentNumber(oldest) {
			oldest = in.BeginWAL
		}
	}
	objs, err := st.List(ctx, "wal/")
	if err != nil {
		return 0, err
	}
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	prune := PrunableWAL(keys, oldest)
	if len(prune) == 0 {
		return 0, nil
	}
	return len(prune), st.Delete(ctx, prune...)
}

// PrunableWAL returns the keys of archived WAL files before segment file oldest, on
// any timeline; history files and unknown names are never returned.
func PrunableWAL(keys []string, oldest string) []string {
	if !segments.MatchString(oldest) {
		return nil
	}
	limit := segmentNumber(oldest)
	var out []string
	for _, k := range keys {
		name := strings.TrimSuffix(path.Base(k), ".zst")
		if !walName.MatchString(name) || !segments.MatchString(name) {
			continue
		}
		if segmentNumber(name) < limit {
			out = append(out, k)
		}
	}
	return out
}

// segmentNumber is a WAL file name's position without its timeline: the last 16 hex
// digits, which sort like the numbers they are.
func segmentNumber(name string) string { return name[8:24] }
