package image

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// The pooler's PgBouncer image, as hack/images/pgbouncer.sh builds it (make
// image-pgbouncer; cached, so built once per Debian version): what the pooler pods need
// of it, pgbouncer on PATH and at /usr/sbin/pgbouncer, running as 999 from the unpacked
// image; and the version config/manager pins is the one it builds. Root: building it and
// chroot need it.
func TestPgBouncerImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("building the PgBouncer image and running it with chroot need root (make image-pgbouncer)")
	}
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tarball, ref := buildImage(t, root, "pgbouncer.sh")
	version, ok := strings.CutPrefix(ref, "pgpilot-pgbouncer:")
	if !ok || !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(version) {
		t.Fatalf("the reference %s is not pgpilot-pgbouncer:<PgBouncer's version>", ref)
	}

	m, small := readManifest(t, tarball, ref)
	var config struct {
		Config struct {
			User       string
			Env        []string
			Entrypoint []string
		}
	}
	if err := json.Unmarshal(small[m.Config], &config); err != nil {
		t.Fatal(err)
	}
	if config.Config.User != "999:999" || len(config.Config.Entrypoint) != 0 {
		t.Errorf("user %q, entrypoint %q; want 999:999 and none (the pods' command is the agent)",
			config.Config.User, config.Config.Entrypoint)
	}
	var path string
	for _, kv := range config.Config.Env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = p
		}
	}
	if !slices.Contains(strings.Split(path, ":"), "/usr/sbin") {
		t.Errorf("the image's PATH %q has no /usr/sbin", path)
	}

	fs := unpackLayer(t, tarball, m.Layers[0])
	if fi, err := os.Stat(filepath.Join(fs, "usr", "sbin", "pgbouncer")); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("no executable /usr/sbin/pgbouncer: %v", err)
	}
	run := exec.Command("chroot", "--userspec=999:999", fs, "/usr/bin/env", "-i", "PATH="+path, "pgbouncer", "--version")
	got, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("pgbouncer --version as 999 in the image: %v\n%s", err, got)
	}
	if !strings.HasPrefix(string(got), "PgBouncer "+version+"\n") {
		t.Errorf("pgbouncer --version says %q, the image is tagged %s", got, version)
	}

	// The CSV names pgpilot's own image at the version this builds.
	manager, err := os.ReadFile(filepath.Join(root, "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pin := regexp.MustCompile(`- name: RELATED_IMAGE_PGBOUNCER\n\s+value: \S+-pgbouncer:(\S+)\n`).FindSubmatch(manager)
	if pin == nil || string(pin[1]) != version {
		t.Errorf("config/manager's RELATED_IMAGE_PGBOUNCER is not pinned to %s, the PgBouncer hack/images/pgbouncer.sh builds", version)
	}
}

// unpackLayer extracts the image tarball's member layer (a gzip-compressed tar) with tar,
// owners and modes kept, into a temporary directory, and returns it.
func unpackLayer(t *testing.T, file, layer string) string {
	t.Helper()
	dir := t.TempDir()
	untar := exec.Command("tar", "-xzf", "-", "-C", dir, "--same-owner", "--same-permissions")
	untar.Stdin = openMember(t, file, layer)
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", layer, err, out)
	}
	return dir
}
