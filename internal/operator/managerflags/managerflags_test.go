package managerflags_test

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
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
			opts, err := f.Options(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			// cmp tells a nil map (all namespaces) from an empty one.
			if diff := cmp.Diff(tc.want, opts.Cache.DefaultNamespaces); diff != "" {
				t.Errorf("Cache.DefaultNamespaces (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOptionsFromFlags(t *testing.T) {
	t.Setenv(managerflags.WatchNamespaceEnv, "")
	t.Setenv(managerflags.PodNameEnv, "")
	f := parse(t, "--leader-elect", "--metrics-bind-address=0", "--leader-election-lease-duration=30s")
	opts, err := f.Options(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.LeaderElectionResourceLockInterface != nil {
		t.Errorf("without $%s the lock is controller-runtime's default, got one for %q", managerflags.PodNameEnv, opts.LeaderElectionResourceLockInterface.Identity())
	}
	type settings struct {
		Metrics, Probe, LeaderElectionID string
		LeaderElection, ReleaseOnCancel  bool
		LeaseDuration, RenewDeadline     time.Duration
		RetryPeriod                      time.Duration
	}
	want := settings{
		Metrics: "0", Probe: ":8081", LeaderElectionID: "pgpilot-controller",
		LeaderElection: true, ReleaseOnCancel: true,
		LeaseDuration: 30 * time.Second, RenewDeadline: 2500 * time.Millisecond, RetryPeriod: 500 * time.Millisecond,
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
	if opts.RetryPeriod != nil {
		got.RetryPeriod = *opts.RetryPeriod
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
}

func TestLeaderElectionIdentityIsThePodName(t *testing.T) {
	t.Setenv(managerflags.PodNameEnv, "pgpilot-controller-manager-7d9f-abcde")
	t.Setenv(managerflags.PodNamespaceEnv, "pgpilot-system")
	f := parse(t, "--leader-elect")
	opts, err := f.Options(nil, &rest.Config{Host: "https://127.0.0.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	lock := opts.LeaderElectionResourceLockInterface
	if lock == nil {
		t.Fatal("no lock of its own: a restarted container would wait for its own Lease to expire")
	}
	if got, want := lock.Identity(), "pgpilot-controller-manager-7d9f-abcde"; got != want {
		t.Errorf("identity %q, want the pod's name %q", got, want)
	}
	if got, want := lock.Describe(), "pgpilot-system/pgpilot-controller"; got != want {
		t.Errorf("lock %q, want %q", got, want)
	}

	// Without a namespace, and not in a pod, it says what is missing.
	t.Setenv(managerflags.PodNamespaceEnv, "")
	if _, err := f.Options(nil, &rest.Config{Host: "https://127.0.0.1:6443"}); err == nil || !strings.Contains(err.Error(), managerflags.PodNamespaceEnv) {
		t.Errorf("without a namespace: got %v, want an error naming $%s", err, managerflags.PodNamespaceEnv)
	}
}

// parse registers the flags with the controller's defaults, as cmd/controller does, and parses args.
func parse(t *testing.T, args ...string) *managerflags.Flags {
	t.Helper()
	var f managerflags.Flags
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	f.Register(fs, ":8080", ":8081", "pgpilot-controller", managerflags.FailoverElection)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestElectionsAreValid checks what client-go's leader elector refuses at start
// (leaderelection.NewLeaderElector): a Lease longer than the renew deadline, and a
// renew deadline longer than a jittered retry. A leader also stops (RetryPeriod +
// RenewDeadline after its last renewal, at the latest) no later than a standby may
// take over (LeaseDuration after the last renewal it saw).
func TestElectionsAreValid(t *testing.T) {
	for name, e := range map[string]managerflags.Election{"helm": managerflags.HelmElection, "failover": managerflags.FailoverElection} {
		if e.LeaseDuration <= e.RenewDeadline {
			t.Errorf("%s: lease duration %s not above the renew deadline %s", name, e.LeaseDuration, e.RenewDeadline)
		}
		if e.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(e.RetryPeriod)) {
			t.Errorf("%s: renew deadline %s not above %.1f retry periods of %s", name, e.RenewDeadline, leaderelection.JitterFactor, e.RetryPeriod)
		}
		if e.RetryPeriod+e.RenewDeadline > e.LeaseDuration {
			t.Errorf("%s: a leader may lead until %s after its last renewal, past the lease duration %s", name, e.RetryPeriod+e.RenewDeadline, e.LeaseDuration)
		}
	}
}
