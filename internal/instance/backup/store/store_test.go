package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/pgpilot/pgpilot/internal/tools/testing/s3server"
)

// backend makes stores of one kind; stores made with different prefixes share a bucket or
// directory.
type backend struct {
	name string
	new  func(t *testing.T, prefix string) Store
	// s3 is the server of an S3 backend.
	s3     *s3server.Server
	bucket string
}

func dirBackend(t *testing.T) backend {
	dir := t.TempDir()
	return backend{name: "directory", new: func(t *testing.T, prefix string) Store {
		return mustNew(t, Config{Directory: dir, Prefix: prefix})
	}}
}

func s3Backend(t *testing.T) backend {
	srv := s3server.Start(t)
	srv.CreateBucket(t, "backups")
	return backend{name: "s3", s3: srv, bucket: "backups", new: func(t *testing.T, prefix string) Store {
		return mustNew(t, Config{S3: s3Config(srv, "backups"), Prefix: prefix})
	}}
}

func s3Config(srv *s3server.Server, bucket string) *S3Config {
	return &S3Config{
		Endpoint:        srv.Endpoint,
		Bucket:          bucket,
		Region:          srv.Region,
		AccessKeyID:     srv.AccessKeyID,
		SecretAccessKey: srv.SecretAccessKey,
	}
}

func mustNew(t *testing.T, cfg Config) Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

var prefixes atomic.Int64

// fresh returns a store with a prefix no other test uses.
func (b backend) fresh(t *testing.T) Store {
	return b.new(t, fmt.Sprintf("test/%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), prefixes.Add(1)))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// data is a deterministic pseudo-random stream of n bytes.
func data(seed uint64, n int64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	return io.LimitReader(rand.NewChaCha8(s), n)
}

func digest(t *testing.T, r io.Reader) ([32]byte, int64) {
	t.Helper()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatalf("reading: %v", err)
	}
	return [32]byte(h.Sum(nil)), n
}

func put(t *testing.T, s Store, key string, body string) {
	t.Helper()
	if err := s.Put(ctx(t), key, strings.NewReader(body)); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func keys(t *testing.T, s Store, prefix string) []string {
	t.Helper()
	objs, err := s.List(ctx(t), prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.Key)
	}
	return ks
}

func checkNotFound(t *testing.T, s Store, key string) {
	t.Helper()
	if _, err := s.Stat(ctx(t), key); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stat(%q) = %v, want ErrNotFound", key, err)
	}
	r, err := s.Get(ctx(t), key)
	if err == nil {
		r.Close()
	}
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("Get(%q) = %v, want ErrNotFound", key, err)
	}
}

// failingReader yields n bytes of data, then fails.
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

