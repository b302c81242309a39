package agent

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The agent is PID 1 of its container: orphans (the backends of a postmaster killed with
// -9, the children of a dead pg_basebackup) are re-parented to PID 1 and must be reaped,
// or they stay zombies. A PID 1 that reaps with wait(-1) also steals the exit statuses of
// the children it starts itself (postgres, initdb, pg_basebackup, pg_rewind ...): their
// exec.Cmd.Wait then fails with "no child processes". So PID 1 is split in two, as tini
// and dumb-init do: a minimal init that only starts the agent again as its one child,
// forwards signals to it and reaps everything, and the agent proper, which is not PID 1
// and waits for its own children undisturbed.

// Forwarded are the signals the init passes on to the agent: those the agent handles, a
// clean stop (what the kubelet, a container runtime or a person sends). Any other signal
// to the container's PID 1 is dropped: the kernel does not let an unhandled signal kill
// PID 1, and passed on it would kill the agent (Go's default for SIGHUP, SIGUSR1/2,
// SIGQUIT) and leave postgres running without it.
var Forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT}

// Stray are signals the agent receives and ignores, so that one sent to it by mistake
// (a reload habit, kill -HUP) does not end it and leave postgres running without it.
// They are caught, not ignored: an ignored signal stays ignored in the children the
// agent starts (postgres sets its own handlers, but initdb and pg_basebackup would not).
var Stray = []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// RunAsInit makes this process the container's init when it is PID 1: it runs the same
// command line again as its child and returns that child's exit code with ok true once
// the child has exited. When this process is not PID 1 it does nothing and returns ok
// false: the caller is the agent proper.
func RunAsInit() (code int, ok bool) {
	if os.Getpid() != 1 {
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		os.Stderr.WriteString("agent init: finding the agent binary: " + err.Error() + "\n")
		return 1, true
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, Forwarded...)
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		os.Stderr.WriteString("agent init: starting the agent: " + err.Error() + "\n")
		return 1, true
	}
	child := cmd.Process.Pid
	go func() {
		for s := range sigs {
			_ = syscall.Kill(child, s.(syscall.Signal))
		}
	}()
	return reapUntil(child), true
}

// reapUntil reaps every child until child itself has exited, and returns its exit code
// (128 + the signal when a signal ended it, as a shell reports it).
func reapUntil(child int) int {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for, the child among it.
			return 1
		}
		if pid != child {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}
