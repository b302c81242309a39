// Command mkimage builds a container image without a daemon and writes it as an image
// tarball that `ctr images import`, `docker load` and `podman load` read (-o), or pushes
// it to a registry (-push), or both. The image format, the tarball and the push are
// go-containerregistry's; what the layers and the configuration hold is mkimage's.
//
// The image starts from -base (an image tarball) or from nothing. Each -rootfs (a
// directory, or a tar or tar.gz file) is one layer, in order; with
// -dockerfile, the Dockerfile's last stage (FROM scratch; COPY, ENV, LABEL, USER,
// WORKDIR, ENTRYPOINT, CMD, EXPOSE, STOPSIGNAL, ARG) is one more layer and the image's
// settings, and its COPY --from sources are host directories given with -from. The
// settings flags then add to or replace what the Dockerfile says.
//
// In -o and -ref, {id} stands for the first 12 hex digits of the image ID (the config
// digest), so that a content-addressed file name and tag come out of one run. mkimage
// prints the image ID.
//
//	mkimage -rootfs ./rootfs -entrypoint '["/hello"]' -user 65532:65532 \
//	    -ref example:dev -o example.tar
//	mkimage -rootfs ./rootfs -ref 10.77.0.1:5000/example:dev -push
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

type options struct {
	out, platform                  string
	push                           bool
	refs, rootfs, owners, from     listFlag
	buildArgs                      listFlag
	dockerfile, contextDir, base   string
	defaultOwner                   string
	entrypoint, cmd                string
	user, workdir, stopSignal      string
	env, labels, expose            listFlag
	epoch                          string
	entrypointSet, cmdSet, userSet bool
}

func run(args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.StringVar(&o.out, "o", "", "The image tarball to write (docker save's format); {id} is replaced.")
	fs.Var(&o.refs, "ref", "An image reference name[:tag] to record, repeatable (required); {id} is replaced.")
	fs.BoolVar(&o.push, "push", false, "Push the image to the registry of every -ref (HTTPS; plain HTTP for local and private addresses without it).")
	fs.StringVar(&o.platform, "platform", "linux/"+runtime.GOARCH, "The platform of the image's files: os/arch[/variant].")
	fs.StringVar(&o.base, "base", "", "An image tarball (docker save's format) the image starts from: its layers first, its settings the defaults.")
	fs.Var(&o.rootfs, "rootfs", "A root file system directory, or a tar or tar.gz file, as a layer; repeatable, in order.")
	fs.StringVar(&o.defaultOwner, "chown", "", "UID:GID owning every file of the -rootfs directories (default: the files' own).")
	fs.Var(&o.owners, "owner", "PATH=UID:GID: the owner of PATH and everything under it in the -rootfs directories; repeatable.")
	fs.StringVar(&o.dockerfile, "dockerfile", "", "A Dockerfile whose last stage, FROM scratch, adds a layer and the settings.")
	fs.StringVar(&o.contextDir, "context", ".", "The -dockerfile's build context.")
	fs.Var(&o.from, "from", "STAGE:/PATH=DIR: DIR is what COPY --from=STAGE /PATH copies; repeatable.")
	fs.Var(&o.buildArgs, "build-arg", "NAME=value for the -dockerfile's ARG NAME; repeatable.")
	fs.StringVar(&o.entrypoint, "entrypoint", "", `The entrypoint, a JSON array ('["/bin/app"]'); '[]' clears it.`)
	fs.StringVar(&o.cmd, "cmd", "", `The command (arguments of the entrypoint), a JSON array; '[]' clears it.`)
	fs.StringVar(&o.user, "user", "", "The user (and group) the container runs as, e.g. 65532:65532.")
	fs.StringVar(&o.workdir, "workdir", "", "The working directory.")
	fs.StringVar(&o.stopSignal, "stop-signal", "", "The signal that stops the container, e.g. SIGINT.")
	fs.Var(&o.env, "env", "NAME=value in the environment; repeatable, replaces an earlier NAME.")
	fs.Var(&o.labels, "label", "NAME=value label; repeatable.")
	fs.Var(&o.expose, "expose", "A port the container listens on (5432 or 5432/tcp); repeatable.")
	fs.StringVar(&o.epoch, "epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time given to every file and to the image's creation, for a reproducible image (default: $SOURCE_DATE_EPOCH; unset: the files' own times and now).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "entrypoint":
			o.entrypointSet = true
		case "cmd":
			o.cmdSet = true
		case "user":
			o.userSet = true
		}
	})
	id, err := build(o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, id)
	return nil
}

