// Package carry copies an old PostgreSQL major's programs into a directory from which
// they run in a container of a newer major's image.
//
// An in-place major upgrade runs pg_upgrade, which needs the old and the new major's
// programs side by side in one container. The pod's image is the new major's; an init
// container running the old major's image copies its programs there first (`agent carry
// DIR`, into an emptyDir mounted at the same path in both containers).
//
// The two images may be built on different releases of their distribution (PostgreSQL 15
// on Debian bookworm, 17 on trixie): the old programs cannot rely on the new image's
// libraries, nor on its dynamic loader. So the old image's own loader and every library
// the programs and modules need, glibc included, are carried along, and each program is
// replaced by a script that starts it with that loader and only those libraries. The
// layout under DIR is the image's (DIR/usr/lib/postgresql/<major>/bin, .../lib,
// DIR/usr/share/postgresql/<major>): PostgreSQL finds its share and lib directories
// relative to its program's path, through the same relative layout.
package carry

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// Carried describes a complete carry: DIR/carried.json, written last.
type Carried struct {
	// Major is the carried major version ("15").
	Major string `json:"major"`
	// Version is what the carried postgres --version printed.
	Version string `json:"version"`
	// BinDir is the carried programs' directory, where pg_upgrade's --old-bindir points.
	BinDir string `json:"binDir"`
}

// Manifest is the file, in the carry's directory, whose presence means the carry is complete.
const Manifest = "carried.json"

// Load reads what Carry carried into dir. The error wraps os.ErrNotExist when nothing
// was carried there, or the carry did not finish.
func Load(dir string) (Carried, error) {
	var c Carried
	b, err := os.ReadFile(filepath.Join(dir, Manifest))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("reading %s: %w", filepath.Join(dir, Manifest), err)
	}
	return c, nil
}

// multiarch is the Debian multiarch triplet of each architecture the agent is built for.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Carry copies the PostgreSQL installation found under root ("/" but in tests) into
// dir, which must be an absolute path that is the same where the programs will run.
// Whatever dir held before is removed first.
func Carry(root, dir string) (Carried, error) {
	triplet, ok := multiarch[runtime.GOARCH]
	if !ok {
		return Carried{}, fmt.Errorf("carrying PostgreSQL is not supported on %s", runtime.GOARCH)
	}
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, "\"$`\\\n") {
		// The wrappers name dir in double quotes.
		return Carried{}, fmt.Errorf("the carry directory %q must be an absolute path without \", $, ` or \\", dir)
	}
	dir = filepath.Clean(dir)
	majors, _ := filepath.Glob(filepath.Join(root, "usr/lib/postgresql/*/bin/postgres"))
	if len(majors) != 1 {
		return Carried{}, fmt.Errorf("want one PostgreSQL installation, found %d: %q", len(majors), majors)
	}
	major := filepath.Base(filepath.Dir(filepath.Dir(majors[0])))
	c := &copier{
		root:   filepath.Clean(root),
		dir:    dir,
		bin:    "/usr/lib/postgresql/" + major + "/bin",
		lib:    "/usr/lib/postgresql/" + major + "/lib",
		share:  "/usr/share/postgresql/" + major,
		search: []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/lib", "/usr/lib"},
		copied: map[string]bool{},
	}
	if err := empty(dir); err != nil {
		return Carried{}, err
	}
	if err := c.loader(); err != nil {
		return Carried{}, err
	}
	for _, tree := range []string{c.bin, c.lib, c.share} {
		if err := c.tree(tree); err != nil {
			return Carried{}, fmt.Errorf("copying %s: %w", tree, err)
		}
	}
	if err := c.libraries(); err != nil {
		return Carried{}, err
	}
	binDir := filepath.Join(dir, c.bin)
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").CombinedOutput()
	if err != nil {
		return Carried{}, fmt.Errorf("running the carried postgres --version: %w: %s", err, out)
	}
	carried := Carried{Major: major, Version: strings.TrimSpace(string(out)), BinDir: binDir}
	b, _ := json.Marshal(carried)
	tmp := filepath.Join(dir, Manifest+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return Carried{}, err
	}
	return carried, os.Rename(tmp, filepath.Join(dir, Manifest))
}

