package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The tests read the tarballs back with nothing but archive/tar and encoding/json, as
// an importer would: the manifest, the config it names, the layers the config lists.

type readBack struct {
	files    map[string][]byte // the tarball's files
	repoTags []string
	configID string // sha256:<hex> of the config, as its file name says
	config   v1.ConfigFile
	layers   [][]byte // uncompressed
	blobs    []string // the layers' file names in the tarball
}

func readTarball(t *testing.T, file string) readBack {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rb := readBack{files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		rb.files[hdr.Name] = data
	}
	var manifests []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(rb.files["manifest.json"], &manifests); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifests) != 1 {
		t.Fatalf("manifest.json has %d images, want 1", len(manifests))
	}
	m := manifests[0]
	rb.repoTags = m.RepoTags
	sort.Strings(rb.repoTags)

	cdata, ok := rb.files[m.Config]
	if !ok {
		t.Fatalf("the tarball has no %s", m.Config)
	}
	rb.configID = "sha256:" + sha256hex(cdata)
	if m.Config != rb.configID {
		t.Fatalf("%s holds a config whose digest is %s", m.Config, rb.configID)
	}
	if err := json.Unmarshal(cdata, &rb.config); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != len(rb.config.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff_ids", len(m.Layers), len(rb.config.RootFS.DiffIDs))
	}
	for i, p := range m.Layers {
		data, ok := rb.files[p]
		if !ok {
			t.Fatalf("the tarball has no %s", p)
		}
		if want := sha256hex(data) + ".tar.gz"; p != want {
			t.Fatalf("%s holds a layer whose digest names %s", p, want)
		}
		gz, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("layer %s: %v", p, err)
		}
		plain, err := io.ReadAll(gz)
		if err != nil {
			t.Fatalf("layer %s: %v", p, err)
		}
		if got := "sha256:" + sha256hex(plain); got != rb.config.RootFS.DiffIDs[i].String() {
			t.Fatalf("layer %d is %s, the config says %s", i, got, rb.config.RootFS.DiffIDs[i])
		}
		rb.layers = append(rb.layers, plain)
		rb.blobs = append(rb.blobs, p)
	}
	return rb
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// layerEntry is what a test checks of one tar entry.
type layerEntry struct {
	Type     byte
	Mode     int64
	UID, Gid int
	Link     string
	Content  string
	ModTime  int64
}