func build(o options) (string, error) {
	if (o.out == "" && !o.push) || len(o.refs) == 0 {
		return "", errors.New("-o or -push, and at least one -ref, are required")
	}
	if len(o.rootfs) == 0 && o.dockerfile == "" {
		return "", errors.New("give at least one -rootfs or a -dockerfile")
	}
	if o.base != "" && o.dockerfile != "" {
		return "", errors.New("-base and -dockerfile: the Dockerfile's last stage is FROM scratch")
	}
	base := empty.Image
	if o.base != "" {
		var err error
		if base, err = tarball.ImageFromPath(o.base, nil); err != nil {
			return "", fmt.Errorf("-base: %w", err)
		}
	}
	plat, err := parsePlatform(o.platform)
	if err != nil {
		return "", err
	}
	var epoch *time.Time
	created := time.Now().UTC().Truncate(time.Second)
	if o.epoch != "" {
		sec, err := strconv.ParseInt(o.epoch, 10, 64)
		if err != nil {
			return "", fmt.Errorf("-epoch %q: want seconds since 1970", o.epoch)
		}
		t := time.Unix(sec, 0).UTC()
		epoch, created = &t, t
	}
	var defaultOwner owner
	if o.defaultOwner != "" {
		if defaultOwner, err = parseOwner(o.defaultOwner); err != nil {
			return "", err
		}
	}
	type ownerOverride struct {
		path string
		own  owner
	}
	var overrides []ownerOverride
	for _, s := range o.owners {
		p, ownStr, ok := strings.Cut(s, "=")
		if !ok {
			return "", fmt.Errorf("-owner %q: want PATH=UID:GID", s)
		}
		own, err := parseOwner(ownStr)
		if err != nil {
			return "", err
		}
		overrides = append(overrides, ownerOverride{p, own})
	}
	// Check the settings and every reference before the slow part.
	if err := o.applySettings(&v1.Config{}); err != nil {
		return "", err
	}
	for _, r := range o.refs {
		if _, err := parseRef(strings.ReplaceAll(r, "{id}", "000000000000")); err != nil {
			return "", err
		}
	}

	// The layers are written to temporary files, in the output's directory when there is
	// one (the same file system as the tarball), and removed at the end.
	tmpDir := ""
	if o.out != "" {
		tmpDir = filepath.Dir(strings.ReplaceAll(o.out, "{id}", "x"))
		if err := os.MkdirAll(tmpDir, 0o755); err != nil {
			return "", err
		}
	}
	var layers []v1.Layer
	var tmpFiles []string
	defer func() {
		for _, f := range tmpFiles {
			os.Remove(f)
		}
	}()
	var hist []v1.History
	stamp := v1.Time{Time: created}
	addLayer := func(l *layer, createdBy string) error {
		file, err := l.writeFile(tmpDir, epoch)
		if file != "" {
			tmpFiles = append(tmpFiles, file)
		}
		if err != nil {
			return err
		}
		tl, err := tarball.LayerFromFile(file)
		if err != nil {
			return err
		}
		layers = append(layers, tl)
		hist = append(hist, v1.History{Created: stamp, CreatedBy: createdBy})
		return nil
	}
	for _, src := range o.rootfs {
		info, err := os.Stat(src)
		if err != nil {
			return "", err
		}
		if !info.IsDir() {
			if err := checkTar(src); err != nil {
				return "", err
			}
			tl, err := tarball.LayerFromFile(src)
			if err != nil {
				return "", err
			}
			layers = append(layers, tl)
			hist = append(hist, v1.History{Created: stamp, CreatedBy: "mkimage -rootfs " + filepath.Base(src)})
			continue
		}
		l := newLayer()
		if err := l.addDir(src, "/", defaultOwner, nil); err != nil {
			return "", err
		}
		for _, ov := range overrides {
			if !l.chown(ov.path, ov.own) {
				return "", fmt.Errorf("-owner %s: no such path in %s", ov.path, src)
			}
		}
		if err := addLayer(l, "mkimage -rootfs "+filepath.Base(src)); err != nil {
			return "", err
		}
	}

	cfg := v1.ConfigFile{Created: stamp, Architecture: plat.Architecture, OS: plat.OS, Variant: plat.Variant}
	if o.base != "" {
		bc, err := base.ConfigFile()
		if err != nil {
			return "", fmt.Errorf("-base: %w", err)
		}
		cfg.Config = *bc.Config.DeepCopy()
	}
	if o.dockerfile != "" {
		db := &dockerBuild{contextDir: o.contextDir, from: map[string]string{}, buildArgs: map[string]string{}}
		for _, s := range o.from {
			k, dir, ok := strings.Cut(s, "=")
			stage, p, ok2 := strings.Cut(k, ":")
			if !ok || !ok2 || stage == "" {
				return "", fmt.Errorf("-from %q: want STAGE:/PATH=DIR", s)
			}
			db.from[stage+":"+filepath.ToSlash(filepath.Clean("/"+p))] = dir
		}
		for _, s := range o.buildArgs {
			k, v, ok := strings.Cut(s, "=")
			if !ok {
				return "", fmt.Errorf("-build-arg %q: want NAME=value", s)
			}
			db.buildArgs[k] = v
		}
		l := newLayer()
		if err := db.scratchStage(o.dockerfile, l, &cfg.Config, plat); err != nil {
			return "", err
		}
		if err := addLayer(l, "mkimage -dockerfile "+filepath.Base(o.dockerfile)); err != nil {
			return "", err
		}
	}
	if err := o.applySettings(&cfg.Config); err != nil {
		return "", err
	}

	img, err := assemble(base, layers, hist, cfg)
	if err != nil {
		return "", err
	}
	id, err := img.ConfigName()
	if err != nil {
		return "", err
	}
	short := id.Hex[:12]
	var refs []name.Tag
	for _, r := range o.refs {
		t, err := parseRef(strings.ReplaceAll(r, "{id}", short))
		if err != nil {
			return "", err
		}
		refs = append(refs, t)
	}
	if o.out != "" {
		if err := writeTarball(strings.ReplaceAll(o.out, "{id}", short), img, refs); err != nil {
			return "", err
		}
	}
	if o.push {
		if err := push(img, refs); err != nil {
			return "", err
		}
	}
	return id.String(), nil
}

