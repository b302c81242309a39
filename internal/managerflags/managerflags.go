// Package managerflags holds the command-line flags both controller managers share.
package managerflags

import (
	"flag"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/pgpilot/pgpilot/internal/logging"
)

// WatchNamespaceEnv lists the namespaces to watch, comma-separated; empty means all.
const WatchNamespaceEnv = "WATCH_NAMESPACE"

// Flags are the manager settings common to the Helm manager and the sidecar.
type Flags struct {
	MetricsAddr      string
	ProbeAddr        string
	LeaderElect      bool
	LeaderElectionID string
	LeaseDuration    time.Duration
	RenewDeadline    time.Duration
	Zap              zap.Options
}

// Register adds the flags to fs with the given defaults.
func (f *Flags) Register(fs *flag.FlagSet, metricsAddr, probeAddr, leaderElectionID string) {
	fs.StringVar(&f.MetricsAddr, "metrics-bind-address", metricsAddr, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.StringVar(&f.ProbeAddr, "health-probe-bind-address", probeAddr, "Address of the /healthz and /readyz endpoints.")
	fs.BoolVar(&f.LeaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles.")
	fs.StringVar(&f.LeaderElectionID, "leader-election-id", leaderElectionID, "Name of the leader election Lease.")
	fs.DurationVar(&f.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "How long a leader's Lease is valid.")
	fs.DurationVar(&f.RenewDeadline, "leader-election-renew-deadline", 10*time.Second, "How long a leader keeps trying to renew before it gives up.")
	f.Zap = logging.Options()
	f.Zap.BindFlags(fs)
}

// Options returns controller-runtime manager options for these flags, watching the
// namespaces in WATCH_NAMESPACE (all when empty).
func (f *Flags) Options(scheme *runtime.Scheme) manager.Options {
	opts := manager.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: f.MetricsAddr},
		HealthProbeBindAddress:        f.ProbeAddr,
		LeaderElection:                f.LeaderElect,
		LeaderElectionID:              f.LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &f.LeaseDuration,
		RenewDeadline:                 &f.RenewDeadline,
	}
	if ns := WatchNamespaces(os.Getenv(WatchNamespaceEnv)); len(ns) > 0 {
		opts.Cache.DefaultNamespaces = make(map[string]cache.Config, len(ns))
		for _, n := range ns {
			opts.Cache.DefaultNamespaces[n] = cache.Config{}
		}
	}
	return opts
}

// WatchNamespaces splits a comma-separated namespace list, dropping empty entries.
func WatchNamespaces(s string) []string {
	var out []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
