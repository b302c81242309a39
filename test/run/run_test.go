// Package run checks `make run` (docs/getting-started.md): with no reachable cluster it
// starts the embedded control plane, and `kubectl get pgc` then shows the example.
package run

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

func TestRunWithoutAClusterStartsTheEmbeddedControlPlane(t *testing.T) {
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := devenv.Assets(root)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	var out bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "run.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+filepath.Join(t.TempDir(), "no-such-kubeconfig"),
		"PGPILOT_LOCAL_KUBECONFIG="+kubeconfig,
		"KUBEBUILDER_ASSETS="+assets)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}()

	kubectl := filepath.Join(assets, "kubectl")
	deadline := time.Now().Add(3 * time.Minute)
	var got string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "get", "pgc", "my-db",
			"-o", "jsonpath={.metadata.name} {.spec.replicas} {.spec.version} {.status.currentPrimary}").CombinedOutput()
		cancel()
		got = string(b)
		if err == nil && got == "my-db 3 16 my-db-0" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("make run exited early (%v):\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl get pgc my-db printed %q; make run printed:\n%s", got, out.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "export KUBECONFIG="+kubeconfig) {
		t.Errorf("make run did not tell the user which KUBECONFIG to use:\n%s", out.String())
	}

	// Ctrl-C stops everything cleanly.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("make run exited with %v after Ctrl-C:\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("make run did not stop within a minute of Ctrl-C:\n%s", out.String())
	}
}