var behaviours = []struct {
	name string
	run  func(t *testing.T, b backend)
}{
	{"RoundTrip", func(t *testing.T, b backend) {
		s := b.fresh(t)
		// Empty, small, exactly one part, several parts (crossing partSize), and exactly
		// three parts (the stream ends at a part's end).
		for i, size := range []int64{0, 1000, partSize, 2*partSize + partSize/2 + 7, 3 * partSize} {
			key := fmt.Sprintf("base/%d/data.tar", i)
			if err := s.Put(ctx(t), key, data(uint64(i), size)); err != nil {
				t.Fatalf("Put %d bytes: %v", size, err)
			}
			want, _ := digest(t, data(uint64(i), size))
			r, err := s.Get(ctx(t), key)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			got, n := digest(t, r)
			if err := r.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if n != size || got != want {
				t.Errorf("Get(%q) returned %d bytes (sha256 %x), want the %d put (sha256 %x)", key, n, got[:8], size, want[:8])
			}
			obj, err := s.Stat(ctx(t), key)
			if err != nil {
				t.Fatalf("Stat: %v", err)
			}
			if obj.Key != key || obj.Size != size || time.Since(obj.Modified) > time.Hour || time.Until(obj.Modified) > time.Minute {
				t.Errorf("Stat(%q) = %+v, want key %q, size %d, modified about now", key, obj, key, size)
			}
			if ss, ok := s.(*s3Store); ok {
				// An object larger than a part went up in parts: its ETag ends in -<parts>.
				info, err := ss.client.StatObject(ctx(t), ss.bucket, ss.prefix+key, minio.StatObjectOptions{})
				if err != nil {
					t.Fatal(err)
				}
				parts := (size + partSize - 1) / partSize
				if multipart := strings.HasSuffix(info.ETag, fmt.Sprintf("-%d", parts)); multipart != (parts > 1) {
					t.Errorf("object of %d bytes has ETag %q; want it uploaded in %d parts", size, info.ETag, parts)
				}
			}
		}
	}},
	{"Overwrite", func(t *testing.T, b backend) {
		s := b.fresh(t)
		put(t, s, "k", "first, longer")
		put(t, s, "k", "second")
		r, err := s.Get(ctx(t), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if got, _ := io.ReadAll(r); string(got) != "second" {
			t.Errorf("Get = %q, want %q", got, "second")
		}
	}},
	{"List", func(t *testing.T, b backend) {
		s := b.fresh(t)
		for _, k := range []string{"wal/000000010000000000000002", "wal/000000010000000000000001", "wal-x", "base/20250101T000000/base.tar", "wal/00000002.history", "a"} {
			put(t, s, k, "content of "+k)
		}
		all := []string{"a", "base/20250101T000000/base.tar", "wal-x", "wal/000000010000000000000001", "wal/000000010000000000000002", "wal/00000002.history"}
		for _, tc := range []struct {
			prefix string
			want   []string
		}{
			{"", all},
			{"wal/", all[3:]},
			{"wal", all[2:]},
			{"wal/0000000100", all[3:5]},
			{"base/2025", all[1:2]},
			{"nothing", nil},
			{"nothing/", nil},
			{"nothing/here", nil},
		} {
			if got := keys(t, s, tc.prefix); !slices.Equal(got, tc.want) {
				t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		}
		objs, err := s.List(ctx(t), "base/")
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(len("content of base/20250101T000000/base.tar")); len(objs) != 1 || objs[0].Size != want || objs[0].Modified.IsZero() {
			t.Errorf("List(base/) = %+v, want one object of %d bytes with its modification time", objs, want)
		}
	}},
	{"Delete", func(t *testing.T, b backend) {
		s := b.fresh(t)
		for _, k := range []string{"wal/1", "wal/2", "wal/3", "keep"} {
			put(t, s, k, k)
		}
		if err := s.Delete(ctx(t), "wal/1", "wal/3", "missing", "wal/missing", "no/such/dir"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if got, want := keys(t, s, ""), []string{"keep", "wal/2"}; !slices.Equal(got, want) {
			t.Errorf("after Delete, List = %q, want %q", got, want)
		}
		checkNotFound(t, s, "wal/1")
		if err := s.Delete(ctx(t)); err != nil {
			t.Errorf("Delete() = %v", err)
		}
		if err := s.Delete(ctx(t), "wal/2", "keep"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if got := keys(t, s, ""); len(got) != 0 {
			t.Errorf("after deleting everything, List = %q", got)
		}
		// The emptied "wal" directory is gone, so the key can be a file now.
		put(t, s, "wal", "a file")
	}},
	{"Missing", func(t *testing.T, b backend) {
		s := b.fresh(t)
		checkNotFound(t, s, "nothing")
		put(t, s, "dir/file", "x")
		checkNotFound(t, s, "dir")           // a "directory" is no object
		checkNotFound(t, s, "dir/file/more") // below an object
		checkNotFound(t, s, "dir/other")
	}},
	{"FailedPutLeavesNothing", func(t *testing.T, b backend) {
		s := b.fresh(t)
		broken := errors.New("the disk ate it")
		put(t, s, "replaced", "old")
		for _, tc := range []struct {
			key  string
			size int64
		}{
			{"small", 1000},                       // fails before the one PUT
			{"large", partSize + partSize/2},      // fails after the first part is uploaded
			{"replaced", 2*partSize + partSize/3}, // fails in the third part; the old object stays
		} {
			err := s.Put(ctx(t), tc.key, &failingReader{r: data(1, tc.size), err: broken})
			if !errors.Is(err, broken) {
				t.Errorf("Put(%q) with a reader failing after %d bytes = %v, want the reader's error", tc.key, tc.size, err)
			}
		}
		checkNotFound(t, s, "small")
		checkNotFound(t, s, "large")
		r, err := s.Get(ctx(t), "replaced")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if got, _ := io.ReadAll(r); string(got) != "old" {
			t.Errorf("after a failed Put, Get(replaced) = %d bytes, want the old object", len(got))
		}
		if got, want := keys(t, s, ""), []string{"replaced"}; !slices.Equal(got, want) {
			t.Errorf("List = %q, want %q", got, want)
		}
		if b.s3 != nil {
			// minio-go aborted the multipart uploads: no parts are left behind.
			ss := s.(*s3Store)
			for u := range ss.client.ListIncompleteUploads(ctx(t), ss.bucket, ss.prefix, true) {
				if u.Err != nil {
					t.Fatal(u.Err)
				}
				t.Errorf("incomplete upload left behind: %s", u.Key)
			}
		}
	}},
	{"CanceledPut", func(t *testing.T, b backend) {
		s := b.fresh(t)
		// The context ends once the first part has been read (and, in S3, uploaded).
		c, cancel := context.WithCancel(ctx(t))
		r := data(2, partSize+100)
		var n int64
		err := s.Put(c, "canceled", readFunc(func(p []byte) (int, error) {
			if n += int64(len(p)); n > partSize+10 {
				cancel()
			}
			return r.Read(p)
		}))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Put with its context canceled midway = %v, want context.Canceled", err)
		}
		checkNotFound(t, s, "canceled")
		if b.s3 != nil {
			// minio-go's abort of the multipart upload failed with the canceled context;
			// Put aborted it with a fresh one.
			ss := s.(*s3Store)
			for u := range ss.client.ListIncompleteUploads(ctx(t), ss.bucket, ss.prefix, true) {
				if u.Err != nil {
					t.Fatal(u.Err)
				}
				t.Errorf("incomplete upload left behind: %s", u.Key)
			}
		}
	}},
	{"InvalidKeys", func(t *testing.T, b backend) {
		s := b.fresh(t)
		for _, key := range []string{"", "/etc/passwd", "..", "../escape", "a/../../escape", "a/./b", "a//b", "a/", ".", "x/" + tempMarker + "1"} {
			if err := s.Put(ctx(t), key, strings.NewReader("x")); err == nil {
				t.Errorf("Put(%q) succeeded, want it refused", key)
			}
			if _, err := s.Get(ctx(t), key); err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("Get(%q) = %v, want it refused", key, err)
			}
			if _, err := s.Stat(ctx(t), key); err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("Stat(%q) = %v, want it refused", key, err)
			}
			if err := s.Delete(ctx(t), key); err == nil {
				t.Errorf("Delete(%q) succeeded, want it refused", key)
			}
		}
		for _, prefix := range []string{"/", "../", "a/../../"} {
			if _, err := s.List(ctx(t), prefix); err == nil {
				t.Errorf("List(%q) succeeded, want it refused", prefix)
			}
		}
		if got := keys(t, s, ""); len(got) != 0 {
			t.Errorf("List = %q, want nothing", got)
		}
		if _, err := New(Config{Directory: "/tmp", Prefix: "a/../.."}); err == nil {
			t.Error("New with a prefix escaping the root succeeded")
		}
	}},
	{"PrefixIsolation", func(t *testing.T, b backend) {
		base := fmt.Sprintf("iso-%d", prefixes.Add(1))
		one := b.new(t, base+"/pg")
		two := b.new(t, base+"/pg2") // "pg" is a prefix of "pg2" as a string
		parent := b.new(t, "/"+base+"/")
		put(t, one, "wal/1", "one")
		put(t, two, "wal/1", "two")
		put(t, two, "wal/2", "two")
		if got, want := keys(t, one, ""), []string{"wal/1"}; !slices.Equal(got, want) {
			t.Errorf("store %s lists %q, want %q", one, got, want)
		}
		if got, want := keys(t, two, "wal/"), []string{"wal/1", "wal/2"}; !slices.Equal(got, want) {
			t.Errorf("store %s lists %q, want %q", two, got, want)
		}
		checkNotFound(t, one, "wal/2")
		if err := one.Delete(ctx(t), "wal/1", "wal/2"); err != nil {
			t.Fatal(err)
		}
		if got, want := keys(t, parent, ""), []string{"pg2/wal/1", "pg2/wal/2"}; !slices.Equal(got, want) {
			t.Errorf("store %s lists %q, want %q", parent, got, want)
		}
	}},
	{"String", func(t *testing.T, b backend) {
		s := b.new(t, "/path/clustername/")
		got := s.String()
		want := "/path/clustername"
		if b.s3 != nil {
			want = "s3://" + b.bucket + want
			if strings.Contains(got, b.s3.SecretAccessKey) || strings.Contains(got, b.s3.AccessKeyID) {
				t.Errorf("String() = %q contains a credential", got)
			}
		}
		if !strings.HasSuffix(got, want) {
			t.Errorf("String() = %q, want it to end with %q", got, want)
		}
	}},
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

func TestStore(t *testing.T) {
	for _, b := range []backend{dirBackend(t), s3Backend(t)} {
		t.Run(b.name, func(t *testing.T) {
			for _, bh := range behaviours {
				t.Run(bh.name, func(t *testing.T) { bh.run(t, b) })
			}
		})
	}
}

func TestDirectory(t *testing.T) {
	dir := t.TempDir()
	s := mustNew(t, Config{Directory: dir, Prefix: "cluster"})

	t.Run("Layout", func(t *testing.T) {
		put(t, s, "wal/1", "x")
		if b, err := os.ReadFile(filepath.Join(dir, "cluster", "wal", "1")); err != nil || string(b) != "x" {
			t.Errorf("the object's file holds %q, %v; want %q", b, err, "x")
		}
	})
	t.Run("TemporaryFiles", func(t *testing.T) {
		// A crash between creating and renaming leaves a temporary file: List skips it.
		stray := filepath.Join(dir, "cluster", "wal", tempMarker+"2-123")
		if err := os.WriteFile(stray, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, want := keys(t, s, "wal/"), []string{"wal/1"}; !slices.Equal(got, want) {
			t.Errorf("List = %q, want %q", got, want)
		}
		// A failed Put removes its temporary file.
		_ = s.Put(ctx(t), "wal/3", &failingReader{r: data(3, 100000), err: errors.New("broken")})
		entries, err := os.ReadDir(filepath.Join(dir, "cluster", "wal"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if want := []string{tempMarker + "2-123", "1"}; !slices.Equal(names, want) {
			t.Errorf("the directory holds %q, want %q", names, want)
		}
	})
	t.Run("Config", func(t *testing.T) {
		for _, tc := range []struct {
			cfg  Config
			want string
		}{
			{Config{}, "configure an S3 bucket or a directory"},
			{Config{Directory: dir, S3: &S3Config{}}, "not both"},
			{Config{Directory: "relative"}, "absolute"},
			{Config{Directory: filepath.Join(dir, "missing")}, "does not exist: is its volume mounted?"},
			{Config{Directory: filepath.Join(dir, "cluster", "wal", "1")}, "is not a directory"},
		} {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
			}
		}
	})
}

// TestS3Errors checks the errors an operator sees when the S3 store is misconfigured or
// down: each says what is wrong, and none holds the secret.
func TestS3Errors(t *testing.T) {
	srv := s3server.Start(t)
	srv.CreateBucket(t, "backups")
	good := mustNew(t, Config{S3: s3Config(srv, "backups"), Prefix: "cluster"})
	put(t, good, "wal/1", "x")

	// every runs each operation against s and checks its error.
	every := func(t *testing.T, s Store, secret, want string) {
		t.Helper()
		_, getErr := s.Get(ctx(t), "wal/1")
		_, statErr := s.Stat(ctx(t), "wal/1")
		_, listErr := s.List(ctx(t), "wal/")
		for op, err := range map[string]error{
			"Put":    s.Put(ctx(t), "wal/2", strings.NewReader("y")),
			"Get":    getErr,
			"Stat":   statErr,
			"List":   listErr,
			"Delete": s.Delete(ctx(t), "wal/1"),
		} {
			t.Logf("%s: %v", op, err)
			switch {
			case err == nil:
				t.Errorf("%s succeeded, want an error containing %q", op, want)
			case !strings.Contains(err.Error(), want):
				t.Errorf("%s: %v\nwant an error containing %q", op, err, want)
			case strings.Contains(err.Error(), secret):
				t.Errorf("%s: %v\ncontains the secret", op, err)
			case errors.Is(err, ErrNotFound):
				t.Errorf("%s: %v\nis ErrNotFound", op, err)
			}
		}
	}

	t.Run("WrongSecret", func(t *testing.T) {
		cfg := s3Config(srv, "backups")
		cfg.SecretAccessKey = "not-the-secret-" + srv.SecretAccessKey[:8]
		s := mustNew(t, Config{S3: cfg, Prefix: "cluster"})
		every(t, s, cfg.SecretAccessKey, "the S3 store refused the credentials (SignatureDoesNotMatch): check the credentials Secret")
	})
	t.Run("WrongAccessKey", func(t *testing.T) {
		cfg := s3Config(srv, "backups")
		cfg.AccessKeyID = "NOSUCHKEY"
		s := mustNew(t, Config{S3: cfg, Prefix: "cluster"})
		every(t, s, cfg.SecretAccessKey, "the S3 store refused the credentials (InvalidAccessKeyId): check the credentials Secret")
	})
	t.Run("AccessDenied", func(t *testing.T) {
		cfg := s3Config(srv, "backups")
		cfg.AccessKeyID, cfg.SecretAccessKey = "OTHERUSER", "other-user-secret"
		srv.CreateUser(t, cfg.AccessKeyID, cfg.SecretAccessKey)
		s := mustNew(t, Config{S3: cfg, Prefix: "cluster"})
		every(t, s, cfg.SecretAccessKey, "the S3 store denied access (AccessDenied): the credentials need permission for s3:")
	})
	t.Run("WrongRegion", func(t *testing.T) {
		cfg := s3Config(srv, "backups")
		cfg.Region = "eu-west-1"
		s := mustNew(t, Config{S3: cfg, Prefix: "cluster"})
		every(t, s, cfg.SecretAccessKey, "the S3 store rejected the region eu-west-1 (")
	})
	t.Run("MissingBucket", func(t *testing.T) {
		s := mustNew(t, Config{S3: s3Config(srv, "no-such-bucket"), Prefix: "cluster"})
		every(t, s, srv.SecretAccessKey, "bucket no-such-bucket does not exist at "+srv.Endpoint)
	})
	t.Run("Unreachable", func(t *testing.T) {
		srv.Stop()
		// minio-go retries a request that cannot be sent for some seconds: one operation
		// is enough here (the mapping of each kind of network error is tested below).
		_, err := good.Stat(ctx(t), "wal/1")
		want := "cannot reach the S3 endpoint " + srv.Endpoint + ": "
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("Stat with the server down = %v, want an error containing %q and the cause", err, want)
		} else if strings.Contains(err.Error(), srv.SecretAccessKey) {
			t.Errorf("Stat: %v\ncontains the secret", err)
		}
		t.Log(err)
		srv.Restart(t)
		if _, err := good.Stat(ctx(t), "wal/1"); err != nil {
			t.Errorf("Stat after the restart: %v", err)
		}
	})
	t.Run("Config", func(t *testing.T) {
		valid := *s3Config(srv, "backups")
		for _, tc := range []struct {
			edit func(c *S3Config)
			want string
		}{
			{func(c *S3Config) { c.Endpoint = "127.0.0.1:9000" }, "must be http://host[:port] or https://host[:port]"},
			{func(c *S3Config) { c.Endpoint = "ftp://host" }, "must be http://host[:port] or https://host[:port]"},
			{func(c *S3Config) { c.Endpoint = "http://host/bucket" }, "must have no path"},
			{func(c *S3Config) { c.Endpoint = "http://key:" + c.SecretAccessKey + "@host" }, "must not hold credentials"},
			{func(c *S3Config) { c.Bucket = "" }, "S3 bucket: required"},
			{func(c *S3Config) { c.Bucket = "x" }, `S3 bucket "x"`},
			{func(c *S3Config) { c.SecretAccessKey = "" }, "both an access key ID and a secret access key are required"},
			{func(c *S3Config) { c.Endpoint = "https://host"; c.CAFile = "/nonexistent/ca.pem" }, "S3 CA bundle"},
		} {
			cfg := valid
			tc.edit(&cfg)
			_, err := New(Config{S3: &cfg})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New(endpoint %q, bucket %q) = %v, want an error containing %q", cfg.Endpoint, cfg.Bucket, err, tc.want)
			} else if strings.Contains(err.Error(), srv.SecretAccessKey) {
				t.Errorf("New: %v\ncontains the secret", err)
			}
		}
	})
}

func TestS3TLS(t *testing.T) {
	srv := s3server.StartTLS(t)
	srv.CreateBucket(t, "backups")
	cfg := s3Config(srv, "backups")

	t.Run("CAFile", func(t *testing.T) {
		c := *cfg
		c.CAFile = srv.CAFile
		s := mustNew(t, Config{S3: &c})
		put(t, s, "k", "over TLS")
		if _, err := s.Stat(ctx(t), "k"); err != nil {
			t.Errorf("Stat: %v", err)
		}
	})
	t.Run("InsecureSkipVerify", func(t *testing.T) {
		c := *cfg
		c.InsecureSkipVerify = true
		s := mustNew(t, Config{S3: &c})
		if _, err := s.Stat(ctx(t), "k"); err != nil {
			t.Errorf("Stat: %v", err)
		}
	})
	t.Run("Untrusted", func(t *testing.T) {
		s := mustNew(t, Config{S3: cfg})
		_, err := s.Stat(ctx(t), "k")
		want := "cannot verify the TLS certificate of the S3 endpoint " + srv.Endpoint + ": x509: certificate signed by unknown authority"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Stat without trusting the CA = %v, want an error containing %q", err, want)
		}
	})
	t.Run("NotPEM", func(t *testing.T) {
		c := *cfg
		c.CAFile = filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(c.CAFile, []byte("not a certificate"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{S3: &c}); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
			t.Errorf("New with a CA file that is not PEM = %v", err)
		}
	})
}

// TestS3ErrorMapping checks the messages for failures versitygw does not readily produce.
func TestS3ErrorMapping(t *testing.T) {
	s, err := newS3(S3Config{Endpoint: "https://s3.example.test:9000", Bucket: "backups", AccessKeyID: "AKID", SecretAccessKey: "SECRET"}, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&url.Error{Op: "Put", URL: "https://s3.example.test:9000/backups/cluster/k", Err: &net.DNSError{Err: "no such host", Name: "s3.example.test", IsNotFound: true}}, "put s3://backups/cluster/k: cannot reach the S3 endpoint https://s3.example.test:9000: lookup s3.example.test: no such host; check the endpoint's host name"},
		{&url.Error{Op: "Put", URL: "https://s3.example.test:9000/backups/cluster/k", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}}, "cannot reach the S3 endpoint https://s3.example.test:9000: dial tcp: i/o timeout; check the endpoint"},
		{&url.Error{Op: "Put", URL: "https://s3.example.test:9000/backups/cluster/k", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}, "the S3 endpoint https://s3.example.test:9000 does not speak TLS: use an http:// endpoint"},
		{minio.ErrorResponse{Code: "AccessDenied", Message: "Access Denied.", StatusCode: 403}, "the S3 store denied access (AccessDenied): the credentials need permission for s3:PutObject on s3://backups/cluster"},
		{minio.ErrorResponse{Code: "AuthorizationHeaderMalformed", Message: "the region 'us-east-1' is wrong; expecting 'eu-west-1'", StatusCode: 400}, "the S3 store rejected the region us-east-1 (AuthorizationHeaderMalformed: the region 'us-east-1' is wrong; expecting 'eu-west-1'): set the region the bucket is in"},
		{minio.ErrorResponse{Code: "SlowDown", Message: "Please reduce your request rate.", StatusCode: 503}, "the S3 store answered SlowDown (HTTP 503): Please reduce your request rate."},
		{minio.ErrorResponse{Code: "NoSuchKey", StatusCode: 404}, "put s3://backups/cluster/k: not found"},
	} {
		got := s.error(context.Background(), "put", "k", tc.err)
		if !strings.Contains(got.Error(), tc.want) {
			t.Errorf("error(%v) = %q, want it to contain %q", tc.err, got, tc.want)
		}
	}
}

func TestSizeGuard(t *testing.T) {
	const limit = 100
	for _, tc := range []struct {
		size    int
		wantErr error
	}{
		{0, nil}, {99, nil}, {limit, nil}, {limit + 1, errTooLarge}, {3 * limit, errTooLarge},
	} {
		// Read as minio-go does: into a buffer the size of the limit, then on.
		g := &sizeGuard{r: bytes.NewReader(make([]byte, tc.size)), left: limit}
		buf := make([]byte, limit)
		var n int
		var err error
		for n < len(buf) && err == nil {
			var m int
			m, err = g.Read(buf[n:min(n+7, len(buf))])
			if err != nil && !errors.Is(err, io.EOF) && m > 0 {
				t.Errorf("size %d: Read returned %d bytes with %v", tc.size, m, err)
			}
			n += m
		}
		if err == nil {
			_, err = g.Read(buf[:1])
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("size %d: err = %v, want %v", tc.size, err, tc.wantErr)
		}
		if tc.wantErr == nil && n != tc.size {
			t.Errorf("size %d: read %d bytes", tc.size, n)
		}
	}
}
