package devenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Tool is the path of a tool the Makefile builds and caches (make promtool, make
// prometheus): $<ENV> when set (make exports it), else what `make -s <target>` builds
// once and prints.
func Tool(env, target string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "-C", root, target)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building %s with make %s: %w", env, target, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}
