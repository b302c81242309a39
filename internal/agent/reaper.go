package agent

import (
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The agent is PID 1 of its container: orphans (a backend left behind by a postmaster
// killed with -9, say) are re-parented to it and must be reaped, or they stay zombies.
// Children the agent started itself are reaped by their exec.Cmd.Wait; the reaper only
// reaps pids it does not track, looking with WNOWAIT before it reaps.

var tracked = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// startTracked starts cmd and records its pid before the reaper can look at it.
func startTracked(cmd *exec.Cmd) error {
	tracked.Lock()
	defer tracked.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	tracked.pids[cmd.Process.Pid] = true
	return nil
}

func untrack(cmd *exec.Cmd) {
	tracked.Lock()
	delete(tracked.pids, cmd.Process.Pid)
	tracked.Unlock()
}

// StartReaper reaps orphaned children while the agent runs as PID 1; elsewhere the
// kernel re-parents orphans to the real init and it does nothing.
func StartReaper() {
	if os.Getpid() != 1 {
		return
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		tick := time.NewTicker(10 * time.Second)
		for {
			select {
			case <-sigs:
			case <-tick.C:
			}
			reapOrphans()
		}
	}()
}

func reapOrphans() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		pid := int(siginfoPid(&info))
		if err != nil || pid == 0 {
			return
		}
		tracked.Lock()
		mine := tracked.pids[pid]
		if !mine {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		tracked.Unlock()
		if mine {
			// exec.Cmd.Wait reaps it; look again shortly for other orphans.
			time.Sleep(50 * time.Millisecond)
			return
		}
	}
}

// siginfoPid reads si_pid of a SIGCHLD siginfo_t: the first field of the union that
// follows si_signo, si_errno, si_code and padding (offset 16 on 64-bit Linux).
func siginfoPid(info *unix.Siginfo) int32 {
	return *(*int32)(unsafe.Pointer(uintptr(unsafe.Pointer(info)) + 16))
}
