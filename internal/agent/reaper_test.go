package agent

import (
	"os/exec"
	"testing"
)

// reapUntil returns the exit code of the child it waits for, as a shell reports it.
// (That PID 1 reaps orphans and the agent's children keep their statuses is proven in
// the pods of make e2e, where the agent is PID 1.)
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
