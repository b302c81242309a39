package main

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// owner is a numeric user and group; set is false where the file system's own owner is
// kept.
type owner struct {
	set      bool
	uid, gid int
}

func parseOwner(s string) (owner, error) {
	u, g, hasGroup := strings.Cut(s, ":")
	var o owner
	if _, err := fmt.Sscanf(u, "%d", &o.uid); err != nil || fmt.Sprint(o.uid) != u || o.uid < 0 {
		return o, fmt.Errorf("owner %q: want numeric UID[:GID]", s)
	}
	o.gid = o.uid
	if hasGroup {
		if _, err := fmt.Sscanf(g, "%d", &o.gid); err != nil || fmt.Sprint(o.gid) != g || o.gid < 0 {
			return o, fmt.Errorf("owner %q: want numeric UID[:GID]", s)
		}
	}
	o.set = true
	return o, nil
}

// entry is one file system object of a layer.
type entry struct {
	name string // in the image: clean, relative, never "" or "."
	src  string // the host file; "" for a directory the layer makes up
	info fs.FileInfo
	own  owner        // when set, replaces the host file's owner
	mode *fs.FileMode // when set, replaces the permission bits
}

// layer is a file system layer assembled from host directories and files, as a
// root file system directory or Dockerfile COPY lines describe it.
type layer struct {
	entries map[string]*entry
	// ignore, when set, says whether a host path is left out (.dockerignore).
	ignore func(hostPath string) bool
}

func newLayer() *layer { return &layer{entries: map[string]*entry{}} }

// imagePath cleans an absolute or relative path in the image to the layer's form.
func imagePath(p string) string {
	return strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(p)), "/")
}

// addDir adds everything under the host directory src at dst (not src itself). Owners
// are the host files' unless own is set.
func (l *layer) addDir(src, dst string, own owner, mode *fs.FileMode) error {
	dst = imagePath(dst)
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if l.ignore != nil && p != src && l.ignore(p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil // dst itself is the caller's: a COPY keeps an existing directory
		}
		name := imagePath(path.Join(dst, filepath.ToSlash(rel)))
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			return nil // a tar cannot hold a socket; nothing in an image needs one
		}
		l.entries[name] = &entry{name: name, src: p, info: info, own: own, mode: mode}
		return nil
	})
}

// addFile adds the host file (or symbolic link, not followed) src as dst.
func (l *layer) addFile(src, dst string, own owner, mode *fs.FileMode) error {
	info, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if info.IsDir() {
		return fmt.Errorf("%s is a directory", src)
	}
	name := imagePath(dst)
	if name == "" {
		return fmt.Errorf("cannot copy the file %s over the root directory", src)
	}
	l.entries[name] = &entry{name: name, src: src, info: info, own: own, mode: mode}
	return nil
}

// mkdir adds a directory the layer makes up (root-owned, 0755) where none is yet.
func (l *layer) mkdir(name string) {
	name = imagePath(name)
	if name == "" || l.entries[name] != nil {
		return
	}
	l.entries[name] = &entry{name: name, info: syntheticDir(path.Base(name))}
}

// chown sets the owner of name and everything under it.
func (l *layer) chown(name string, own owner) bool {
	name = imagePath(name)
	found := false
	for n, e := range l.entries {
		if name == "" || n == name || strings.HasPrefix(n, name+"/") {
			e.own = own
			found = true
		}
	}
	return found
}

// sorted completes the tree (every entry's parent directories) and returns the entries
// in path order, parents first.
func (l *layer) sorted() []*entry {
	for n := range l.entries {
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			l.mkdir(d)
		}
	}
	out := make([]*entry, 0, len(l.entries))
	for _, e := range l.entries {
		out = append(out, e)
	}
	// Component-wise order, so that "a/b" comes right after "a", before "a-b".
	sort.Slice(out, func(i, j int) bool {
		return strings.ReplaceAll(out[i].name, "/", "\x00") < strings.ReplaceAll(out[j].name, "/", "\x00")
	})
	return out
}

type syntheticDir string

func (d syntheticDir) Name() string       { return string(d) }
func (d syntheticDir) Size() int64        { return 0 }
func (d syntheticDir) Mode() fs.FileMode  { return fs.ModeDir | 0o755 }
func (d syntheticDir) ModTime() time.Time { return time.Unix(0, 0) }
func (d syntheticDir) IsDir() bool        { return true }
func (d syntheticDir) Sys() any           { return nil }

// writeFile writes the layer as a gzip-compressed tar to a new temporary file in dir (the
// system's when dir is ""), compressed once here so that go-containerregistry only reads
// it. It returns the file's name, also with an error when the file was created.
func (l *layer) writeFile(dir string, epoch *time.Time) (string, error) {
	f, err := os.CreateTemp(dir, ".mkimage-layer-*.tar.gz")
	if err != nil {
		return "", err
	}
	buf := bufio.NewWriterSize(f, 1<<20)
	gz, err := gzip.NewWriterLevel(buf, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return f.Name(), err
	}
	err = l.write(gz, epoch)
	if err == nil {
		err = gz.Close()
	}
	if err == nil {
		err = buf.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

// write writes the layer as an uncompressed tar. With epoch set, every entry's
// modification time is epoch; otherwise the files' own, in whole seconds.
func (l *layer) write(w io.Writer, epoch *time.Time) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	for _, e := range l.sorted() {
		hdr, err := l.header(e, epoch)
		if err != nil {
			return err
		}
		if st, ok := e.info.Sys().(*syscall.Stat_t); ok && e.info.Mode().IsRegular() && st.Nlink > 1 {
			id := inode{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev is a uint32 on some Linux platforms
			if first, ok := links[id]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[id] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFileInto(tw, e.src, hdr.Size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func (l *layer) header(e *entry, epoch *time.Time) (*tar.Header, error) {
	var link string
	if e.info.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(e.src); err != nil {
			return nil, err
		}
	}
	hdr, err := tar.FileInfoHeader(e.info, link)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.src, err)
	}
	hdr.Name = e.name
	if e.info.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Uid, hdr.Gid = 0, 0
	if st, ok := e.info.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	if e.own.set {
		hdr.Uid, hdr.Gid = e.own.uid, e.own.gid
	}
	if e.mode != nil {
		hdr.Mode = hdr.Mode&^0o7777 | int64(e.mode.Perm())
	}
	hdr.ModTime = e.info.ModTime().Truncate(time.Second)
	if epoch != nil {
		hdr.ModTime = *epoch
	}
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatUnknown
	if e.src != "" && e.info.Mode()&fs.ModeSymlink == 0 {
		// File capabilities (ping and the like) are the one extended attribute an image
		// needs to keep.
		buf := make([]byte, 256)
		if n, err := unix.Lgetxattr(e.src, "security.capability", buf); err == nil && n > 0 {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": string(buf[:n])}
		}
	}
	return hdr, nil
}

func copyFileInto(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	if n != size {
		return fmt.Errorf("%s changed size while being read", src)
	}
	return nil
}

// checkTar refuses a -rootfs file that is not a tar (plain or gzip) with at least one
// entry, rather than packing as a layer what nothing can unpack.
func checkTar(src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		defer gz.Close()
		r = gz
	}
	if _, err := tar.NewReader(r).Next(); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s is an empty tar file", src)
		}
		return fmt.Errorf("%s is not a tar file: %w", src, err)
	}
	return nil
}
