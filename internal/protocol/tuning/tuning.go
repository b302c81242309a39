// Package tuning is how pgpilot sizes PostgreSQL's memory and parallelism from an
// instance's resources, and what it refuses because it cannot fit them. The plan
// checks a spec with it and passes the resources to the agents in config.json; each
// agent writes the settings into postgresql.conf under the user's parameters, which
// win (docs/tuning.md).
//
// PostgreSQL's defaults fit a 1990s server: 128MB of shared_buffers whether the
// container has 512Mi or 64Gi, 4MB of work_mem whatever max_connections is. The rule
// here is the one the community's guides give, kept simple enough to check by hand.
package tuning

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Resources are what an instance's postgres container may use.
type Resources struct {
	// MemoryBytes is the memory limit, else the request; 0 when neither is set.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// MilliCPU is the CPU limit, else the request, in thousandths of a CPU; 0 when
	// neither is set.
	MilliCPU int64 `json:"milliCPU,omitempty"`
	// MemoryLimitBytes is the memory limit alone: past it the kernel kills postgres.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
}

const (
	kB = 1024
	mB = 1024 * kB
	gB = 1024 * mB
)

// DefaultMaxConnections is PostgreSQL's max_connections when none is set.
const DefaultMaxConnections = 100

// AgentSessions is how many sessions the agent may hold at once: its pool's six, the
// metrics' one and one more to confirm a reload (internal/instance/pgsql).
const AgentSessions = 8

// Settings are the settings tuned from r for a server that allows maxConnections:
//
//   - shared_buffers: a quarter of the memory (16MB at least);
//   - effective_cache_size: three quarters of it (what the planner may assume the
//     kernel caches, shared_buffers included);
//   - maintenance_work_mem: a sixteenth, between 16MB and 2GB (VACUUM, CREATE INDEX);
//   - work_mem: what shared_buffers leaves, shared by four sorts or hashes per
//     connection, between 1MB and 1GB;
//   - max_parallel_workers: one per CPU (max_worker_processes stays 8, a setting
//     standbys must match); max_parallel_workers_per_gather and
//     max_parallel_maintenance_workers: half the CPUs, at most 4; 0 with one CPU;
//   - autovacuum_max_workers: half the CPUs, between 3 and 6;
//   - effective_io_concurrency: 200, for the network and solid-state volumes
//     containers run on (PostgreSQL's 1 assumes a single spinning disk).
//
// Without a memory or a CPU figure its settings are left to PostgreSQL's defaults.
func Settings(r Resources, maxConnections int) map[string]string {
	out := map[string]string{"effective_io_concurrency": "200"}
	if m := r.MemoryBytes; m > 0 {
		shared := max(m/4, 16*mB)
		out["shared_buffers"] = Memory(shared)
		out["effective_cache_size"] = Memory(m * 3 / 4)
		out["maintenance_work_mem"] = Memory(clamp(m/16, 16*mB, 2*gB))
		conns := int64(max(maxConnections, 1))
		out["work_mem"] = Memory(clamp((m-shared)/(4*conns), mB, gB))
	}
	if r.MilliCPU > 0 {
		cpus := int64(math.Ceil(float64(r.MilliCPU) / 1000))
		half := cpus / 2
		out["max_parallel_workers"] = strconv.FormatInt(min(cpus, 8), 10)
		out["max_parallel_workers_per_gather"] = strconv.FormatInt(min(half, 4), 10)
		out["max_parallel_maintenance_workers"] = strconv.FormatInt(min(half, 4), 10)
		out["autovacuum_max_workers"] = strconv.FormatInt(clamp(half, 3, 6), 10)
	}
	return out
}

// Check says what of params cannot fit r, nil when all can: shared_buffers at or above
// the memory limit (postgres would be killed as soon as its buffers fill), and
// max_connections too low for the agent's sessions beside those reserved for
// superusers.
func Check(r Resources, params map[string]string) error {
	var problems []string
	if v, ok := lookup(params, "shared_buffers"); ok && r.MemoryLimitBytes > 0 {
		b, err := ParseMemory(v, 8*kB)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("shared_buffers %q: %v", v, err))
		case b >= r.MemoryLimitBytes:
			problems = append(problems, fmt.Sprintf("shared_buffers %s does not fit in the memory limit %s (spec.resources.limits.memory): "+
				"postgres would be killed once its buffers fill; lower it (without it pgpilot sets a quarter of the memory, %s), or raise the limit",
				v, Memory(r.MemoryLimitBytes), Memory(max(r.MemoryLimitBytes/4, 16*mB))))
		}
	}
	if v, ok := lookup(params, "max_connections"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Sprintf("max_connections %q is not a whole number", v))
		} else if least := MinConnections(params); n < least {
			problems = append(problems, fmt.Sprintf("max_connections %d leaves no room for pgpilot's agent (up to %d sessions) beside the %d reserved for superusers "+
				"(superuser_reserved_connections, reserved_connections): set at least %d", n, AgentSessions, least-AgentSessions-1, least))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("spec.postgresql.parameters: %s", strings.Join(problems, "; "))
	}
	return nil
}

// MinConnections is the least max_connections params may set: the reserved
// connections, the agent's sessions and one for a client.
func MinConnections(params map[string]string) int {
	reserved := 3 // superuser_reserved_connections' default
	if v, ok := lookup(params, "superuser_reserved_connections"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			reserved = n
		}
	}
	if v, ok := lookup(params, "reserved_connections"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			reserved += n
		}
	}
	return reserved + AgentSessions + 1
}

// MaxConnections is params' max_connections, DefaultMaxConnections when it has none
// that reads.
func MaxConnections(params map[string]string) int {
	if v, ok := lookup(params, "max_connections"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			return n
		}
	}
	return DefaultMaxConnections
}

// lookup finds a setting in params whatever its case, as PostgreSQL does.
func lookup(params map[string]string, name string) (string, bool) {
	for k, v := range params {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// units are PostgreSQL's memory units.
var units = map[string]int64{"B": 1, "kB": kB, "MB": mB, "GB": gB, "TB": 1024 * gB}

// ParseMemory reads a memory setting as PostgreSQL does: a number with a unit (B, kB,
// MB, GB, TB; case matters), or without one in the setting's own unit (8kB pages for
// shared_buffers).
func ParseMemory(v string, unit int64) (int64, error) {
	s := strings.TrimSpace(v)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, suffix := s, ""
	if i >= 0 {
		num, suffix = s[:i], strings.TrimSpace(s[i:])
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a memory size: a number with B, kB, MB, GB or TB")
	}
	if suffix != "" {
		u, ok := units[suffix]
		if !ok {
			return 0, fmt.Errorf("unit %q is not B, kB, MB, GB or TB", suffix)
		}
		unit = u
	}
	return int64(n * float64(unit)), nil
}

// Memory writes b as PostgreSQL reads it: in MB when it is whole MB, else in kB.
func Memory(b int64) string {
	if b%mB == 0 || b >= 64*mB {
		return strconv.FormatInt(b/mB, 10) + "MB"
	}
	return strconv.FormatInt(b/kB, 10) + "kB"
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
