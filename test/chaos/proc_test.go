//go:build chaos

package chaos

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The suite runs as root in the node's PID namespace (hack/chaos/run.sh runs it
// through hack/localcluster/exec.sh), so it sees every container's processes in /proc.
// The kubelet (cgroupfs driver) puts a pod's containers in cgroups
// .../pod<uid>/<container id> in every hierarchy; that is how a pod's and a
// container's processes are told from the others.

// procs returns the processes whose cgroup path contains every one of parts.
func procs(parts ...string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		match := true
		for _, part := range parts {
			match = match && strings.Contains(string(cg), part)
		}
		if match {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// podProcs returns every process of every container of pod, its sandbox's included.
func podProcs(p corev1.Pod) ([]int, error) {
	uid := string(p.UID)
	a, err := procs("pod" + uid + "/")
	if err != nil || len(a) > 0 {
		return a, err
	}
	// The systemd driver's spelling, should the node ever use it.
	return procs("pod" + strings.ReplaceAll(uid, "-", "_"))
}

// containerInit returns the PID, as the node sees it, of PID 1 of pod's container
// name: the process of the container's cgroup that is PID 1 in its own PID namespace.
func containerInit(p corev1.Pod, name string) (int, error) {
	id, err := containerID(p, name)
	if err != nil {
		return 0, err
	}
	pids, err := procs("pod"+string(p.UID)+"/", id)
	if err != nil {
		return 0, err
	}
	for _, pid := range pids {
		if nsPID(pid) == 1 {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no PID 1 among the %d processes of container %s/%s (%s)", len(pids), p.Name, name, id)
}

// nsPID returns pid's number in its innermost PID namespace (0 when unknown).
func nsPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(line, "NSpid:"); ok {
			fields := strings.Fields(f)
			if len(fields) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(fields[len(fields)-1])
			return n
		}
	}
	return 0
}

// sandboxProcs returns the processes of pod's sandbox (the pause process: those of the
// pod's cgroup that belong to none of its containers) and the others. It fails when
// there is no sandbox process, or a container has no ID yet.
func sandboxProcs(p corev1.Pod) (sandbox, others []int, err error) {
	pids, err := podProcs(p)
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	for _, cs := range p.Status.ContainerStatuses {
		id, err := containerID(p, cs.Name)
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
	}
	for _, pid := range pids {
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(string(cg), id) }) {
			others = append(others, pid)
		} else {
			sandbox = append(sandbox, pid)
		}
	}
	if len(sandbox) == 0 {
		return nil, others, fmt.Errorf("no sandbox process among the %d processes of pod %s", len(pids), p.Name)
	}
	return sandbox, others, nil
}

// clientSources returns the addresses the suite's connections to a pod come from: the
// source the node's routes choose for the pod's own address (the probe's) and for the
// Service address service (the writers'), where kube-proxy may masquerade the latter
// to the first. A UDP socket only asks the routes; nothing is sent.
func clientSources(podIP, service string) ([]string, error) {
	var out []string
	for _, to := range []string{podIP, service} {
		c, err := net.Dial("udp", net.JoinHostPort(to, "5432"))
		if err != nil {
			return nil, fmt.Errorf("the node's source address towards %s: %w", to, err)
		}
		ip := c.LocalAddr().(*net.UDPAddr).IP.String()
		c.Close()
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out, nil
}

// killContainer sends SIGKILL to PID 1 of pod's container name. The kernel then kills
// every process of the container's PID namespace, and the kubelet restarts it in the
// same pod.
func killContainer(p corev1.Pod, name string) (int, error) {
	pid, err := containerInit(p, name)
	if err != nil {
		return 0, err
	}
	return pid, syscall.Kill(pid, syscall.SIGKILL)
}

// postmasters returns the PIDs of the postmasters of pod: its postgres processes whose
// parent is not postgres.
func postmasters(p corev1.Pod) ([]int, error) {
	pids, err := podProcs(p)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, pid := range pids {
		if comm(pid) == "postgres" && comm(ppid(pid)) != "postgres" {
			out = append(out, pid)
		}
	}
	return out, nil
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// stat returns the fields of /proc/<pid>/stat after the command name: state, ppid, ...
func stat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	// The command name may hold spaces and parentheses: read after the last ')'.
	return strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
}

func ppid(pid int) int {
	f := stat(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// stopped reports whether pid is stopped by a signal (state T), gone, or a zombie (Z,
// X): a backend that exited after its postmaster was stopped stays a zombie until the
// postmaster runs again to reap it, and no signal changes that.
func stopped(pid int) bool {
	f := stat(pid)
	return len(f) == 0 || f[0] == "T" || f[0] == "Z" || f[0] == "X"
}

// freeze sends SIGSTOP to every process of pod until none is left running: a process
// may fork between the listing and the signal (postgres starting a backend), so it
// lists again until a listing finds only stopped ones. It returns every process it
// stopped, for thaw.
func freeze(p corev1.Pod) ([]int, error) {
	seen := map[int]bool{}
	var all []int
	// A process in uninterruptible sleep (a slow fsync) stops only once it leaves it,
	// which can take seconds on a loaded machine.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		pids, err := podProcs(p)
		if err != nil {
			return all, err
		}
		running := 0
		for _, pid := range pids {
			if !seen[pid] {
				seen[pid] = true
				all = append(all, pid)
			}
			if !stopped(pid) {
				running++
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if len(pids) == 0 {
			return all, fmt.Errorf("pod %s has no processes", p.Name)
		}
		if running == 0 {
			return all, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return all, fmt.Errorf("processes of pod %s kept running through 10 s of SIGSTOP", p.Name)
}

// thaw sends SIGCONT to pids and to every process of pod now.
func thaw(p corev1.Pod, pids []int) {
	now, _ := podProcs(p)
	for _, pid := range append(pids, now...) {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// netns is a pod's network namespace, held open so that rules are removed from the
// namespace they were added to even if the process it was found through is gone.
type netns struct{ f *os.File }

func podNetns(p corev1.Pod) (*netns, error) {
	pids, err := podProcs(p)
	if err != nil {
		return nil, err
	}
	for _, pid := range pids {
		if f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil {
			return &netns{f}, nil
		}
	}
	return nil, fmt.Errorf("pod %s has no process to find its network namespace through", p.Name)
}

func (n *netns) close() { n.f.Close() }

// iptables runs iptables with args in the namespace.
func (n *netns) iptables(args ...string) error {
	cmd := exec.Command("nsenter", append([]string{"--net=/proc/self/fd/3", "--", "iptables", "-w"}, args...)...)
	cmd.ExtraFiles = []*os.File{n.f}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// rule is one iptables rule: a chain and its match and target.
type rule struct {
	chain string
	spec  []string
}

// insert adds rules first in their chains and returns those it added; remove deletes
// them. remove goes on past a failure and returns the first.
func (n *netns) insert(rules []rule) ([]rule, error) {
	for i, r := range rules {
		if err := n.iptables(append([]string{"-I", r.chain, "1"}, r.spec...)...); err != nil {
			return rules[:i], err
		}
	}
	return rules, nil
}

func (n *netns) remove(rules []rule) error {
	var first error
	for _, r := range rules {
		if err := n.iptables(append([]string{"-D", r.chain}, r.spec...)...); err != nil && first == nil {
			first = err
		}
	}
	return first
}
