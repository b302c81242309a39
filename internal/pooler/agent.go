package pooler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/pgpilot/pgpilot/internal/pooler/pgbouncer"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// Options are a pooler agent's settings: the pod's environment and mounts.
type Options struct {
	// Pod and Namespace are the pooler pod's.
	Pod, Namespace string
	// ReadOnly runs the read-only pool: its server is the cluster's -ro Service, and
	// nothing follows the Lease.
	ReadOnly bool
	// ConfigFile is config.json, the cluster's ConfigMap; read again when it changes.
	ConfigFile string
	// RunDir holds what the agent writes for PgBouncer (pgbouncer.ini, the HBA and auth
	// files) and PgBouncer's Unix socket.
	RunDir string
	// Port is where PgBouncer listens for clients, on every address.
	Port int
	// APIAddr is where the agent's HTTPS API listens.
	APIAddr string
	// TLSDir holds the pooler's certificate (tls.crt, tls.key), served to clients and
	// on the API; ClientTLSDir the client certificate PgBouncer logs in to the
	// instances with as the lookup role; ServerCA the CA that verifies the instances.
	TLSDir, ClientTLSDir, ServerCA string
	// Credentials are the agent API's tokens, as the pod mounts them.
	Credentials agentapi.Credentials
	// PgBouncer is PgBouncer's program.
	PgBouncer string
	// Address is an instance's address; nil for its name behind the cluster's headless
	// Service (tests give addresses).
	Address func(pod string) string
	// Kube reads the primary Lease.
	Kube kubernetes.Interface
	// Registry gets the pooler's collectors; /metrics serves it.
	Registry *prometheus.Registry
	// Linger is how long a stopping pooler keeps serving, not ready, so that the
	// Service's endpoints drop it before PgBouncer stops taking connections.
	Linger time.Duration
	// StopTimeout bounds PgBouncer's safe shutdown (the transactions in flight).
	StopTimeout time.Duration
	Log         logr.Logger
}

// Admin is the user of PgBouncer's admin console, which only the agent logs in as,
// through the Unix socket, with a password made at each start.
const Admin = "pgpilot_admin"

// HoldTimeout bounds a hold asked for by a primary's agent: a handover takes well under
// it, and an abandoned one leaves the pool paused no longer.
const HoldTimeout = 10 * time.Second

// Run writes PgBouncer's configuration, runs it, follows the primary Lease (the
// read-write pool) and serves the API until ctx ends; then it stops serving new
// clients, lets the transactions in flight end, and stops PgBouncer. PgBouncer
// exiting on its own is an error: the kubelet restarts the container.
func Run(ctx context.Context, o Options) error {
	log := o.Log
	cluster, err := clusterconfig.Load(o.ConfigFile)
	if err != nil {
		return err
	}
	if cluster.Pooler == nil {
		return fmt.Errorf("%s has no pooler settings: the cluster's spec.pooler is not set", o.ConfigFile)
	}
	if o.ReadOnly && cluster.Pooler.ReadOnlyService == "" {
		return fmt.Errorf("%s has no read-only pool: the cluster's spec.pooler.readOnly is not set", o.ConfigFile)
	}
	password, err := randomPassword()
	if err != nil {
		return err
	}
	cfg := bouncerConfig(o, cluster)
	for _, f := range []struct{ path, text string }{
		{cfg.AuthFile, pgbouncer.AuthFileLine(Admin, password)},
		{cfg.HBAFile, cfg.HBA()},
	} {
		if err := os.WriteFile(f.path, []byte(f.text), 0o600); err != nil {
			return err
		}
	}
	text, err := cfg.Render()
	if err != nil {
		return err
	}
	ini := filepath.Join(o.RunDir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(text), 0o600); err != nil {
		return err
	}
	address := o.Address
	if address == nil {
		address = func(pod string) string { return pod + "." + cluster.Services.Headless + "." + o.Namespace + ".svc" }
	}
	bouncer := &Bouncer{Config: cfg, Ini: ini, AdminPassword: password, PauseTimeout: 2 * time.Second, Address: address}
	bouncer.Written(text)

	cmd := exec.Command(o.PgBouncer, ini)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting PgBouncer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	log.Info("PgBouncer started", "pid", cmd.Process.Pid, "port", o.Port, "server", cfg.Server, "mode", cfg.Mode)

	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	p := &poolerAgent{opts: o, bouncer: bouncer, log: log, serving: true}
	if !o.ReadOnly {
		lease := NewLeaseWatch(o.Kube, o.Namespace, cluster.PrimaryLease, log.WithName("lease"))
		go lease.Run(runCtx)
		p.follower = &Follower{
			Lease:    lease.Record,
			Writable: p.probe().Writable,
			Pool:     bouncer,
			Period:   time.Second,
			Changed:  lease.Changed(),
			Log:      log.WithName("follow"),
		}
	}
	if o.Registry != nil {
		o.Registry.MustRegister(p.collector(), NewCollector(bouncer.Dial, CollectorTimeout, log.WithName("metrics")))
	}
	apiDone := make(chan error, 1)
	go func() { apiDone <- p.serveAPI(runCtx) }()
	if err := p.waitAdmin(ctx, exited); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	if p.follower != nil {
		go p.follower.Run(runCtx)
	}
	go p.watchFiles(runCtx, o.ConfigFile)

	select {
	case err := <-exited:
		return fmt.Errorf("PgBouncer exited: %v", err)
	case err := <-apiDone:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if exit := <-exited; exit != nil {
			log.Info("PgBouncer stopped", "exit", exit.Error())
		}
		return fmt.Errorf("the pooler agent's API stopped: %w", err)
	case <-ctx.Done():
	}
	return p.shutdown(cmd, exited, stop, apiDone)
}

