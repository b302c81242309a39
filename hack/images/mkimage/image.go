package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The image format is go-containerregistry's: it assembles the image from our layers and
// configuration, writes the tarball `docker load` and `ctr images import` read, and
// pushes to a registry. What is ours is what goes into the layers and the configuration
// (the Dockerfile's last stage, the -rootfs directories and the settings flags).

// setEnv sets name=value in env, replacing an earlier value of name.
func setEnv(env []string, name, value string) []string {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			env[i] = name + "=" + value
			return env
		}
	}
	return append(env, name+"="+value)
}

// parseRef parses an image reference name[:tag]; digests are refused, since a reference
// names what mkimage writes.
func parseRef(s string) (name.Tag, error) {
	var t name.Tag
	err := fmt.Errorf("a digest or an empty tag")
	if !strings.Contains(s, "@") && !strings.HasSuffix(s, ":") {
		t, err = name.NewTag(s)
	}

	if err != nil {
		return name.Tag{}, fmt.Errorf("%q is not an image reference name[:tag] (no digests): %w", s, err)
	}
	return t, nil
}

// assemble makes the image: base's layers, then the layers in order, each with its
// history entry, and the configuration.
func assemble(base v1.Image, layers []v1.Layer, hist []v1.History, cfg v1.ConfigFile) (v1.Image, error) {
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, History: hist[i]}
	}
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	appended, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	// Keep what Append recorded (the diff IDs and the history), set the rest.
	cfg.RootFS, cfg.History = appended.RootFS, appended.History
	return mutate.ConfigFile(img, &cfg)
}

// writeTarball writes img under every ref to out, through a temporary file in the same
// directory, so that a reader never sees half of it.
func writeTarball(out string, img v1.Image, refs []name.Tag) (err error) {
	f, err := os.CreateTemp(filepath.Dir(out), ".mkimage-out-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	m := map[name.Reference]v1.Image{}
	for _, r := range refs {
		m[r] = img
	}
	if err = tarball.MultiRefWrite(m, f); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}

// push writes img to the registry of every ref, the ordinary way (a registry's HTTP API;
// HTTPS, or plain HTTP for local and private addresses that do not answer HTTPS, as
// go-containerregistry decides).
func push(img v1.Image, refs []name.Tag) error {
	for _, r := range refs {
		if err := remote.Write(r, img); err != nil {
			return fmt.Errorf("pushing %s: %w", r, err)
		}
	}
	return nil
}
