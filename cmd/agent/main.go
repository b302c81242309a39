// Command agent is PID 1 of every PostgreSQL container:
//
//	agent install DST                        copy this binary into a shared volume (the init container)
//	agent carry [ROOT] DIR                   copy this image's PostgreSQL into DIR, to run in a newer major's image
//	agent run [flags]                        supervise postgres (as PID 1: a minimal init, then the agent)
//	agent archive-wal [flags] PATH NAME      postgres's archive_command
//	agent restore-wal [flags] NAME PATH      postgres's restore_command
//	agent pooler [flags]                     the pooler agent, beside PgBouncer (docs/pooler.md)
//
// `agent run -h` lists the flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/instance/agent"
	"github.com/pgpilot/pgpilot/internal/instance/carry"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/logging"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: agent install DST | agent carry [ROOT] DIR | agent run [flags] | agent archive-wal [flags] PATH NAME | agent restore-wal [flags] NAME PATH | agent pooler [flags] | agent verify-backup [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "install":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: agent install DST")
			os.Exit(2)
		}
		err = install(os.Args[2])
	case "carry":
		// ROOT is another file system's root to carry from (the tests carry a newer
		// major out of its unpacked image); "/" in a pod.
		switch len(os.Args) {
		case 3:
			err = carryPostgres("/", os.Args[2])
		case 4:
			err = carryPostgres(os.Args[2], os.Args[3])
		default:
			fmt.Fprintln(os.Stderr, "usage: agent carry [ROOT] DIR")
			os.Exit(2)
		}
	case "run":
		// As PID 1, a minimal init runs the agent as its child and reaps orphans.
		if code, isInit := agent.RunAsInit(); isInit {
			os.Exit(code)
		}
		err = run(os.Args[2:])
	case "archive-wal":
		err = archiveWAL(os.Args[2:])
	case "restore-wal":
		os.Exit(restoreWAL(os.Args[2:]))
	case "pooler":
		err = runPooler(os.Args[2:])
	case "verify-backup":
		err = verifyBackup(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "agent: unknown command %q; want install, carry, run, archive-wal, restore-wal, pooler or verify-backup\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// install copies this executable to dst, atomically, mode 0755.
func install(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// carryPostgres carries the PostgreSQL programs of this image into dir (the init
// container of a major upgrade, running the old major's image) and says what it carried.
func carryPostgres(root, dir string) error {
	c, err := carry.Carry(root, dir)
	if err != nil {
		return fmt.Errorf("carrying PostgreSQL into %s: %w", dir, err)
	}
	var size int64
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			size += info.Size()
		}
		return err
	})
	if err != nil {
		return err
	}
	libs, err := os.ReadDir(filepath.Join(dir, "lib"))
	if err != nil {
		return err
	}
	fmt.Printf("Carried PostgreSQL %s (%s) into %s: %d bytes (%s), %d libraries; programs in %s\n",
		c.Major, c.Version, dir, size, humanize.IBytes(uint64(size)), len(libs), c.BinDir)
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	cfg := agent.Config{}
	fs.StringVar(&cfg.PodName, "pod-name", os.Getenv("POD_NAME"), "This instance's pod name.")
	fs.StringVar(&cfg.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "The pod's namespace.")
	fs.StringVar(&cfg.PGData, "pgdata", env("PGDATA", "/var/lib/postgresql/data/pgdata"), "The data directory.")
	fs.StringVar(&cfg.BinDir, "bin-dir", "", "Directory of the PostgreSQL programs (default: where postgres is on PATH, else /usr/lib/postgresql/$PG_MAJOR/bin).")
	fs.StringVar(&cfg.CarriedDir, "carried-dir", "/pgpilot/carried", "Where an init container carries an older major's PostgreSQL programs for an upgrade (agent carry).")
	fs.StringVar(&cfg.ListenAddress, "listen", env("POD_IP", "*"), "postgres listen_addresses.")
	fs.IntVar(&cfg.Port, "port", 5432, "postgres port.")
	fs.StringVar(&cfg.SocketDir, "socket-dir", "/run/postgresql", "Unix socket directory.")
	fs.StringVar(&cfg.ClusterConfigPath, "config", env("PGPILOT_CONFIG", "/etc/pgpilot/config/config.json"), "The cluster's config.json.")
	fs.StringVar(&cfg.SecretsDir, "secrets", env("PGPILOT_SECRETS", "/etc/pgpilot/secrets"), "Directory of the mounted credentials Secrets.")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 40*time.Second, "How long a stop may take (fast, then immediate); with the Lease's release it must fit the pod's grace period.")
	fs.IntVar(&cfg.AgentPort, "peer-agent-port", agentapi.Port, "The other instances' agent API port.")
	linger := fs.Duration("linger", 5*time.Second, "How long the agent stays up after postgres stopped on SIGTERM, so that the pod's address refuses connections (instead of dropping them) until every node's proxy stopped sending them here. Shutdown timeout, release and linger must fit the pod's grace period.")
	leaseProbe := fs.Duration("lease-probe", 5*time.Second, "How often the primary Lease is read besides the watch (API server liveness).")
	apiAddr := fs.String("api-address", fmt.Sprintf(":%d", agentapi.Port), "Address of the agent's HTTP API.")
	fs.StringVar(&cfg.TLS.Source, "tls", env("PGPILOT_TLS", "/etc/pgpilot/tls"), "Directory of the mounted certificates: server/ (tls.crt, tls.key, ca.crt) and replication/ (the replication role's client certificate and the cluster's CA).")
	fs.StringVar(&cfg.CustomQueriesPath, "custom-queries", os.Getenv("PGPILOT_CUSTOM_QUERIES"), "The custom queries' file (spec.monitoring.customQueries); empty when none is configured.")
	authDir := fs.String("auth", "/etc/pgpilot/agent", "Directory of the agent API's credentials (the Secret <cluster>-agent-auth): control.sha256, metrics.sha256, peer. Without them every call but the probes is refused.")
	poolers := fs.String("poolers", "", "host:port,... of the pooler agents a handover asks to pause (tests); default every address behind the pooler's headless Service.")
	peers := fs.String("peers", "", "pod=host,... overrides for reaching other instances (tests); default <pod>.<headless Service>.<namespace>.svc.")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for reading the primary Lease; in-cluster config when empty.")
	zopts := logging.Options()
	zopts.BindFlags(fs)
	_ = fs.Parse(args)
	// The pod is on every line: given to zap once, here, not kept by Deferred for each logger.
	log := logging.Deferred(zap.New(zap.UseFlagOptions(&zopts)).WithValues("pod", cfg.PodName))
	ctrl.SetLogger(log)

	if cfg.PodName == "" || cfg.Namespace == "" {
		return fmt.Errorf("the pod name and namespace are required (POD_NAME and POD_NAMESPACE, or --pod-name and --namespace)")
	}
	if cfg.BinDir == "" {
		cfg.BinDir = binDir()
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the agent binary for archive_command: %w", err)
	}
	cfg.AgentBinary = self
	cluster, err := clusterconfig.Load(cfg.ClusterConfigPath)
	if err != nil {
		return err
	}
	if cfg.CustomQueriesPath == "" {
		cfg.CustomQueriesPath = cluster.CustomQueries
	}
	creds, err := pgconf.LoadCredentials(cfg.SecretsDir)
	if err != nil {
		return err
	}
	overrides := parsePeers(*peers)
	if *poolers != "" {
		cfg.PoolerAddresses = strings.Split(*poolers, ",")
	}
	cfg.PeerName = func(pod string) string {
		return pod + "." + cluster.Services.Headless + "." + cfg.Namespace + ".svc"
	}
	cfg.PeerHost = func(pod string) string {
		if h, ok := overrides[pod]; ok {
			return h
		}
		return cfg.PeerName(pod)
	}
	// postgres reads copies the agent keeps beside its socket (internal/instance/pgconf.TLSFiles).
	cfg.TLS.Dir = filepath.Join(cfg.SocketDir, "tls")

	clientset, err := kubeClient(*kubeconfig)
	if err != nil {
		return err
	}

	cfg.Credentials = &agentapi.MountedCredentials{Dir: *authDir}
	if cfg.Credentials.PeerToken() == "" {
		log.Info("No agent API credentials yet: every call but the probes is refused until they are mounted", "dir", *authDir)
	}

	// SIGTERM ends the agent's Run, which then hands over; the API and the Lease
	// follower keep serving until that is done, so the operator sees it happen.
	ctx, stop := signal.NotifyContext(context.Background(), agent.Forwarded...)
	defer stop()
	stray := make(chan os.Signal, 4)
	signal.Notify(stray, agent.Stray...)
	go func() {
		for s := range stray {
			log.Info("Ignored a signal: only SIGTERM and SIGINT stop the agent", "signal", s.String())
		}
	}()
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	lease := agent.NewLeaseFollower(clientset, cfg.Namespace, cluster.PrimaryLease, log.WithName("lease"))
	go lease.Run(serveCtx, *leaseProbe)
	a := agent.New(cfg, cluster, creds, lease, log)

	server := agentapi.NewServer(a, agentapi.ServerOptions{Credentials: cfg.Credentials, TLS: cfg.TLS.ServerConfig(), Logger: log.WithName("api")})
	serverDone := make(chan error, 1)
	go func() { serverDone <- server.Run(serveCtx, *apiAddr) }()

	log.Info("Agent started", "pgdata", cfg.PGData, "binDir", cfg.BinDir, "api", *apiAddr)
	runErr := a.Run(ctx)
	if runErr == nil && *linger > 0 {
		// Postgres is down and the Lease released. The Services dropped this pod when
		// it was deleted or relabelled, but every node's proxy applies that a second or
		// more later; until then a connection sent here must meet a closed port (refused
		// at once, and retried elsewhere), not a pod address that is gone (a client waits
		// for its connect timeout, 3 s in the chaos suite, minutes by default).
		log.Info("Postgres stopped; the pod's address keeps refusing connections while the proxies catch up", "linger", linger.String())
		time.Sleep(*linger)
	}
	stopServing()
	if err := <-serverDone; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// kubeClient is the client of the API server: kubeconfig's, or the pod's own when
// empty, with a 10 s bound on each request.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var restCfg *rest.Config
	var err error
	if kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("configuring the Kubernetes client: %w", err)
	}
	restCfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(restCfg)
}

// parsePeers reads --peers: pod=host,... (tests).
func parsePeers(s string) map[string]string {
	hosts := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			hosts[k] = v
		}
	}
	return hosts
}

// binDir finds the PostgreSQL programs: the official images put them on PATH.
func binDir() string {
	if p, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(p)
	}
	return filepath.Join("/usr/lib/postgresql", os.Getenv("PG_MAJOR"), "bin")
}