// bouncerConfig is PgBouncer's configuration for the cluster's pooler settings. The
// read-write pool starts on the -rw Service, paused by the follower until the Lease's
// holder accepts writes; the read-only pool stays on the -ro Service.
func bouncerConfig(o Options, cluster clusterconfig.Config) pgbouncer.Config {
	server := cluster.Services.ReadWrite
	if o.ReadOnly {
		server = cluster.Pooler.ReadOnlyService
	}
	cfg := pgbouncer.Config{
		ListenPort: o.Port,
		SocketDir:  o.RunDir,
		AuthFile:   filepath.Join(o.RunDir, "users.txt"),
		HBAFile:    filepath.Join(o.RunDir, "hba.conf"),
		Server:     server + "." + o.Namespace + ".svc",
		Port:       5432,
		AuthUser:   poolerauth.Role,
		AuthQuery:  poolerauth.Query,
		Admin:      Admin,
	}
	if o.TLSDir != "" {
		cfg.CertFile, cfg.KeyFile = filepath.Join(o.TLSDir, "tls.crt"), filepath.Join(o.TLSDir, "tls.key")
		// The CA that issued the pooler's certificate, the cluster's: PgBouncer needs
		// one for clients' certificates, and the image has no system bundle.
		cfg.ClientCAFile = filepath.Join(o.TLSDir, "ca.crt")
	}
	if o.ClientTLSDir != "" {
		cfg.ServerCertFile, cfg.ServerKeyFile = filepath.Join(o.ClientTLSDir, "tls.crt"), filepath.Join(o.ClientTLSDir, "tls.key")
	}
	cfg.CAFile = o.ServerCA
	if o.ServerCA == "" {
		// Encrypted, not verified: tests, whose instances have addresses and
		// certificates for names.
		cfg.ServerSSLMode = "require"
	}
	settings(&cfg, cluster.Pooler)
	return cfg
}

// settings copies the user's pooler settings into cfg.
func settings(cfg *pgbouncer.Config, p *clusterconfig.Pooler) {
	cfg.Mode = pgbouncer.Mode(p.Mode)
	cfg.PoolSize, cfg.MaxClients = p.PoolSize, p.MaxClientConnections
	cfg.Parameters = p.Parameters
}

// poolerAgent is a running pooler agent.
type poolerAgent struct {
	opts     Options
	bouncer  *Bouncer
	follower *Follower // nil for the read-only pool
	log      logr.Logger

	mu sync.Mutex
	// serving: not stopping. ready: the admin console answered at the last check;
	// answered, when it last did.
	serving, ready    bool
	checked, answered time.Time
}

// probe is how the follower finds the holder accepting writes: a session as the lookup
// role with the pooler's client certificate, which a locked-out primary refuses.
func (p *poolerAgent) probe() Probe {
	o := p.opts
	pr := Probe{
		Address:  p.bouncer.Address,
		Port:     5432,
		User:     poolerauth.Role,
		Database: "postgres",
		SSLMode:  "verify-full", SSLRootCert: o.ServerCA,
		Timeout: time.Second,
	}
	if o.ClientTLSDir != "" {
		pr.SSLCert, pr.SSLKey = filepath.Join(o.ClientTLSDir, "tls.crt"), filepath.Join(o.ClientTLSDir, "tls.key")
	}
	if o.ServerCA == "" {
		pr.SSLMode = "require"
	}
	return pr
}

