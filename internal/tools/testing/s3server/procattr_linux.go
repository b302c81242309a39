package s3server

import (
	"os/exec"
	"syscall"
)

// setProcAttr has the kernel kill versitygw if the test binary dies without stopping it
// (a test timeout's panic runs no cleanups).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
