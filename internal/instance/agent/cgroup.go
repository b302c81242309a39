package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// What the kernel says of this container's memory: the agent and postgres run in the
// pod's container, whose memory cgroup is mounted at /sys/fs/cgroup (cgroup v2) or
// /sys/fs/cgroup/memory (v1).

// oomKills is how many processes the kernel's OOM killer killed in this container's
// memory cgroup (memory.events with cgroup v2, memory.oom_control with v1); known is
// false when neither can be read.
func oomKills() (n int64, known bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"} {
		if v, ok := fieldOf(path, "oom_kill"); ok {
			return v, true
		}
	}
	return 0, false
}

// memoryOf is the memory this container can use: its cgroup's limit (memory.max with
// v2, memory.limit_in_bytes with v1), or the machine's (MemTotal) when it has none or
// that is less; limited says which. 0 when neither can be read.
func memoryOf() (bytes int64, limited bool) {
	if kB, ok := fieldOf("/proc/meminfo", "MemTotal:"); ok {
		bytes = kB << 10
	}
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// "max", or a v1 limit rounded down from 2^63: none.
		if limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && (bytes == 0 || limit < bytes) {
			return limit, true
		}
		break
	}
	return bytes, false
}

// fieldOf is the number after name on the line of the file at path that starts with
// it.
func fieldOf(path, name string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == name {
			if v, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}
