// Command manager is pgpilot's Helm manager: it renders helm-charts/postgrescluster for
// every PostgresCluster, as watches.yaml says.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/logging"
	"github.com/pgpilot/pgpilot/internal/operator/helmmanager"
	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
)

func main() {
	var f managerflags.Flags
	f.Register(flag.CommandLine, ":8080", ":8081", "pgpilot-manager.db.example.com", managerflags.HelmElection)
	opts := helmmanager.DefaultOptions()
	flag.StringVar(&opts.WatchesFile, "watches-file", opts.WatchesFile, "Path of watches.yaml.")
	flag.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", opts.MaxConcurrentReconciles, "Concurrent reconciles per watch, where watches.yaml does not set maxConcurrentReconciles.")
	flag.DurationVar(&opts.ReconcilePeriod, "reconcile-period", opts.ReconcilePeriod, "Resync period, where watches.yaml does not set reconcilePeriod.")
	flag.IntVar(&opts.MaxReleaseHistory, "max-release-history", opts.MaxReleaseHistory, "Helm release revisions kept per cluster.")
	flag.Parse()
	ctrl.SetLogger(logging.Deferred(zap.New(zap.UseFlagOptions(&f.Zap))))
	log := ctrl.Log.WithName("setup")

	scheme, err := helmmanager.Scheme()
	if err != nil {
		log.Error(err, "Failed to build the scheme")
		os.Exit(1)
	}
	cfg, err := f.Config()
	if err != nil {
		log.Error(err, "No API server to talk to")
		os.Exit(1)
	}
	mopts, err := f.Options(scheme, cfg)
	if err != nil {
		log.Error(err, "Invalid manager settings")
		os.Exit(1)
	}
	limited := helmmanager.CacheOptions()
	limited.DefaultNamespaces = mopts.Cache.DefaultNamespaces // WATCH_NAMESPACE
	mopts.Cache = limited
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		log.Error(err, "Failed to create the manager")
		os.Exit(1)
	}
	if _, err := helmmanager.Setup(mgr, opts); err != nil {
		log.Error(err, "Failed to set up the Helm reconcilers")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add the readiness check")
		os.Exit(1)
	}
	log.Info("Starting the Helm manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "The Helm manager stopped")
		os.Exit(1)
	}
}