// waitAdmin waits until PgBouncer's admin console answers, for at most 30 s.
func (p *poolerAgent) waitAdmin(ctx context.Context, exited <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := p.bouncer.admin(ctx, func(a *pgbouncer.Admin, ctx context.Context) error { _, err := a.Pools(ctx); return err })
		if err == nil {
			p.setReady(true)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PgBouncer's admin console did not answer in 30 s: %w", err)
		}
		select {
		case err := <-exited:
			return fmt.Errorf("PgBouncer exited at its start: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *poolerAgent) setReady(ready bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready, p.checked = ready, time.Now()
	if ready {
		p.answered = p.checked
	}
}

// unanswered is how long a stuck PgBouncer may leave its admin console unanswered
// before the liveness probe fails and the kubelet restarts the container.
const unanswered = 30 * time.Second

// Live says whether PgBouncer answered its admin console within unanswered (the
// readiness probe asks every 2 s).
func (p *poolerAgent) Live() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.serving || time.Since(p.answered) < unanswered
}

// Ready says whether clients should be sent here: not stopping, and the admin console
// answered within the last second (asked again when older).
func (p *poolerAgent) Ready(ctx context.Context) bool {
	p.mu.Lock()
	serving, ready, fresh := p.serving, p.ready, time.Since(p.checked) < time.Second
	p.mu.Unlock()
	if !serving {
		return false
	}
	if fresh {
		return ready
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := p.bouncer.admin(cctx, func(a *pgbouncer.Admin, ctx context.Context) error { _, err := a.Pools(ctx); return err })
	p.setReady(err == nil)
	return err == nil
}

// watchFiles applies changes of config.json's pooler settings (the configuration
// written again and reloaded, when it renders otherwise) and of the certificates (a
// renewal: reloaded). A change that could not be applied is tried again.
func (p *poolerAgent) watchFiles(ctx context.Context, configFile string) {
	cfg := p.bouncer.Current()
	stamps := func(files ...string) string {
		s := ""
		for _, f := range files {
			if f == "" {
				continue
			}
			if st, err := os.Stat(f); err == nil {
				s += fmt.Sprintf("%s:%d:%d;", f, st.ModTime().UnixNano(), st.Size())
			}
		}
		return s
	}
	certs := []string{cfg.CertFile, cfg.ServerCertFile, cfg.CAFile, cfg.ClientCAFile}
	lastConfig, lastCerts := stamps(configFile), stamps(certs...)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		if now := stamps(configFile); now != lastConfig {
			if err := p.applySettings(ctx, configFile); err != nil {
				p.log.Error(err, "Could not apply the pooler's new settings; trying again")
			} else {
				lastConfig = now
			}
		}
		if now := stamps(certs...); now != lastCerts {
			if err := p.bouncer.Reload(ctx); err != nil {
				p.log.Error(err, "Could not reload PgBouncer's renewed certificates; trying again")
			} else {
				p.log.Info("Reloaded PgBouncer's certificates")
				lastCerts = now
			}
		}
	}
}

// applySettings writes config.json's pooler settings into pgbouncer.ini and reloads it
// when they change it.
func (p *poolerAgent) applySettings(ctx context.Context, configFile string) error {
	cluster, err := clusterconfig.Load(configFile)
	if err != nil {
		return err
	}
	if cluster.Pooler == nil {
		// spec.pooler removed: the chart removes this pod; the settings stay.
		return nil
	}
	if err := p.bouncer.Configure(ctx, func(c *pgbouncer.Config) { settings(c, cluster.Pooler) }); err != nil {
		return err
	}
	p.log.Info("The pooler's settings are in force", "mode", cluster.Pooler.Mode,
		"poolSize", cluster.Pooler.PoolSize, "maxClientConnections", cluster.Pooler.MaxClientConnections)
	return nil
}

// shutdown stops a pooler whose pod is deleted: not ready at once, so that the
// Services drop it, still serving for Linger, then PgBouncer's safe shutdown (SIGINT:
// PAUSE, then exit once the transactions in flight end), killed past StopTimeout.
func (p *poolerAgent) shutdown(cmd *exec.Cmd, exited <-chan error, stopAPI func(), apiDone <-chan error) error {
	p.mu.Lock()
	p.serving = false
	p.mu.Unlock()
	p.log.Info("Stopping: not ready, still serving while the Services drop this pod", "linger", p.opts.Linger.String())
	select {
	case <-time.After(p.opts.Linger):
	case err := <-exited:
		p.stopAPI(stopAPI, apiDone)
		return fmt.Errorf("PgBouncer exited: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	var err error
	select {
	case err = <-exited:
	case <-time.After(p.opts.StopTimeout):
		p.log.Info("PgBouncer's transactions did not end in time; killing it", "timeout", p.opts.StopTimeout.String())
		_ = cmd.Process.Kill()
		err = <-exited
	}
	p.stopAPI(stopAPI, apiDone)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return err
	}
	p.log.Info("PgBouncer stopped")
	return nil
}

// stopAPI stops the API and waits for it.
func (p *poolerAgent) stopAPI(stop func(), done <-chan error) {
	stop()
	if err := <-done; err != nil {
		p.log.Info("The API stopped with an error", "error", err.Error())
	}
}

func randomPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
