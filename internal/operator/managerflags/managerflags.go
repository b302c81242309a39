// Package managerflags holds the command-line flags both controller managers share.
package managerflags

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/pgpilot/pgpilot/internal/logging"
	"github.com/pgpilot/pgpilot/internal/operator/election"
)

// WatchNamespaceEnv lists the namespaces to watch, comma-separated; empty means all.
const WatchNamespaceEnv = "WATCH_NAMESPACE"

// The downward API's pod name and namespace (config/manager): the default leader
// election identity and namespace.
const (
	PodNameEnv      = "POD_NAME"
	PodNamespaceEnv = "POD_NAMESPACE"
)

// serviceAccountNamespace is where a pod finds its namespace without the downward API.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Flags are the manager settings common to the Helm manager and the controller.
type Flags struct {
	MetricsAddr string
	ProbeAddr   string
	// PprofAddr serves Go's profiles (net/http/pprof) when set.
	PprofAddr        string
	LeaderElect      bool
	LeaderElectionID string
	// LeadOnceReady, when set, holds leader election back (with an Identity) until it
	// returns true.
	LeadOnceReady func() bool
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Identity is this process's name in leader election; "" for controller-runtime's
	// default, the host name plus a random suffix.
	Identity string
	// QPS and Burst bound the process's requests to the API server (client-go's token
	// bucket).
	QPS   float64
	Burst int
	Zap   zap.Options
}

// Default client rate limits. client-go's own, 20 requests a second with bursts of 30,
// capped what one operator could do for a thousand clusters: its credentials alone
// took 27 minutes to make at 1,000 (make bench-scale). The API server's priority and
// fairness protects itself from a busy client; these only keep a runaway loop from
// being one.
const (
	DefaultQPS   = 100
	DefaultBurst = 200
)

// Election is how a process's replicas elect their leader: a leader that cannot renew
// its Lease for RenewDeadline stops, and a standby takes over LeaseDuration after the
// last renewal it saw, trying every RetryPeriod.
type Election struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// HelmElection is the Helm manager's: controller-runtime's defaults. A Helm manager that
// dies delays rendering, never a failover.
var HelmElection = Election{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}

// FailoverElection is the controller's: the failover controller runs in the leader
// alone, so a leader that dies stops failovers until a standby replica takes over, 4 to
// 5 s later (a retry period or two after the Lease expires); a primary that failed with
// it needs T + margin (5 s) before a failover anyway (docs/failover.md, "The operator's
// own availability"). A leader whose renewals the API server does not take for 2.5 s
// stops before its Lease expires. Its renewals are two writes a second.
var FailoverElection = Election{LeaseDuration: 4 * time.Second, RenewDeadline: 2500 * time.Millisecond, RetryPeriod: 500 * time.Millisecond}

// Register adds the flags to fs with the given defaults.
func (f *Flags) Register(fs *flag.FlagSet, metricsAddr, probeAddr, leaderElectionID string, election Election) {
	fs.StringVar(&f.MetricsAddr, "metrics-bind-address", metricsAddr, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.StringVar(&f.ProbeAddr, "health-probe-bind-address", probeAddr, "Address of the /healthz and /readyz endpoints.")
	fs.StringVar(&f.PprofAddr, "pprof-bind-address", "", "Address to serve Go's profiles on (/debug/pprof/); empty for none.")
	fs.BoolVar(&f.LeaderElect, "leader-elect", false, "Elect a leader so that only one replica reconciles.")
	fs.StringVar(&f.LeaderElectionID, "leader-election-id", leaderElectionID, "Name of the leader election Lease.")
	fs.DurationVar(&f.LeaseDuration, "leader-election-lease-duration", election.LeaseDuration, "How long after its last renewal a leader's Lease may be taken by a standby replica.")
	fs.DurationVar(&f.RenewDeadline, "leader-election-renew-deadline", election.RenewDeadline, "How long a leader keeps trying to renew before it stops leading (and exits).")
	fs.DurationVar(&f.RetryPeriod, "leader-election-retry-period", election.RetryPeriod, "How often a leader renews, and a standby replica tries to take the Lease.")
	fs.StringVar(&f.Identity, "leader-election-identity", os.Getenv(PodNameEnv),
		"Name of this process in leader election (default $"+PodNameEnv+"): a restarted process with the name of the leader takes over at once instead of waiting for the Lease to expire. It must be unique among the running replicas; the pod's name is. Empty: the host name with a random suffix.")
	fs.Float64Var(&f.QPS, "kube-api-qps", DefaultQPS, "Requests a second to the API server at most, on average.")
	fs.IntVar(&f.Burst, "kube-api-burst", DefaultBurst, "Requests to the API server at most in a burst above kube-api-qps.")
	f.Zap = logging.Options()
	f.Zap.BindFlags(fs)
}

// Config is the API server's configuration (the kubeconfig, or the pod's service
// account) with the flags' rate limits.
func (f *Flags) Config() (*rest.Config, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = float32(f.QPS), f.Burst
	return cfg, nil
}

// Options returns controller-runtime manager options for these flags, watching the
// namespaces in WATCH_NAMESPACE (all when empty). cfg is the manager's configuration,
// which the leader election lock of an Identity uses.
func (f *Flags) Options(scheme *runtime.Scheme, cfg *rest.Config) (manager.Options, error) {
	opts := manager.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: f.MetricsAddr},
		HealthProbeBindAddress:        f.ProbeAddr,
		PprofBindAddress:              f.PprofAddr,
		LeaderElection:                f.LeaderElect,
		LeaderElectionID:              f.LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &f.LeaseDuration,
		RenewDeadline:                 &f.RenewDeadline,
		RetryPeriod:                   &f.RetryPeriod,
	}
	if ns := WatchNamespaces(os.Getenv(WatchNamespaceEnv)); len(ns) > 0 {
		opts.Cache.DefaultNamespaces = make(map[string]cache.Config, len(ns))
		for _, n := range ns {
			opts.Cache.DefaultNamespaces[n] = cache.Config{}
		}
	}
	if f.LeaderElect && f.Identity != "" {
		lock, err := f.identityLock(cfg)
		if err != nil {
			return manager.Options{}, err
		}
		opts.LeaderElectionResourceLockInterface = lock
	}
	return opts, nil
}

