// Command imgpack writes a one-layer container image tarball (the docker-archive format
// that `ctr images import` reads) from local files, so the local cluster can run images
// without a registry.
//
//	imgpack -o pause.tar -tag pgpilot.local/pause:3.10 -entrypoint /pause -user 65535:65535 /pause=bin/pause
//
// Each argument adds one path to the image's root filesystem:
//
//	/dst=SRC      a copy of the file SRC, or of the directory tree SRC (owners kept)
//	/dst->TARGET  a symbolic link
//	/dst/         an empty directory (mode 0755; /tmp/ gets 1777)
package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one path of the image's filesystem.
type entry struct {
	src    string // file to copy, for a regular file; "" otherwise
	header tar.Header
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	out := flag.String("o", "", "Image tarball to write.")
	tag := flag.String("tag", "", "Image name and tag, e.g. pgpilot.local/pause:3.10.")
	entrypoint := flag.String("entrypoint", "", `Entrypoint: one path, or a JSON array such as ["/bin/sh","-c"].`)
	cmd := flag.String("cmd", "", "Cmd: one word, or a JSON array.")
	workdir := flag.String("workdir", "", "Working directory.")
	user := flag.String("user", "", "User, e.g. 65535:65535.")
	var env stringList
	flag.Var(&env, "env", "KEY=VALUE environment variable (repeatable); PATH defaults to the usual one.")
	flag.Parse()
	if *out == "" || *tag == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: imgpack -o OUT.tar -tag NAME:TAG [options] /dst=SRC | /dst->TARGET | /dst/ ...")
		os.Exit(2)
	}
	if err := run(*out, *tag, *entrypoint, *cmd, *workdir, *user, env, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "imgpack:", err)
		os.Exit(1)
	}
}

func run(out, tag, entrypoint, cmd, workdir, user string, env, args []string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	entries := map[string]entry{}
	for _, arg := range args {
		if err := add(entries, arg); err != nil {
			return fmt.Errorf("%s: %w", arg, err)
		}
	}
	layerFile, err := os.CreateTemp(filepath.Dir(out), ".layer-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(layerFile.Name())
	if err := writeLayer(layerFile, entries); err != nil {
		layerFile.Close()
		return err
	}
	if err := layerFile.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromFile(layerFile.Name())
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config = v1.Config{WorkingDir: workdir, User: user, Env: withDefaultPath(env)}
	if cfg.Config.Entrypoint, err = words(entrypoint); err != nil {
		return err
	}
	if cfg.Config.Cmd, err = words(cmd); err != nil {
		return err
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	// Written next to the target and renamed, so a reader never sees half a tarball.
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}

// add records one command-line argument's paths, and their parent directories.
func add(entries map[string]entry, arg string) error {
	switch {
	case strings.Contains(arg, "->"):
		dst, target, _ := strings.Cut(arg, "->")
		addParents(entries, dst)
		entries[clean(dst)] = entry{header: tar.Header{Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
		return nil
	case strings.Contains(arg, "="):
		dst, src, _ := strings.Cut(arg, "=")
		return addTree(entries, clean(dst), src)
	case strings.HasSuffix(arg, "/"):
		addParents(entries, arg)
		mode := int64(0o755)
		if clean(arg) == "tmp" {
			mode = 0o1777
		}
		entries[clean(arg)] = entry{header: tar.Header{Typeflag: tar.TypeDir, Mode: mode}}
		return nil
	}
	return errors.New("want /dst=SRC, /dst->TARGET or /dst/")
}

// addTree copies SRC: a single file as root-owned, a directory tree with its owners, modes,
// links and device nodes (a debootstrap root filesystem needs them).
func addTree(entries map[string]entry, dst, src string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	addParents(entries, dst)
	if !fi.IsDir() {
		entries[dst] = entry{src: src, header: tar.Header{Typeflag: tar.TypeReg, Mode: int64(fi.Mode().Perm()), Size: fi.Size()}}
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := clean(path.Join(dst, filepath.ToSlash(rel)))
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			return nil // sockets cannot be archived and are never needed in an image
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		e := entry{header: *h}
		if h.Typeflag == tar.TypeReg {
			e.src = p
		}
		if target != "" {
			entries[target] = e
		}
		return nil
	})
}

func addParents(entries map[string]entry, dst string) {
	for dir := path.Dir(clean(dst)); dir != "." && dir != ""; dir = path.Dir(dir) {
		if _, ok := entries[dir]; !ok {
			entries[dir] = entry{header: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}}
		}
	}
}

// clean turns "/usr/bin/" into "usr/bin", the form tar entries take.
func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// writeLayer writes the entries sorted by path, so parents come first and the layer's
// digest depends only on its content.
func writeLayer(w io.Writer, entries map[string]entry) error {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := entries[n]
		h := e.header
		h.Name = n
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.ModTime = time.Unix(0, 0)
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		h.Uname, h.Gname = "", ""
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if e.src != "" {
			if err := copyFile(tw, e.src, h.Size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, src string, size int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(w, f, size)
	return err
}

// words reads "" as none, a JSON array as itself, anything else as one word.
func words(s string) ([]string, error) {
	switch {
	case s == "":
		return nil, nil
	case strings.HasPrefix(s, "["):
		var w []string
		return w, json.Unmarshal([]byte(s), &w)
	}
	return []string{s}, nil
}

func withDefaultPath(env []string) []string {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return env
		}
	}
	return append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
}
