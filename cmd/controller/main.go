// Command controller runs pgpilot's Go controllers next to the Helm manager, for what the
// chart cannot express (internal/operator/controller wires them): credentials, failover and
// switchover (the primary Lease), backups and their schedule and retention, the rolling
// update order, and the PostgresCluster's status.
package main

import (
	"context"
	"flag"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/logging"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/election"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
)

// stepDownTenure is how long a leader leads before it may step down.
const stepDownTenure = 10 * time.Second

func main() {
	var f managerflags.Flags
	// The leader-election Lease keeps the name of when this process was called the
	// sidecar: during an upgrade the old pod and the new one must contend for the same
	// Lease, or two would run failovers at once.
	f.Register(flag.CommandLine, ":8083", ":8082", "pgpilot-sidecar.db.example.com", managerflags.FailoverElection)
	var containerName string
	flag.StringVar(&containerName, "container-name", "controller",
		"Name of this process's container in its pod. A standby replica takes the election Lease over as soon as the kubelet reports the leader's container of this name as not running, instead of waiting for the Lease to expire.")
	var stepDownAfter time.Duration
	flag.DurationVar(&stepDownAfter, "step-down-after", 3*time.Second,
		"How long a leader goes on when no agent of any cluster answers it while their pods are ready: it then steps down (exits) and the standby replica takes over. 0 never steps down.")
	var copts controller.Options
	flag.IntVar(&copts.MaxRollingClusters, "max-rolling-clusters", controller.DefaultMaxRollingClusters,
		"The most clusters whose pods are restarted for a new template at once (a new agent image after an operator upgrade rolls them all); 0 for no limit.")
	flag.Parse()
	ctrl.SetLogger(logging.Deferred(zap.New(zap.UseFlagOptions(&f.Zap))))
	log := ctrl.Log.WithName("setup")

	scheme, err := controller.Scheme()
	if err != nil {
		log.Error(err, "Failed to build the scheme")
		os.Exit(1)
	}
	cfg, err := f.Config()
	if err != nil {
		log.Error(err, "No API server to talk to")
		os.Exit(1)
	}
	// Lead only with warm caches: a restarted container would otherwise resume at once
	// and list every watched kind before its first failover.
	var warm atomic.Bool
	f.LeadOnceReady, copts.Warm = warm.Load, &warm
	opts, err := f.Options(scheme, cfg)
	if err != nil {
		log.Error(err, "Invalid manager settings")
		os.Exit(1)
	}
	limited := controller.CacheOptions()
	limited.DefaultNamespaces = opts.Cache.DefaultNamespaces // WATCH_NAMESPACE
	opts.Cache = limited
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		log.Error(err, "Failed to create the manager")
		os.Exit(1)
	}
	if err := controller.Setup(mgr, clock.RealClock{}, copts); err != nil {
		log.Error(err, "Failed to set up the controllers")
		os.Exit(1)
	}
	dead, err := f.DeadLeader(mgr, containerName)
	if err != nil {
		log.Error(err, "Invalid leader election settings")
		os.Exit(1)
	}
	if dead != nil {
		if err := mgr.Add(dead); err != nil {
			log.Error(err, "Failed to add the dead leader's release")
			os.Exit(1)
		}
	}
	ctx, stop := context.WithCancel(ctrl.SetupSignalHandler())
	defer stop()
	var steppedDown atomic.Bool
	if f.LeaderElect && stepDownAfter > 0 {
		err := mgr.Add(&election.StepDown{
			CutOff: fleet.ProcessReach().CutOff, Answered: fleet.ProcessReach().Answered, After: stepDownAfter, MinTenure: stepDownTenure, Period: f.RetryPeriod,
			Stop: func() { steppedDown.Store(true); stop() }, Log: ctrl.Log.WithName("election"),
		})
		if err != nil {
			log.Error(err, "Failed to add the step-down")
			os.Exit(1)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add the readiness check")
		os.Exit(1)
	}
	log.Info("Starting the controller")
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "The controller stopped")
		os.Exit(1)
	}
	if steppedDown.Load() {
		// The election Lease is released; the container starts again as a standby.
		log.Info("Stepped down")
	}
}