// identityLock is controller-runtime's default lock (a Lease named LeaderElectionID in
// the pod's namespace, its client bounded by half the renew deadline) with a stable
// identity. controller-runtime names a leader by its host name and a random suffix, so
// a container that restarts after a crash or a kill is a stranger to its own Lease and
// waits out the Lease duration (15 s) before it acts again: the failover of a primary
// that failed meanwhile waits with it. A restarted container that keeps its pod's name
// may resume at once (with LeadOnceReady, once ready). Two processes never share a
// pod's name: the kubelet starts a container again only after its previous instance
// exited, and a pod's name is unique in its namespace while the pod exists.
func (f *Flags) identityLock(cfg *rest.Config) (resourcelock.Interface, error) {
	ns, err := f.lockNamespace()
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, ns, f.LeaderElectionID,
		resourcelock.ResourceLockConfig{Identity: f.Identity}, cfg, f.RenewDeadline)
	if err != nil {
		return nil, fmt.Errorf("the leader election lock: %w", err)
	}
	if f.LeadOnceReady != nil {
		return &readyLock{Interface: lock, ready: f.LeadOnceReady}, nil
	}
	return lock, nil
}

// readyLock is a leader election lock that neither takes nor renews the Lease until
// ready says the process can lead. A restarted container keeps its pod's name, and so
// would resume at once, with cold caches: it would list every watched kind before its
// first failover, while the standby replica had them all. Until it is ready its tries
// fail, the standby may take over (election.DeadLeader sees that the leader's
// container started after it took the Lease), and it leads only once ready.
type readyLock struct {
	resourcelock.Interface
	ready func() bool
}

var errNotReady = errors.New("not ready to lead: the caches have not synced yet")

func (l *readyLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if !l.ready() {
		return errNotReady
	}
	return l.Interface.Create(ctx, r)
}

func (l *readyLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if !l.ready() && r.HolderIdentity != "" { // a release always goes through
		return errNotReady
	}
	return l.Interface.Update(ctx, r)
}

// lockNamespace is where the election Lease of an Identity is: the pod's namespace.
func (f *Flags) lockNamespace() (string, error) {
	if ns := os.Getenv(PodNamespaceEnv); ns != "" {
		return ns, nil
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return "", fmt.Errorf("leader election as %q needs the pod's namespace: set $%s or run in a pod: %w", f.Identity, PodNamespaceEnv, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// DeadLeader is the runnable that lets this replica take over as soon as the kubelet
// reports the leader's container (named container in its pod, as this replica's is) as
// not running, or nil without leader election by pod name: an identity that is no
// pod's names no container to ask about.
func (f *Flags) DeadLeader(mgr manager.Manager, container string) (*election.DeadLeader, error) {
	if !f.LeaderElect || f.Identity == "" {
		return nil, nil
	}
	ns, err := f.lockNamespace()
	if err != nil {
		return nil, err
	}
	return &election.DeadLeader{
		Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(),
		Namespace: ns, Name: f.LeaderElectionID, Identity: f.Identity, Container: container,
		Period: f.RetryPeriod, Elected: mgr.Elected(), Log: mgr.GetLogger().WithName("election"),
	}, nil
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
