package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tarballEntry is what the test compares of one file of the image.
type tarballEntry struct {
	Dir      bool
	Mode     fs.FileMode // permission bits, with the sticky bit
	UID, Gid int
	Content  string // of the files other than the binaries
}

// The operator image hack/images/operator.sh builds without Docker (make image-operator)
// has the files and settings the Dockerfile gives it: the same as the layout the other
// tests build from the Dockerfile themselves.
func TestOperatorTarballMatchesTheDockerfile(t *testing.T) {
	img := readImage(t)
	fsRoot := layout(t, img)

	tarball, ref := buildImage(t, img.root, "operator.sh", "PGPILOT_CACHE="+t.TempDir())
	tag := strings.TrimPrefix(ref, "pgpilot:")
	if filepath.Base(tarball) != "pgpilot-"+tag+".tar" {
		t.Errorf("the tarball %s is not named after the reference %s", tarball, ref)
	}

	m, small := readManifest(t, tarball, ref)
	if !strings.HasPrefix(strings.TrimPrefix(m.Config, "sha256:"), tag) {
		t.Errorf("the tag %s is not the image ID %s", tag, m.Config)
	}
	var config struct {
		Config struct {
			User, WorkingDir string
			Env, Entrypoint  []string
		}
	}
	if err := json.Unmarshal(small[m.Config], &config); err != nil {
		t.Fatal(err)
	}
	var entrypoint []string
	if err := json.Unmarshal([]byte(img.final.last("ENTRYPOINT")), &entrypoint); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(entrypoint, config.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-Dockerfile +tarball):\n%s", diff)
	}
	if config.Config.User != img.final.last("USER") || config.Config.WorkingDir != img.final.last("WORKDIR") {
		t.Errorf("user %q and working directory %q, the Dockerfile says %q and %q", config.Config.User,
			config.Config.WorkingDir, img.final.last("USER"), img.final.last("WORKDIR"))
	}
	for _, env := range img.final.all("ENV") {
		for _, kv := range strings.Fields(env) {
			if !slices.Contains(config.Config.Env, kv) {
				t.Errorf("the image's environment %q has no %s", config.Config.Env, kv)
			}
		}
	}

	// The files: those of the layout, root's but for what a COPY --chown gives another
	// owner; /tmp as the builder makes it, sticky and writable by all.
	chown := map[string][2]int{}
	for _, c := range img.final.all("COPY") {
		flags, _, dst := copyArgs(c)
		if o := flags["chown"]; o != "" {
			u, g, _ := strings.Cut(o, ":")
			uid, err1 := strconv.Atoi(u)
			gid, err2 := strconv.Atoi(g)
			if err1 != nil || err2 != nil {
				t.Fatalf("COPY --chown=%s: want numeric UID:GID", o)
			}
			chown[strings.Trim(dst, "/")] = [2]int{uid, gid}
		}
	}
	want := map[string]tarballEntry{}
	bins := filepath.Join("usr", "local", "bin")
	err := filepath.WalkDir(fsRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == fsRoot {
			return err
		}
		rel, _ := filepath.Rel(fsRoot, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := tarballEntry{Dir: d.IsDir()}
		if !d.IsDir() {
			e.Mode = info.Mode().Perm()
			if filepath.Dir(rel) != bins {
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				e.Content = string(data)
			}
		}
		for dst, o := range chown {
			if rel == dst || strings.HasPrefix(rel, dst+"/") {
				e.UID, e.Gid = o[0], o[1]
			}
		}
		want[filepath.ToSlash(rel)] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := readLayer(t, tarball, m.Layers[0], func(name string) bool { return strings.HasPrefix(name, "usr/local/bin/") })
	tmp := got["tmp"]
	if !tmp.Dir || tmp.Mode != 0o777|fs.ModeSticky {
		t.Errorf("/tmp is %+v, want a directory with mode 1777", tmp)
	}
	for name, e := range got {
		if e.Dir {
			e.Mode = 0 // directories: the layout's modes are the test's umask's
			got[name] = e
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the tarball's files (-Dockerfile layout +tarball):\n%s", diff)
	}
}

// buildImage runs the script of hack/images, with env added to the test's environment,
// and returns the image tarball and the image reference it prints.
func buildImage(t *testing.T, root, script string, env ...string) (tarball, ref string) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "images", script))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, stderr.String())
	}
	lines := strings.Fields(string(out))
	if len(lines) != 2 {
		t.Fatalf("%s printed %q, want the tarball and the image reference", script, out)
	}
	return lines[0], lines[1]
}

// imageManifest is an image's entry in an image tarball's manifest.json.
type imageManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// readManifest returns the one image of an image tarball, which must be tagged ref and
// have one layer, and the tarball's small files (readSmallFiles), its config among them.
func readManifest(t *testing.T, tarball, ref string) (imageManifest, map[string][]byte) {
	t.Helper()
	small := readSmallFiles(t, tarball)
	var manifests []imageManifest
	if err := json.Unmarshal(small["manifest.json"], &manifests); err != nil || len(manifests) != 1 {
		t.Fatalf("manifest.json: %v %+v", err, manifests)
	}
	m := manifests[0]
	if !slices.Contains(m.RepoTags, ref) || len(m.Layers) != 1 {
		t.Fatalf("manifest.json: %+v, want one layer and the tag %s", m, ref)
	}
	return m, small
}

// readSmallFiles returns the content of a tar file's members under a megabyte: an image
// tarball's manifest and config.
func readSmallFiles(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size < 1<<20 {
			if out[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// readLayer lists the layer tar (gzip-compressed, as go-containerregistry writes it)
// that is the member layer of an image tarball, with the content of the files but those
// skipContent names.
func readLayer(t *testing.T, file, layer string, skipContent func(string) bool) map[string]tarballEntry {
	t.Helper()
	out := map[string]tarballEntry{}
	gz, err := gzip.NewReader(openMember(t, file, layer))
	if err != nil {
		t.Fatalf("%s: %v", layer, err)
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		e := tarballEntry{Dir: hdr.Typeflag == tar.TypeDir, Mode: hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky), UID: hdr.Uid, Gid: hdr.Gid}
		if hdr.Typeflag == tar.TypeReg && !skipContent(name) {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			e.Content = string(data)
		}
		out[name] = e
	}
}

// openMember returns a reader of the member name of the tar file, which is closed when
// the test ends.
func openMember(t *testing.T, file, name string) io.Reader {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s has no %s: %v", file, name, err)
		}
		if hdr.Name == name {
			return tr
		}
	}
}