// empty empties dir (creating it and its lib/ if needed), the manifest first: a carry
// that stops halfway never looks complete.
func empty(dir string) error {
	if err := os.Remove(filepath.Join(dir, Manifest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(dir, "lib"), 0o755)
}

// A copier carries one installation. Paths named "logical" are absolute paths as seen
// from root (as the old image's loader sees them); host paths are where they are read.
type copier struct {
	root, dir       string
	bin, lib, share string   // the copied trees (logical)
	search          []string // the loader's default directories (logical)
	interp          string   // the loader's file name, in dir/lib
	objects         []object // ELF files whose libraries are still to be carried
	copied          map[string]bool
}

// An object is an ELF file copied, by its logical path (for $ORIGIN).
type object struct {
	path string
	// module is a loadable module of lib: one whose libraries are missing did not
	// load in the old image either, and does not stop the carry.
	module bool
}

// host resolves a logical path under root, following symlinks as if root were "/".
func (c *copier) host(logical string) (string, error) {
	return securejoin.SecureJoin(c.root, logical)
}

// logical is the inverse of host.
func (c *copier) logical(host string) string {
	return "/" + strings.TrimPrefix(strings.TrimPrefix(host, c.root), "/")
}

// loader carries the program interpreter of postgres (glibc's ld.so), which must
// accept --argv0: the programs find their share and lib directories, and each other,
// from argv[0], which must be the wrapper's path.
func (c *copier) loader() error {
	postgres, err := c.host(filepath.Join(c.bin, "postgres"))
	if err != nil {
		return err
	}
	f, err := elf.Open(postgres)
	if err != nil {
		return err
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return fmt.Errorf("%s has no program interpreter", filepath.Join(c.bin, "postgres"))
	}
	c.interp = filepath.Base(interp)
	if err := c.library(c.interp, interp); err != nil {
		return err
	}
	ld := filepath.Join(c.dir, "lib", c.interp)
	help, _ := exec.Command(ld, "--help").Output()
	if !strings.Contains(string(help), "--argv0") {
		return fmt.Errorf("the old image's loader %s does not accept --argv0: carrying PostgreSQL needs glibc 2.33 or later in its image", interp)
	}
	return nil
}

// library copies the library at logical path from (symlinks followed) to dir/lib/name.
func (c *copier) library(name, from string) error {
	src, err := c.host(from)
	if err != nil {
		return err
	}
	c.copied[name] = true
	return copyFile(src, filepath.Join(c.dir, "lib", name))
}

// tree copies the logical directory top to the same place under dir; programs of bin
// are wrapped.
func (c *copier) tree(top string) error {
	src := filepath.Join(c.root, top)
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if top == c.lib && (d.IsDir() && d.Name() == "bitcode" || strings.HasPrefix(d.Name(), "llvmjit")) {
			// JIT compilation (llvmjit.so, llvmjit_types.bc, bitcode/), the only user of
			// libLLVM (over 100 MB), is not needed: without it postgres does not JIT.
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return c.entry(path, filepath.Join(c.dir, top, rel), top == c.bin && filepath.Dir(path) == src)
	})
}

// entry copies path (a host path) to dst; inBin says it is a program of bin.
func (c *copier) entry(path, dst string, inBin bool) error {
	info, err := os.Lstat(path)
	if err != nil {
		return err
	}
	switch {
	case info.IsDir():
		return os.MkdirAll(dst, info.Mode().Perm()|0o700) // writable, to fill it and to carry again
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := c.host(c.logical(path))
		if err != nil {
			return err
		}
		if c.inTrees(c.logical(target)) {
			rel, err := filepath.Rel(filepath.Dir(dst), filepath.Join(c.dir, c.logical(target)))
			if err != nil {
				return err
			}
			return os.Symlink(rel, dst)
		}
		// Outside the copied trees: what it points to, copied.
		if t, err := os.Stat(target); err == nil && t.IsDir() {
			return filepath.WalkDir(target, func(p string, _ fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(target, p)
				return c.entry(p, filepath.Join(dst, rel), false)
			})
		}
		return c.entry(target, dst, inBin)
	case !info.Mode().IsRegular():
		return nil
	}
	f, err := elf.Open(path)
	if err != nil {
		return copyFile(path, dst) // not ELF: scripts, SQL, data
	}
	program := inBin && info.Mode()&0o111 != 0 && slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	f.Close()
	c.objects = append(c.objects, object{path: c.logical(path), module: !inBin})
	if !program {
		return copyFile(path, dst)
	}
	prog := filepath.Join(filepath.Dir(dst), ".real", filepath.Base(dst))
	if err := os.MkdirAll(filepath.Dir(prog), 0o755); err != nil {
		return err
	}
	if err := copyFile(path, prog); err != nil {
		return err
	}
	top := strings.Repeat("/..", strings.Count(strings.Trim(c.bin, "/"), "/")+1)
	if err := os.WriteFile(dst, []byte(wrapper(top, c.interp, filepath.Base(prog))), 0o755); err != nil {
		return err
	}
	return os.Chmod(dst, 0o755) // whatever the umask
}

