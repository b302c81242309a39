package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// reapUntil returns the exit code of the child it waits for, as a shell reports it.
func TestReapUntilReportsTheChildsExit(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		want         int
	}{
		{"exit status", "exit 3", 3},
		{"success", "true", 0},
		{"killed by a signal", "kill -TERM $$", 128 + 15},
		{"after a grandchild", "sh -c 'exit 9' & wait; exit 4", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", tc.script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if got := reapUntil(cmd.Process.Pid); got != tc.want {
				t.Errorf("reapUntil = %d, want %d", got, tc.want)
			}
		})
	}
}

// reaperHelperEnv makes this test binary the helper of TestReapUntilReapsOrphans.
const reaperHelperEnv = "PGPILOT_TEST_REAPER_HELPER"

// An orphan that dies while the agent runs is reaped, not left a zombie: the init is the
// orphans' parent (PID 1 in a container; here a child subreaper, which the kernel treats
// alike), and reapUntil waits for every child, not only the agent. The helper runs in a
// process of its own, as reaping every child would steal other tests' exit statuses.
func TestReapUntilReapsOrphans(t *testing.T) {
	if dir := os.Getenv(reaperHelperEnv); dir != "" {
		reaperHelper(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReapUntilReapsOrphans$", "-test.count=1")
	cmd.Env = append(os.Environ(), reaperHelperEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the helper: %v\n%s", err, out)
	}
	result, _ := os.ReadFile(filepath.Join(dir, "result"))
	if got, want := strings.TrimSpace(string(result)), "code 5, orphan reaped"; got != want {
		t.Errorf("helper: %q, want %q\n%s", got, want, out)
	}
}

// reaperHelper starts the "agent" (a shell that orphans a short-lived grandchild, then
// exits 5 a second later), runs reapUntil on it, and writes what became of the orphan.
func reaperHelper(dir string) {
	result := func(format string, args ...any) {
		_ = os.WriteFile(filepath.Join(dir, "result"), []byte(fmt.Sprintf(format, args...)), 0o600)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		result("PR_SET_CHILD_SUBREAPER: %v", err)
		return
	}
	pidFile := filepath.Join(dir, "orphan.pid")
	// The inner shell exits at once, orphaning the sleep, which dies 0.2 s later while
	// the outer shell still runs.
	cmd := exec.Command("sh", "-c", `sh -c 'sleep 0.2 & echo $! > "$1"' _ "$0"; sleep 1; exit 5`, pidFile)
	if err := cmd.Start(); err != nil {
		result("starting: %v", err)
		return
	}
	code := reapUntil(cmd.Process.Pid)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		result("code %d, no orphan: %v", code, err)
		return
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		result("code %d, orphan pid %q", code, b)
		return
	}
	// Reaped, its /proc entry is gone; a zombie keeps it with state Z.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", orphan))
	if err != nil {
		result("code %d, orphan reaped", code)
		return
	}
	// Not reaped: report its state, then reap it so that nothing is left behind.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	var ws unix.WaitStatus
	_, _ = unix.Wait4(orphan, &ws, unix.WNOHANG, nil)
	time.Sleep(10 * time.Millisecond)
	result("code %d, orphan %d left in state %s", code, orphan, fields[0])
}