func (o options) applySettings(cfg *v1.Config) error {
	if o.entrypointSet {
		if err := json.Unmarshal([]byte(o.entrypoint), &cfg.Entrypoint); err != nil {
			return fmt.Errorf("-entrypoint %q: want a JSON array of strings: %w", o.entrypoint, err)
		}
	}
	if o.cmdSet {
		if err := json.Unmarshal([]byte(o.cmd), &cfg.Cmd); err != nil {
			return fmt.Errorf("-cmd %q: want a JSON array of strings: %w", o.cmd, err)
		}
	}
	if o.userSet {
		cfg.User = o.user
	}
	if o.workdir != "" {
		if !strings.HasPrefix(o.workdir, "/") {
			return fmt.Errorf("-workdir %q: want an absolute path", o.workdir)
		}
		cfg.WorkingDir = o.workdir
	}
	if o.stopSignal != "" {
		cfg.StopSignal = o.stopSignal
	}
	for _, kv := range o.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("-env %q: want NAME=value", kv)
		}
		cfg.Env = setEnv(cfg.Env, k, v)
	}
	for _, kv := range o.labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want NAME=value", kv)
		}
		if cfg.Labels == nil {
			cfg.Labels = map[string]string{}
		}
		cfg.Labels[k] = v
	}
	for _, p := range o.expose {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		if cfg.ExposedPorts == nil {
			cfg.ExposedPorts = map[string]struct{}{}
		}
		cfg.ExposedPorts[p] = struct{}{}
	}
	return nil
}

func parsePlatform(s string) (v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return v1.Platform{}, fmt.Errorf("-platform %q: want os/arch[/variant]", s)
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}
