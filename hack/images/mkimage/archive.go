package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Media types of the OCI image format.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// runConfig is the part of an image configuration a container runs with; the field
// names are the image specification's.
type runConfig struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	WorkingDir   string              `json:"WorkingDir,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
	StopSignal   string              `json:"StopSignal,omitempty"`
}

type history struct {
	Created   string `json:"created,omitempty"`
	CreatedBy string `json:"created_by,omitempty"`
	Comment   string `json:"comment,omitempty"`
}

// imageConfig is an OCI image configuration, which Docker reads as well.
type imageConfig struct {
	Created      string    `json:"created,omitempty"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Variant      string    `json:"variant,omitempty"`
	Config       runConfig `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []history `json:"history,omitempty"`
}

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

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// ref is an image reference with a tag: name is as given, tag explicit.
type ref struct{ name, tag string }

var (
	refComponent = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	refDomain    = `(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?`
	refRE        = regexp.MustCompile(`^(` + refDomain + refComponent + `(?:/` + refComponent + `)*)(?::([\w][\w.-]{0,127}))?$`)
)

func parseRef(s string) (ref, error) {
	m := refRE.FindStringSubmatch(s)
	if m == nil {
		return ref{}, fmt.Errorf("%q is not an image reference name[:tag] (no digests)", s)
	}
	r := ref{name: m[1], tag: m[2]}
	if r.tag == "" {
		r.tag = "latest"
	}
	return r, nil
}

func (r ref) String() string { return r.name + ":" + r.tag }

// full is the reference as containerd and the kubelet normalise it:
// "pgpilot:dev" is "docker.io/library/pgpilot:dev".
func (r ref) full() string {
	name := r.name
	first, _, hasSlash := strings.Cut(name, "/")
	switch {
	case !hasSlash:
		name = "docker.io/library/" + name
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		name = "docker.io/" + name
	}
	return name + ":" + r.tag
}

// archive is what goes into an image tarball.
type archive struct {
	config []byte
	layers []blob
	refs   []ref
	format string // "docker" or "oci"
	mtime  time.Time
	plat   platform
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }

// write writes the tarball to out through a temporary file in the same directory, so
// that a reader never sees half of it.
func (a *archive) write(out string) (err error) {
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
	tw := tar.NewWriter(f)
	if err = a.writeTar(tw); err != nil {
		return err
	}
	if err = tw.Close(); err != nil {
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

func (a *archive) writeTar(tw *tar.Writer) error {
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: a.mtime})
	}
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: a.mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	configDigest := digestOf(a.config)
	if err := file(blobPath(configDigest), a.config); err != nil {
		return err
	}
	written := map[string]bool{}
	for _, l := range a.layers {
		if written[l.digest] {
			continue // the same layer twice is stored once
		}
		written[l.digest] = true
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: blobPath(l.digest), Mode: 0o644, Size: l.size, ModTime: a.mtime}); err != nil {
			return err
		}
		if err := copyFileInto(tw, l.file, l.size); err != nil {
			return err
		}
	}

	switch a.format {
	case "docker":
		// docker load's manifest.json; containerd's importer reads it too.
		type dockerManifest struct {
			Config   string
			RepoTags []string
			Layers   []string
		}
		m := dockerManifest{Config: blobPath(configDigest), RepoTags: []string{}, Layers: []string{}}
		for _, r := range a.refs {
			m.RepoTags = append(m.RepoTags, r.String())
		}
		for _, l := range a.layers {
			m.Layers = append(m.Layers, blobPath(l.digest))
		}
		data, err := json.Marshal([]dockerManifest{m})
		if err != nil {
			return err
		}
		return file("manifest.json", data)
	case "oci":
		manifest := struct {
			SchemaVersion int          `json:"schemaVersion"`
			MediaType     string       `json:"mediaType"`
			Config        descriptor   `json:"config"`
			Layers        []descriptor `json:"layers"`
		}{SchemaVersion: 2, MediaType: mediaTypeManifest,
			Config: descriptor{MediaType: mediaTypeConfig, Digest: configDigest, Size: int64(len(a.config))},
			Layers: []descriptor{}}
		for _, l := range a.layers {
			manifest.Layers = append(manifest.Layers, descriptor{MediaType: mediaTypeLayer, Digest: l.digest, Size: l.size})
		}
		mdata, err := json.Marshal(manifest)
		if err != nil {
			return err
		}
		mdigest := digestOf(mdata)
		if err := file(blobPath(mdigest), mdata); err != nil {
			return err
		}
		index := struct {
			SchemaVersion int          `json:"schemaVersion"`
			MediaType     string       `json:"mediaType"`
			Manifests     []descriptor `json:"manifests"`
		}{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: []descriptor{}}
		plat := a.plat
		for _, r := range a.refs {
			index.Manifests = append(index.Manifests, descriptor{
				MediaType: mediaTypeManifest, Digest: mdigest, Size: int64(len(mdata)), Platform: &plat,
				// containerd names the image after the first, other tools after the second.
				Annotations: map[string]string{
					"io.containerd.image.name":          r.full(),
					"org.opencontainers.image.ref.name": r.tag,
				},
			})
		}
		idata, err := json.Marshal(index)
		if err != nil {
			return err
		}
		if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return err
		}
		return file("index.json", idata)
	}
	return fmt.Errorf("unknown format %q", a.format)
}
