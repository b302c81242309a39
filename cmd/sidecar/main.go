// Command sidecar runs pgpilot's Go controllers next to the Helm manager, for what the
// chart cannot express (internal/sidecar wires them): credentials, failover and
// switchover (the primary Lease), backups and their schedule and retention, the rolling
// update order, and the PostgresCluster's status.
package main

import (
	"flag"
	"os"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/managerflags"
	"github.com/pgpilot/pgpilot/internal/sidecar"
)

func main() {
	var f managerflags.Flags
	f.Register(flag.CommandLine, ":8083", ":8082", "pgpilot-sidecar.db.example.com")
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.Zap)))
	log := ctrl.Log.WithName("setup")

	scheme, err := sidecar.Scheme()
	if err != nil {
		log.Error(err, "Failed to build the scheme")
		os.Exit(1)
	}
	cfg := ctrl.GetConfigOrDie()
	opts, err := f.Options(scheme, cfg)
	if err != nil {
		log.Error(err, "Invalid manager settings")
		os.Exit(1)
	}
	opts.Cache.ByObject = sidecar.CacheOptions().ByObject
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		log.Error(err, "Failed to create the manager")
		os.Exit(1)
	}
	if err := sidecar.Setup(mgr, clock.RealClock{}); err != nil {
		log.Error(err, "Failed to set up the controllers")
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
	log.Info("Starting the sidecar")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "The sidecar stopped")
		os.Exit(1)
	}
}
