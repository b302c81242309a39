package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// dirStore keeps each object in a file: key "a/b" is the file <directory>/<prefix>/a/b.
type dirStore struct {
	root string // the directory plus the prefix
}

func newDir(dir, prefix string) (*dirStore, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("backup directory %q: must be an absolute path", dir)
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup directory %s does not exist: is its volume mounted?", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("backup directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("backup directory %s is not a directory", dir)
	}
	return &dirStore{root: filepath.Join(filepath.Clean(dir), filepath.FromSlash(prefix))}, nil
}

func (d *dirStore) String() string { return d.root }

// path is the file that holds key; key must have passed checkKey.
func (d *dirStore) path(key string) string {
	return filepath.Join(d.root, filepath.FromSlash(key))
}

// Put writes r to a temporary file next to the object's file, fsyncs it and renames it into
// place, then fsyncs the directory: a crash leaves either the old object or the new one
// under the key, and at worst a stray temporary file, which List ignores.
func (d *dirStore) Put(ctx context.Context, key string, r io.Reader) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("put %s: %w", d.root, err)
	}
	dst := d.path(key)
	src := &sourceReader{ctx: ctx, r: r}
	err := d.put(dst, src)
	if src.err != nil {
		return readError(d.root, key, src.err)
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", dst, err)
	}
	return nil
}

func (d *dirStore) put(dst string, src io.Reader) error {
	dir := filepath.Dir(dst)
	var tmp *os.File
	// A concurrent Delete may remove the directory, empty, between creating it and
	// creating the temporary file in it: then create it again.
	for attempt := 0; ; attempt++ {
		if err := d.mkdirs(dir); err != nil {
			return err
		}
		var err error
		tmp, err = os.CreateTemp(dir, tempMarker+filepath.Base(dst)+"-")
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 2 {
			return err
		}
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, src); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	committed = true
	return syncDir(dir)
}

// mkdirs creates dir and its missing parents up to the store's root and beyond, fsyncing
// the parent of each directory it creates so that the new entries survive a crash.
func (d *dirStore) mkdirs(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is a file, so it cannot hold objects", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := d.mkdirs(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // created concurrently
		}
		return err
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		// EINVAL: the filesystem cannot sync directories; there is nothing more to do.
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

func (d *dirStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get %s: %w", d.root, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := d.path(key)
	f, err := os.Open(p)
	if err != nil {
		return nil, d.fileError("get", p, err)
	}
	fi, err := f.Stat()
	if err == nil && fi.IsDir() {
		err = fs.ErrNotExist
	}
	if err != nil {
		_ = f.Close()
		return nil, d.fileError("get", p, err)
	}
	return f, nil
}

func (d *dirStore) Stat(ctx context.Context, key string) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, fmt.Errorf("stat %s: %w", d.root, err)
	}
	if err := ctx.Err(); err != nil {
		return Object{}, err
	}
	p := d.path(key)
	fi, err := os.Stat(p)
	if err == nil && fi.IsDir() {
		err = fs.ErrNotExist
	}
	if err != nil {
		return Object{}, d.fileError("stat", p, err)
	}
	return Object{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// fileError reports a missing file (or one of its parents being a file) as ErrNotFound.
func (d *dirStore) fileError(op, path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%s %s: %w", op, path, ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}

func (d *dirStore) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := checkListPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list %s: %w", d.root, err)
	}
	// Walk only the deepest directory that every matching key is in.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = d.path(prefix[:i])
	}
	var objects []Object
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == start && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				return fs.SkipAll // nothing stored there yet
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), tempMarker) {
			return nil
		}
		if e.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) || !e.Type().IsRegular() {
			return nil
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		objects = append(objects, Object{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.root, err)
	}
	sort.Slice(objects, func(i, j int) bool { return objects[i].Key < objects[j].Key })
	return objects, nil
}

// Delete removes the objects' files, then the directories that this leaves empty, up to
// the store's root.
func (d *dirStore) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := checkKey(key); err != nil {
			return fmt.Errorf("delete %s: %w", d.root, err)
		}
	}
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := d.path(key)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || (err == nil && fi.IsDir()) {
			continue
		}
		if err == nil {
			err = os.Remove(p)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete %s: %w", p, err)
		}
		for dir := filepath.Dir(p); dir != d.root && strings.HasPrefix(dir, d.root); dir = filepath.Dir(dir) {
			if os.Remove(dir) != nil {
				break // not empty (or gone)
			}
		}
	}
	return nil
}