// wrapper is the script that starts the carried program name (in .real beside the
// script) with the carried loader and libraries, as if it were the script itself
// (argv[0]). It finds them from its own path, up (e.g. "/../../../../..") from its
// directory to the carried tree's top: the tree works wherever it is moved.
func wrapper(up, interp, name string) string {
	return fmt.Sprintf(`#!/bin/sh
bin=${0%%/*}
exec "$bin%[1]s/lib/%[2]s" --library-path "$bin%[1]s/lib" --argv0 "$0" "$bin/.real/%[3]s" "$@"
`, up, interp, name)
}

// inTrees says whether the logical path is in one of the copied trees.
func (c *copier) inTrees(logical string) bool {
	for _, t := range []string{c.bin, c.lib, c.share} {
		if logical == t || strings.HasPrefix(logical, t+"/") {
			return true
		}
	}
	return false
}

// libraries carries the closure of the libraries the copied ELF files need, found as
// the old image's loader finds them: DT_RPATH (without DT_RUNPATH), DT_RUNPATH, then
// the default directories.
func (c *copier) libraries() error {
	for len(c.objects) > 0 {
		o := c.objects[0]
		c.objects = c.objects[1:]
		src, err := c.host(o.path)
		if err != nil {
			return err
		}
		f, err := elf.Open(src)
		if err != nil {
			return fmt.Errorf("reading %s: %w", o.path, err)
		}
		needed, err := f.ImportedLibraries()
		paths, _ := f.DynString(elf.DT_RUNPATH)
		if len(paths) == 0 {
			paths, _ = f.DynString(elf.DT_RPATH)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("reading %s: %w", o.path, err)
		}
		var dirs []string
		for _, p := range paths {
			for _, d := range filepath.SplitList(p) {
				d = strings.NewReplacer("${ORIGIN}", filepath.Dir(o.path), "$ORIGIN", filepath.Dir(o.path)).Replace(d)
				dirs = append(dirs, d)
			}
		}
		dirs = append(dirs, c.search...)
		for _, name := range needed {
			if c.copied[filepath.Base(name)] {
				continue
			}
			found := c.find(name, dirs, f.Machine)
			if found == "" {
				if o.module {
					continue
				}
				return fmt.Errorf("%s needs %s, found in none of %q", o.path, name, dirs)
			}
			if err := c.library(filepath.Base(name), found); err != nil {
				return err
			}
			c.objects = append(c.objects, object{path: found, module: o.module})
		}
	}
	return nil
}

// find returns the logical path of the library name for machine in dirs, or "".
func (c *copier) find(name string, dirs []string, machine elf.Machine) string {
	if strings.Contains(name, "/") {
		dirs = []string{""}
	}
	for _, d := range dirs {
		p := filepath.Join("/", d, name)
		h, err := c.host(p)
		if err != nil {
			continue
		}
		f, err := elf.Open(h)
		if err != nil {
			continue
		}
		f.Close()
		if f.Machine == machine { // the loader skips other architectures' libraries
			return p
		}
	}
	return ""
}

// copyFile copies src (symlinks followed) to dst, with src's permissions.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, info.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Chmod(info.Mode().Perm()) // whatever the umask
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
