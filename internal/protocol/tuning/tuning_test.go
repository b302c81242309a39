package tuning_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

// The rule, for the sizes users run: every figure checked by hand.
func TestSettings(t *testing.T) {
	cases := []struct {
		name  string
		r     tuning.Resources
		conns int
		want  map[string]string
	}{
		{"nothing known: PostgreSQL's defaults but for the volumes' I/O", tuning.Resources{}, 100,
			map[string]string{"effective_io_concurrency": "200"}},
		{"2Gi and 1 CPU, 100 connections", tuning.Resources{MemoryBytes: 2 * gi, MilliCPU: 1000}, 100, map[string]string{
			"shared_buffers": "512MB", "effective_cache_size": "1536MB", "maintenance_work_mem": "128MB",
			"work_mem":             "3932kB", // (2048 - 512) MB / (4 × 100)
			"max_parallel_workers": "1", "max_parallel_workers_per_gather": "0", "max_parallel_maintenance_workers": "0",
			"autovacuum_max_workers": "3", "effective_io_concurrency": "200",
		}},
		{"16Gi and 4.5 CPUs, 200 connections", tuning.Resources{MemoryBytes: 16 * gi, MilliCPU: 4500}, 200, map[string]string{
			"shared_buffers": "4096MB", "effective_cache_size": "12288MB", "maintenance_work_mem": "1024MB",
			"work_mem":             "15728kB", // 12288 MB / (4 × 200) = 15.36 MB
			"max_parallel_workers": "5", "max_parallel_workers_per_gather": "2", "max_parallel_maintenance_workers": "2",
			"autovacuum_max_workers": "3", "effective_io_concurrency": "200",
		}},
		{"256Gi and 64 CPUs", tuning.Resources{MemoryBytes: 256 * gi, MilliCPU: 64000}, 100, map[string]string{
			"shared_buffers": "65536MB", "effective_cache_size": "196608MB", "maintenance_work_mem": "2048MB", "work_mem": "491MB",
			"max_parallel_workers": "8", "max_parallel_workers_per_gather": "4", "max_parallel_maintenance_workers": "4",
			"autovacuum_max_workers": "6", "effective_io_concurrency": "200",
		}},
		{"a tiny 48Mi: the floors", tuning.Resources{MemoryBytes: 48 * mi}, 100, map[string]string{
			"shared_buffers": "16MB", "effective_cache_size": "36MB", "maintenance_work_mem": "16MB", "work_mem": "1MB",
			"effective_io_concurrency": "200",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tuning.Settings(tc.r, tc.conns)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// What cannot fit is refused, saying what to do; what can is not.
func TestCheck(t *testing.T) {
	limit := tuning.Resources{MemoryBytes: 2 * gi, MemoryLimitBytes: 2 * gi}
	cases := []struct {
		name   string
		r      tuning.Resources
		params map[string]string
		want   string
	}{
		{"shared_buffers above the limit", limit, map[string]string{"shared_buffers": "200GB"},
			"shared_buffers 200GB does not fit in the memory limit 2048MB (spec.resources.limits.memory): postgres would be killed once its buffers fill; lower it (without it pgpilot sets a quarter of the memory, 512MB), or raise the limit"},
		{"shared_buffers at the limit, in pages", limit, map[string]string{"SHARED_BUFFERS": "262144"}, "does not fit in the memory limit"},
		{"shared_buffers that fits", limit, map[string]string{"shared_buffers": "1GB"}, ""},
		{"shared_buffers and no limit: only a request", tuning.Resources{MemoryBytes: gi}, map[string]string{"shared_buffers": "200GB"}, ""},
		{"shared_buffers in a unit PostgreSQL does not know", limit, map[string]string{"shared_buffers": "1gb"}, `unit "gb" is not B, kB, MB, GB or TB`},
		{"max_connections 3", tuning.Resources{}, map[string]string{"max_connections": "3"},
			"max_connections 3 leaves no room for pgpilot's agent (up to 8 sessions) beside the 3 reserved for superusers (superuser_reserved_connections, reserved_connections): set at least 12"},
		{"max_connections 12", tuning.Resources{}, map[string]string{"max_connections": "12"}, ""},
		{"max_connections 20 with 15 reserved", tuning.Resources{}, map[string]string{"max_connections": "20", "superuser_reserved_connections": "10", "reserved_connections": "5"},
			"set at least 24"},
		{"max_connections lots", tuning.Resources{}, map[string]string{"max_connections": "lots"}, `max_connections "lots" is not a whole number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tuning.Check(tc.r, tc.params)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Check = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	for v, want := range map[string]int64{"128MB": 128 * mi, "16384": 128 * mi, "1.5GB": 3 * gi / 2, " 64 kB ": 64 << 10, "1TB": 1024 * gi, "8192B": 8192} {
		got, err := tuning.ParseMemory(v, 8<<10)
		if err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"", "lots", "-1MB", "5 MiB"} {
		if _, err := tuning.ParseMemory(v, 8<<10); err == nil {
			t.Errorf("ParseMemory(%q) read it", v)
		}
	}
}
