// Package store keeps the agent's base backups and archived WAL in an object store: an
// S3-compatible bucket or a directory (for example a PersistentVolumeClaim's mount).
//
// Keys are slash-separated paths relative to the store's root (its bucket or directory plus
// its Config.Prefix), such as "wal/000000010000000000000001". Both kinds of store accept the
// same keys, so a store can be swapped for the other without renaming anything.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Object is one stored object; Key is relative to the store's root.
type Object struct {
	Key      string
	Size     int64
	Modified time.Time
}

// ErrNotFound is wrapped by the errors of Get and Stat for a key that holds no object.
var ErrNotFound = errors.New("not found")

// Store keeps objects under keys. Its methods are safe for concurrent use.
type Store interface {
	// Put stores the whole of r under key, replacing any object there. It streams: the
	// length need not be known, and memory stays bounded. It is atomic: a reader sees the
	// previous object or the complete new one, never a partial one, and a Put that fails
	// (because r failed, the store failed or ctx ended) leaves no new object behind.
	Put(ctx context.Context, key string, r io.Reader) error
	// Get opens the object under key. The caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes the object under key.
	Stat(ctx context.Context, key string) (Object, error)
	// List returns every object whose key starts with prefix (a plain string prefix, not
	// only whole path segments), at any depth, sorted by key.
	List(ctx context.Context, prefix string) ([]Object, error)
	// Delete removes the objects under keys. Keys that hold no object are not an error.
	Delete(ctx context.Context, keys ...string) error
	// String says where the store is, for people: s3://bucket/prefix or a directory. It
	// never contains a credential.
	String() string
}

// Config chooses and configures a store.
type Config struct {
	// Exactly one of S3 or Directory.
	S3 *S3Config
	// Directory is a directory to keep the objects in (e.g. on a PersistentVolumeClaim
	// mount). It must exist.
	Directory string
	// Prefix is a key prefix inside the store, e.g. "path/clustername"; it may be empty.
	// Stores with different prefixes in one bucket or directory do not see each other's
	// objects.
	Prefix string
}

// S3Config locates an S3-compatible bucket.
type S3Config struct {
	// Endpoint is http://host:port or https://host:port, without a path.
	Endpoint string
	Bucket   string
	// Region is the bucket's region; empty means "us-east-1".
	Region                       string
	AccessKeyID, SecretAccessKey string
	// InsecureSkipVerify turns off the verification of the endpoint's TLS certificate.
	InsecureSkipVerify bool
	// CAFile is a PEM bundle of certificate authorities to trust in addition to the
	// system's roots.
	CAFile string
}

// New returns the store cfg describes. It checks the configuration but does not contact the
// store: the first operation does.
func New(cfg Config) (Store, error) {
	prefix, err := cleanPrefix(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.S3 != nil && cfg.Directory != "":
		return nil, errors.New("backup store: configure either an S3 bucket or a directory, not both")
	case cfg.S3 != nil:
		return newS3(*cfg.S3, prefix)
	case cfg.Directory != "":
		return newDir(cfg.Directory, prefix)
	default:
		return nil, errors.New("backup store: configure an S3 bucket or a directory")
	}
}

// tempMarker starts the name of the directory store's temporary files. No key may have a
// path segment that starts with it, so a temporary file is never mistaken for an object.
const tempMarker = ".pgpilot-tmp-"

// checkKey refuses keys that both kinds of store cannot hold alike: empty, absolute, with
// empty, "." or ".." segments (which could escape the store's root in a directory), with a
// trailing slash, a NUL byte, or a segment that looks like a temporary file.
func checkKey(key string) error {
	if key == "" {
		return errors.New("invalid key: empty")
	}
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("invalid key %q: keys are relative to the store's root, not absolute", key)
	}
	if strings.HasSuffix(key, "/") {
		return fmt.Errorf("invalid key %q: it ends with a slash", key)
	}
	if strings.ContainsRune(key, 0) {
		return fmt.Errorf("invalid key %q: it contains a NUL byte", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if err := checkSegment(key, seg); err != nil {
			return err
		}
	}
	return nil
}

func checkSegment(key, seg string) error {
	switch {
	case seg == "":
		return fmt.Errorf("invalid key %q: it has an empty path segment", key)
	case seg == "." || seg == "..":
		return fmt.Errorf("invalid key %q: %q path segments are not allowed (keys may not leave the store's root)", key, seg)
	case strings.HasPrefix(seg, tempMarker):
		return fmt.Errorf("invalid key %q: segments starting with %q are reserved for temporary files", key, tempMarker)
	}
	return nil
}

// checkListPrefix refuses List prefixes that no valid key can start with in a way that could
// escape the root. Its last segment may be partial (even empty, after a trailing slash).
func checkListPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if strings.HasPrefix(prefix, "/") {
		return fmt.Errorf("invalid list prefix %q: prefixes are relative to the store's root, not absolute", prefix)
	}
	segs := strings.Split(prefix, "/")
	for _, seg := range segs[:len(segs)-1] {
		if err := checkSegment(prefix, seg); err != nil {
			return fmt.Errorf("invalid list prefix: %w", err)
		}
	}
	return nil
}

// cleanPrefix trims the slashes around a Config.Prefix and checks its segments as a key's.
func cleanPrefix(prefix string) (string, error) {
	p := strings.Trim(prefix, "/")
	if p == "" {
		return "", nil
	}
	if err := checkKey(p); err != nil {
		return "", fmt.Errorf("backup store prefix %q: %w", prefix, err)
	}
	return p, nil
}

// sourceReader remembers the error of the reader a Put consumes, so that Put can tell the
// caller's reader failing from the store failing. It never returns data and an error (other
// than io.EOF) together, but the error on the next Read: minio-go drops an error that comes
// with the data filling its buffer. It stops reading when ctx ends.
type sourceReader struct {
	ctx  context.Context
	r    io.Reader
	err  error // the reader's error, other than io.EOF
	stop error // what every further Read returns
}

func (s *sourceReader) Read(p []byte) (int, error) {
	if s.stop != nil {
		return 0, s.stop
	}
	if err := s.ctx.Err(); err != nil {
		s.stop = err
		return 0, err
	}
	n, err := s.r.Read(p)
	if err != nil {
		s.stop = err
		if err != io.EOF {
			s.err = err
		}
		if n > 0 {
			return n, nil
		}
	}
	return n, err
}

// readError wraps err, from Put's reader, for Put's caller.
func readError(where, key string, err error) error {
	return fmt.Errorf("put %s: reading the data for %s: %w", where, key, err)
}
