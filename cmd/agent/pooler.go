package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/logging"
	"github.com/pgpilot/pgpilot/internal/pooler"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// runPooler is `agent pooler`: the pooler agent beside PgBouncer (docs/pooler.md).
func runPooler(args []string) error {
	fs := flag.NewFlagSet("pooler", flag.ExitOnError)
	o := pooler.Options{}
	fs.StringVar(&o.Pod, "pod-name", os.Getenv("POD_NAME"), "This pooler's pod name.")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The pod's namespace.")
	pool := fs.String("pool", "rw", "Which pool: rw (follows the primary Lease) or ro (the cluster's -ro Service).")
	fs.StringVar(&o.ConfigFile, "config", env("PGPILOT_CONFIG", "/etc/pgpilot/config/config.json"), "The cluster's config.json.")
	fs.StringVar(&o.RunDir, "run-dir", "/run/pgbouncer", "Where the agent writes PgBouncer's files, and PgBouncer its Unix socket.")
	fs.IntVar(&o.Port, "port", 5432, "Where PgBouncer listens for clients.")
	fs.StringVar(&o.APIAddr, "api-address", fmt.Sprintf(":%d", agentapi.Port), "Address of the pooler agent's HTTPS API.")
	fs.StringVar(&o.TLSDir, "tls", "/etc/pgpilot/tls/pooler", "The pooler's certificate (tls.crt, tls.key), served to clients and on the API; empty for none (tests).")
	fs.StringVar(&o.ClientTLSDir, "client-tls", "/etc/pgpilot/tls/client", "The client certificate PgBouncer logs in to the instances with (tls.crt, tls.key); empty for none (tests).")
	fs.StringVar(&o.ServerCA, "server-ca", "/etc/pgpilot/tls/server-ca/ca.crt", "The CA that verifies the instances' certificates; empty to encrypt without verifying (tests).")
	authDir := fs.String("auth", "/etc/pgpilot/agent", "Directory of the agent API's credentials (the Secret <cluster>-agent-auth).")
	fs.StringVar(&o.PgBouncer, "pgbouncer", "", "PgBouncer's program (default: pgbouncer on PATH, else /usr/sbin/pgbouncer).")
	fs.DurationVar(&o.Linger, "linger", 5*time.Second, "How long a stopping pooler keeps serving, not ready, while the Services drop it.")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", 20*time.Second, "How long PgBouncer's safe shutdown may wait for the transactions in flight.")
	peers := fs.String("peers", "", "pod=host,... overrides for reaching the instances (tests); default <pod>.<headless Service>.<namespace>.svc.")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for reading the primary Lease; in-cluster config when empty.")
	zopts := logging.Options()
	zopts.BindFlags(fs)
	_ = fs.Parse(args)
	log := logging.Deferred(zap.New(zap.UseFlagOptions(&zopts)).WithValues("pod", o.Pod))
	ctrl.SetLogger(log)
	o.Log = log

	if o.Pod == "" || o.Namespace == "" {
		return fmt.Errorf("the pod name and namespace are required (POD_NAME and POD_NAMESPACE, or --pod-name and --namespace)")
	}
	switch *pool {
	case "rw":
	case "ro":
		o.ReadOnly = true
	default:
		return fmt.Errorf("--pool %q: want rw or ro", *pool)
	}
	if o.PgBouncer == "" {
		o.PgBouncer = "/usr/sbin/pgbouncer"
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			o.PgBouncer = p
		}
	}
	var err error
	if o.Kube, err = kubeClient(*kubeconfig); err != nil {
		return err
	}
	if *peers != "" {
		hosts := parsePeers(*peers)
		o.Address = func(pod string) string { return hosts[pod] }
	}
	o.Credentials = &agentapi.MountedCredentials{Dir: *authDir}
	o.Registry = prometheus.NewRegistry()
	o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("Pooler agent starting", "pool", *pool, "pgbouncer", o.PgBouncer, "api", o.APIAddr)
	return pooler.Run(ctx, o)
}
