package managerflags_test

import (
	"flag"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/pgpilot/pgpilot/internal/managerflags"
)

func TestWatchNamespaces(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []string
	}{
		{"empty means all", "", nil},
		{"one", "a", []string{"a"}},
		{"several", "a,b,c", []string{"a", "b", "c"}},
		{"blanks and empty entries dropped", " a, ,b ", []string{"a", "b"}},
		{"only separators", " , ,", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, managerflags.WatchNamespaces(tc.in)); diff != "" {
				t.Errorf("WatchNamespaces(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestOptionsWatchNamespaces(t *testing.T) {
	cases := []struct {
		name string
		env  string
		want map[string]cache.Config
	}{
		{"unset watches all", "", nil},
		{"blank watches all", " , ", nil},
		{"one", "db", map[string]cache.Config{"db": {}}},
		{"several", "db, team-a ,team-b", map[string]cache.Config{"db": {}, "team-a": {}, "team-b": {}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(managerflags.WatchNamespaceEnv, tc.env)
			var f managerflags.Flags
			opts := f.Options(nil)
			// cmp tells a nil map (all namespaces) from an empty one.
			if diff := cmp.Diff(tc.want, opts.Cache.DefaultNamespaces); diff != "" {
				t.Errorf("Cache.DefaultNamespaces (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOptionsFromFlags(t *testing.T) {
	t.Setenv(managerflags.WatchNamespaceEnv, "")
	var f managerflags.Flags
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	f.Register(fs, ":8080", ":8081", "pgpilot-sidecar")
	if err := fs.Parse([]string{"--leader-elect", "--metrics-bind-address=0", "--leader-election-lease-duration=30s"}); err != nil {
		t.Fatal(err)
	}
	opts := f.Options(nil)
	type settings struct {
		Metrics, Probe, LeaderElectionID string
		LeaderElection, ReleaseOnCancel  bool
		LeaseDuration, RenewDeadline     time.Duration
	}
	want := settings{
		Metrics: "0", Probe: ":8081", LeaderElectionID: "pgpilot-sidecar",
		LeaderElection: true, ReleaseOnCancel: true,
		LeaseDuration: 30 * time.Second, RenewDeadline: 10 * time.Second,
	}
	got := settings{
		Metrics: opts.Metrics.BindAddress, Probe: opts.HealthProbeBindAddress, LeaderElectionID: opts.LeaderElectionID,
		LeaderElection: opts.LeaderElection, ReleaseOnCancel: opts.LeaderElectionReleaseOnCancel,
	}
	if opts.LeaseDuration != nil {
		got.LeaseDuration = *opts.LeaseDuration
	}
	if opts.RenewDeadline != nil {
		got.RenewDeadline = *opts.RenewDeadline
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}