func listLayer(t *testing.T, data []byte) (map[string]layerEntry, []string) {
	t.Helper()
	out := map[string]layerEntry{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, order
		}
		if err != nil {
			t.Fatal(err)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[hdr.Name]; dup {
			t.Errorf("the layer has %s twice", hdr.Name)
		}
		out[hdr.Name] = layerEntry{Type: hdr.Typeflag, Mode: hdr.Mode, UID: hdr.Uid, Gid: hdr.Gid, Link: hdr.Linkname, Content: string(content), ModTime: hdr.ModTime.Unix()}
		order = append(order, hdr.Name)
	}
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

// tinyRootfs is a root file system with a program, a configuration file, a symbolic
// link, a hard link, an empty sticky directory and a directory to give another owner.
func tinyRootfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write(t, filepath.Join(root, "bin/hello"), "#!/bin/sh\necho hello\n", 0o755)
	write(t, filepath.Join(root, "etc/hello.conf"), "greeting=hello\n", 0o644)
	write(t, filepath.Join(root, "home/app/.profile"), "export A=1\n", 0o600)
	if err := os.Symlink("hello", filepath.Join(root, "bin/hi")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "bin/hello"), filepath.Join(root, "bin/hello2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	chmodDirs(t, root)
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	return root
}

// chmodDirs makes every directory under root 0755, whatever the umask.
func chmodDirs(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mkimage(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(args, &out); err != nil {
		t.Fatalf("mkimage %s: %v", strings.Join(args, " "), err)
	}
	id := strings.TrimSpace(out.String())
	if !strings.HasPrefix(id, "sha256:") || len(id) != 71 {
		t.Fatalf("mkimage printed %q, want the image ID", id)
	}
	return id
}

func TestImageFromRootfs(t *testing.T) {
	root := tinyRootfs(t)
	out := filepath.Join(t.TempDir(), "images", "hello-{id}.tar")
	id := mkimage(t, "-rootfs", root, "-o", out, "-ref", "hello:dev", "-ref", "example.com:5000/team/hello:{id}",
		"-chown", "0:0", "-owner", "/home/app=1000:1001", "-owner", "tmp=0:0",
		"-entrypoint", `["/bin/hello"]`, "-cmd", `["--loud"]`, "-user", "65532:65532", "-workdir", "/home/app",
		"-env", "PATH=/bin", "-env", "HOME=/home/app", "-label", "org.opencontainers.image.title=hello",
		"-expose", "8080", "-stop-signal", "SIGINT", "-platform", "linux/arm64/v8", "-epoch", "1700000000")
	short := strings.TrimPrefix(id, "sha256:")[:12]
	file := strings.ReplaceAll(out, "{id}", short)
	rb := readTarball(t, file)

	if rb.configID != id {
		t.Errorf("the image ID is %s, mkimage printed %s", rb.configID, id)
	}
	if diff := cmp.Diff([]string{"example.com:5000/team/hello:" + short, "hello:dev"}, rb.repoTags); diff != "" {
		t.Errorf("RepoTags (-want +got):\n%s", diff)
	}
	wantConfig := v1.Config{
		User: "65532:65532", ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		Env: []string{"PATH=/bin", "HOME=/home/app"}, Entrypoint: []string{"/bin/hello"}, Cmd: []string{"--loud"},
		WorkingDir: "/home/app", Labels: map[string]string{"org.opencontainers.image.title": "hello"}, StopSignal: "SIGINT",
	}
	if diff := cmp.Diff(wantConfig, rb.config.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if rb.config.OS != "linux" || rb.config.Architecture != "arm64" || rb.config.Variant != "v8" ||
		!rb.config.Created.Time.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("platform and creation: %+v", rb.config)
	}
	if len(rb.layers) != 1 {
		t.Fatalf("%d layers, want 1", len(rb.layers))
	}

	got, order := listLayer(t, rb.layers[0])
	const e = 1700000000
	want := map[string]layerEntry{
		"bin/":              {Type: tar.TypeDir, Mode: 0o755, ModTime: e},
		"bin/hello":         {Type: tar.TypeReg, Mode: 0o755, Content: "#!/bin/sh\necho hello\n", ModTime: e},
		"bin/hello2":        {Type: tar.TypeLink, Mode: 0o755, Link: "bin/hello", ModTime: e},
		"bin/hi":            {Type: tar.TypeSymlink, Mode: 0o777, Link: "hello", ModTime: e},
		"etc/":              {Type: tar.TypeDir, Mode: 0o755, ModTime: e},
		"etc/hello.conf":    {Type: tar.TypeReg, Mode: 0o644, Content: "greeting=hello\n", ModTime: e},
		"home/":             {Type: tar.TypeDir, Mode: 0o755, ModTime: e},
		"home/app/":         {Type: tar.TypeDir, Mode: 0o755, UID: 1000, Gid: 1001, ModTime: e},
		"home/app/.profile": {Type: tar.TypeReg, Mode: 0o600, UID: 1000, Gid: 1001, Content: "export A=1\n", ModTime: e},
		"tmp/":              {Type: tar.TypeDir, Mode: 0o1777, ModTime: e},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer (-want +got):\n%s", diff)
	}
	// Every directory comes before what it holds.
	seen := map[string]bool{}
	for _, name := range order {
		if parent := filepath.Dir(strings.TrimSuffix(name, "/")); parent != "." && !seen[parent+"/"] {
			t.Errorf("%s comes before its directory", name)
		}
		seen[name] = true
	}

	// The same inputs give the same bytes.
	again := filepath.Join(t.TempDir(), "again.tar")
	id2 := mkimage(t, "-rootfs", root, "-o", again, "-ref", "hello:dev", "-ref", "example.com:5000/team/hello:{id}",
		"-chown", "0:0", "-owner", "/home/app=1000:1001", "-owner", "tmp=0:0",
		"-entrypoint", `["/bin/hello"]`, "-cmd", `["--loud"]`, "-user", "65532:65532", "-workdir", "/home/app",
		"-env", "PATH=/bin", "-env", "HOME=/home/app", "-label", "org.opencontainers.image.title=hello",
		"-expose", "8080", "-stop-signal", "SIGINT", "-platform", "linux/arm64/v8", "-epoch", "1700000000")
	if rb2 := readTarball(t, again); id2 != id || !cmp.Equal(rb.blobs, rb2.blobs) {
		t.Error("the same inputs and -epoch gave a different image")
	}
	// Nothing is left beside the tarball.
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Errorf("the output directory holds %d files, want the tarball only", len(entries))
	}
}

func TestTarLayers(t *testing.T) {
	// A base layer given as a gzip-compressed tar, then a directory on top.
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, content string }{{"etc/os-release", "ID=tiny\n"}, {"bin/sh", "not really a shell"}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o755, Size: int64(len(f.content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.content)); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	gz.Close()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.tar.gz")
	if err := os.WriteFile(base, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "tiny.tar")
	id := mkimage(t, "-rootfs", base, "-rootfs", tinyRootfs(t), "-chown", "0:0",
		"-o", out, "-ref", "tiny", "-ref", "registry.example.com/tiny:1", "-entrypoint", `["/bin/sh"]`)

	rb := readTarball(t, out)
	if rb.configID != id {
		t.Errorf("the image ID is %s, mkimage printed %s", rb.configID, id)
	}
	if diff := cmp.Diff([]string{"registry.example.com/tiny:1", "tiny:latest"}, rb.repoTags); diff != "" {
		t.Errorf("image names (-want +got):\n%s", diff)
	}
	if len(rb.layers) != 2 {
		t.Fatalf("%d layers, want 2", len(rb.layers))
	}
	first, _ := listLayer(t, rb.layers[0])
	if first["etc/os-release"].Content != "ID=tiny\n" || len(first) != 2 {
		t.Errorf("the first layer is not the tar given: %v", first)
	}
	second, _ := listLayer(t, rb.layers[1])
	if second["bin/hello"].Content == "" {
		t.Errorf("the second layer is not the directory given: %v", second)
	}
	if diff := cmp.Diff([]string{"/bin/sh"}, rb.config.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	// Without -epoch: the files' own times, the image made now.
	if created := rb.config.Created.Time; time.Since(created) > time.Hour {
		t.Errorf("created %q, want about now", rb.config.Created)
	}
}

// A Dockerfile's last stage, FROM scratch, built with its COPY --from sources given as
// directories, as hack/images/operator.sh builds the operator image.
func TestDockerfileLastStage(t *testing.T) {
	ctx := t.TempDir()
	write(t, filepath.Join(ctx, "Dockerfile"), `# syntax=docker/dockerfile:1
ARG GO_VERSION=1.23
FROM golang:${GO_VERSION} AS builder
WORKDIR /src
COPY . .
RUN go build -o /out/ ./cmd/...
RUN mkdir -p /rootfs/tmp && chmod 1777 /rootfs/tmp

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="demo app" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      quoted='$NOT_EXPANDED'
COPY --from=builder --chown=65532:65532 /rootfs/tmp /tmp
COPY --from=builder /out/ /usr/local/bin/
COPY config.yaml /opt/app/config.yaml
COPY charts/ /opt/app/charts/
ENV HOME=/tmp \
    GREETING="hello world"
WORKDIR /opt/app
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/app"]
CMD ["--serve"]
`, 0o644)
	write(t, filepath.Join(ctx, "config.yaml"), "a: 1\n", 0o644)
	write(t, filepath.Join(ctx, "charts/demo/Chart.yaml"), "name: demo\n", 0o644)
	write(t, filepath.Join(ctx, "charts/demo/notes.bak"), "left out\n", 0o644)
	write(t, filepath.Join(ctx, ".dockerignore"), "*.md\ncharts/*/*.bak\n", 0o644)
	chmodDirs(t, ctx)
	out := t.TempDir()
	write(t, filepath.Join(out, "app"), "binary", 0o755)
	write(t, filepath.Join(out, "tool"), "binary", 0o755)
	tmp := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), "app.tar")
	mkimage(t, "-dockerfile", filepath.Join(ctx, "Dockerfile"), "-context", ctx,
		"-from", "builder:/out/="+out, "-from", "builder:/rootfs/tmp="+tmp, "-build-arg", "REVISION=abc123",
		"-o", file, "-ref", "app:dev", "-epoch", "0", "-label", "extra=yes")
	rb := readTarball(t, file)
	wantConfig := v1.Config{
		User:         "65532:65532",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "GREETING=hello world"},
		Entrypoint:   []string{"/usr/local/bin/app"},
		Cmd:          []string{"--serve"},
		WorkingDir:   "/opt/app",
		Labels: map[string]string{
			"org.opencontainers.image.title":    "demo app",
			"org.opencontainers.image.version":  "dev",
			"org.opencontainers.image.revision": "abc123",
			"quoted":                            "$NOT_EXPANDED",
			"extra":                             "yes",
		},
	}
	if diff := cmp.Diff(wantConfig, rb.config.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	got, _ := listLayer(t, rb.layers[0])
	want := map[string]layerEntry{
		"opt/":                           {Type: tar.TypeDir, Mode: 0o755},
		"opt/app/":                       {Type: tar.TypeDir, Mode: 0o755},
		"opt/app/config.yaml":            {Type: tar.TypeReg, Mode: 0o644, Content: "a: 1\n"},
		"opt/app/charts/":                {Type: tar.TypeDir, Mode: 0o755},
		"opt/app/charts/demo/":           {Type: tar.TypeDir, Mode: 0o755},
		"opt/app/charts/demo/Chart.yaml": {Type: tar.TypeReg, Mode: 0o644, Content: "name: demo\n"},
		"tmp/":                           {Type: tar.TypeDir, Mode: 0o1777, UID: 65532, Gid: 65532},
		"usr/":                           {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/":                     {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/bin/":                 {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/bin/app":              {Type: tar.TypeReg, Mode: 0o755, Content: "binary"},
		"usr/local/bin/tool":             {Type: tar.TypeReg, Mode: 0o755, Content: "binary"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer (-want +got):\n%s", diff)
	}

	// What a builder would need is refused, not skipped.
	for name, df := range map[string]string{
		"RUN":       "FROM scratch\nRUN true\n",
		"base":      "FROM debian:bookworm\nCOPY config.yaml /\n",
		"wildcard":  "FROM scratch\nCOPY *.yaml /\n",
		"from":      "FROM scratch\nCOPY --from=other /x /x\n",
		"user name": "FROM scratch\nCOPY --chown=app config.yaml /\n",
		"ignored":   "FROM scratch\nCOPY charts/demo/notes.bak /\n",
	} {
		t.Run(name, func(t *testing.T) {
			write(t, filepath.Join(ctx, "Dockerfile.bad"), df, 0o644)
			err := run([]string{"-dockerfile", filepath.Join(ctx, "Dockerfile.bad"), "-context", ctx,
				"-o", filepath.Join(t.TempDir(), "x.tar"), "-ref", "x"}, io.Discard)
			if err == nil {
				t.Errorf("mkimage built %q", df)
			}
		})
	}
}

func TestRefs(t *testing.T) {
	for in, want := range map[string]string{
		"pgpilot":                        "index.docker.io/library/pgpilot:latest",
		"pgpilot-postgres:15":            "index.docker.io/library/pgpilot-postgres:15",
		"team/app:v1.2":                  "index.docker.io/team/app:v1.2",
		"localhost:5000/app":             "localhost:5000/app:latest",
		"registry.example.com/a/b:x_y-z": "registry.example.com/a/b:x_y-z",
	} {
		r, err := parseRef(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := r.Name(); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	for _, bad := range []string{"", "UPPER:1", "app@sha256:abc", "app:", "a b"} {
		if _, err := parseRef(bad); err == nil {
			t.Errorf("%q was taken as a reference", bad)
		}
	}
}

// -push writes the image to a registry through its HTTP API, under every -ref, and
// what is pulled back is the image mkimage reported. The registry is
// go-containerregistry's in-process one; make e2e pushes to the local cluster's.
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	id := mkimage(t, "-rootfs", tinyRootfs(t), "-chown", "0:0", "-entrypoint", `["/bin/hello"]`, "-epoch", "0",
		"-ref", host+"/team/hello:{id}", "-ref", host+"/team/hello:dev", "-push")
	short := strings.TrimPrefix(id, "sha256:")[:12]
	for _, tag := range []string{short, "dev"} {
		ref, err := name.NewTag(host + "/team/hello:" + tag)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("pulling %s: %v", ref, err)
		}
		got, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		if got.String() != id {
			t.Errorf("%s has the image %s, mkimage reported %s", ref, got, id)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"/bin/hello"}, cfg.Config.Entrypoint); diff != "" {
			t.Errorf("%s: entrypoint (-want +got):\n%s", ref, diff)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers (%v), want 1", ref, len(layers), err)
		}
	}
}

func TestBadArguments(t *testing.T) {
	root := tinyRootfs(t)
	out := filepath.Join(t.TempDir(), "x.tar")
	for _, args := range [][]string{
		{"-rootfs", root, "-o", out},   // no -ref
		{"-rootfs", root, "-ref", "x"}, // no -o, no -push
		{"-o", out, "-ref", "x"},       // no layer
		{"-rootfs", root, "-o", out, "-ref", "x", "-entrypoint", "/bin/sh"},
		{"-rootfs", root, "-o", out, "-ref", "x", "-owner", "/nope=1:1"},
		{"-rootfs", root, "-o", out, "-ref", "x", "-chown", "app"},
		{"-rootfs", filepath.Join(root, "etc/hello.conf"), "-o", out, "-ref", "x"}, // not a tar
	} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("mkimage %s succeeded", strings.Join(args, " "))
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed run left %s", out)
	}
	if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 0 {
		t.Errorf("failed runs left %d files", len(entries))
	}
}

// -base starts from an image tarball: its layers come first and its settings are the
// defaults the flags change, as a Dockerfile's FROM <image> would give.
func TestBase(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.tar")
	baseID := mkimage(t, "-rootfs", tinyRootfs(t), "-chown", "0:0", "-epoch", "0", "-ref", "base:1", "-o", base,
		"-entrypoint", `["/bin/hello"]`, "-env", "PATH=/bin", "-label", "from=base", "-user", "1001")
	extra := t.TempDir()
	write(t, filepath.Join(extra, "configs/pkg/catalog.yaml"), "schema: olm.package\n", 0o644)
	chmodDirs(t, extra)
	out := filepath.Join(dir, "derived.tar")
	id := mkimage(t, "-base", base, "-rootfs", extra, "-chown", "0:0", "-epoch", "0", "-ref", "derived:1", "-o", out,
		"-cmd", `["serve", "/configs"]`, "-label", "index=/configs")
	if id == baseID {
		t.Fatal("the derived image is the base image")
	}
	rb := readTarball(t, out)
	brb := readTarball(t, base)
	if len(rb.layers) != 2 || !bytes.Equal(rb.layers[0], brb.layers[0]) {
		t.Fatalf("the derived image has %d layers, want the base's then the new one", len(rb.layers))
	}
	if second, _ := listLayer(t, rb.layers[1]); second["configs/pkg/catalog.yaml"].Content == "" {
		t.Errorf("the second layer is not the directory given: %v", second)
	}
	want := v1.Config{
		User: "1001", Env: []string{"PATH=/bin"}, Entrypoint: []string{"/bin/hello"}, Cmd: []string{"serve", "/configs"},
		Labels: map[string]string{"from": "base", "index": "/configs"},
	}
	if diff := cmp.Diff(want, rb.config.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if len(rb.config.History) != 2 {
		t.Errorf("history has %d entries, want the base's and the new layer's", len(rb.config.History))
	}
	if err := run([]string{"-base", filepath.Join(dir, "none.tar"), "-rootfs", extra, "-ref", "x", "-o", filepath.Join(dir, "x.tar")}, io.Discard); err == nil {
		t.Error("a missing -base was accepted")
	}
}
