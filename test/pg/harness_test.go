// Package pg runs real agents supervising real PostgreSQL (Debian's postgresql-15), each
// instance on its own loopback address, with the primary Lease in a real kube-apiserver.
//
// The tests run in parallel (t.Parallel; make test-quick runs three at a time): each
// makes its own clusters (nextCluster: name, namespace, work directory and 127.0.<k>.*
// addresses of their own), its own S3 server, and for operated clusters an operator that
// watches the cluster's namespace only. What they share is set up once by TestMain: the
// API server (each cluster in a namespace of its own), the agent binary, the kubeconfig.
package pg

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/agent"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// PGBin is where Debian's postgresql-15 puts its programs; hack/install-postgres.sh
// installs it (make test runs it).
const PGBin = "/usr/lib/postgresql/15/bin"

const token = "test-token"

// workPrefix names the work directory; every agent and postgres of a run has it in its
// command line.
const workPrefix = "pgpilot-pg-"

var (
	// operatorConfig impersonates the operator's ServiceAccount; each operated cluster
	// runs an operator of its own with it, watching its namespace (startOperator).
	operatorConfig *rest.Config
	repoRoot       string
	kube           kubernetes.Interface
	// k8s is a controller-runtime client with pgpilot's types.
	k8s        client.Client
	kubeconfig string
	// apiServer is the kube-apiserver's host:port, which each agent reaches through
	// a proxy of its own that a test can cut.
	apiServer string
	agentBin  string
	pgUID     uint32
	pgGID     uint32
	workDir   string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if _, err := os.Stat(filepath.Join(PGBin, "postgres")); err != nil {
		fmt.Fprintf(os.Stderr, "PostgreSQL 15 is not installed at %s: run hack/install-postgres.sh (make test does)\n", PGBin)
		return 1
	}
	if _, err := os.Stat(PgBouncerBin); err != nil {
		fmt.Fprintf(os.Stderr, "PgBouncer is not installed at %s: run 'apt-get install pgbouncer' (make test does)\n", PgBouncerBin)
		return 1
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		fmt.Fprintln(os.Stderr, "no postgres OS user (Debian's postgresql package creates it):", err)
		return 1
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	pgUID, pgGID = uint32(uid), uint32(gid)

	root, err := devenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// One run at a time on a machine: runs share the loopback addresses. Holding the
	// lock also means any agent or postgres of an earlier run is left from a run that
	// died, and holds addresses this one needs.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "pgpilot-pg-tests.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		fmt.Fprintln(os.Stderr, "waiting for other real-PostgreSQL test runs:", err)
		return 1
	}
	_ = exec.Command("pkill", "-KILL", "-f", "/"+workPrefix).Run()
	// A world-traversable work directory: the agents run as the postgres OS user.
	if workDir, err = os.MkdirTemp("", workPrefix); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	_ = os.Chmod(workDir, 0o755)
	agentBin = filepath.Join(workDir, "agent")
	build := exec.Command("go", "build", "-o", agentBin, "./cmd/agent")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the agent:", err)
		return 1
	}

	env, err := devenv.StartControlPlane(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop() //nolint:errcheck // the process exits next; nothing to do with an error
	if kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	admin, err := env.AddUser(envtest.User{Name: "agents", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	apiURL, err := url.Parse(env.Config.Host)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	apiServer = apiURL.Host
	kubeconfig = filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The operator (Helm manager and controller) runs too, as its ServiceAccount: it acts
	// on PostgresCluster objects only, so the tests that drive agents through bare
	// Leases are left alone.
	os.Setenv("RELATED_IMAGE_AGENT", "pgpilot:pg-tests")
	os.Setenv("RELATED_IMAGE_PGBOUNCER", "pgbouncer:pg-tests")
	ctrl.SetLogger(logr.Discard()) // the agents' logs are what these tests show
	klog.SetLogger(logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	operatorCfg, err := devenv.InstallOperator(ctx, env.Config, root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "installing config/default:", err)
		return 1
	}
	operatorConfig, repoRoot = operatorCfg, root
	scheme, err := controller.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(env.Config, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

var clusterSeq struct {
	sync.Mutex
	n int
}

// cluster is a set of instances of one PostgresCluster, pods <name>-0 ... on 127.0.<k>.2+i.
type cluster struct {
	t         testing.TB
	name      string
	namespace string
	dir       string
	instances []*instance
	creds     pgconf.Credentials
	// ca issued the certificates of a cluster the operator does not run.
	ca *pki.KeyPair
	// caPEM is the cluster's CA certificate, which the agent API is verified with.
	caPEM []byte
	// token is the agents' API token; operated clusters use the one the controller made.
	token string
	// sts is the StatefulSet the operator rendered (operated clusters).
	sts appsv1.StatefulSet
	// stopOperator stops the cluster's operator (operated clusters).
	stopOperator func()
	// customQueries is the custom queries' file the agents are given; "" for none.
	customQueries string
	// operatorLog is the log of the cluster's operator (operated clusters).
	operatorLog *bytes.Buffer
	// poolers are the pooler agents' addresses (host:port) a handover asks to pause;
	// "" for none.
	poolers string

	mu sync.Mutex
	// revision labels the pods the kubelet stand-in creates, as the StatefulSet
	// controller labels them with its revision (operated clusters).
	revision string
	// restarts are the pods the kubelet stand-in restarted because they were deleted,
	// in order, with the primary Lease's holder at that moment.
	restarts []restart
}

type restart struct{ pod, primary string }

type instance struct {
	c       *cluster
	proxy   *apiProxy
	ordinal int
	pod     string
	ip      string
	dir     string
	// pgdata is the data directory: in dir, or on a volume of its own (onVolume).
	pgdata string
	cmd    *exec.Cmd
	log    *bytes.Buffer
	done   chan struct{}
	// peers, when set, replaces the cluster's pod=address list this agent is given.
	peers string
	// binDir, when set, replaces PGBin as the image's programs; carriedDir is where an
	// older major's programs are carried (upgrade_test.go).
	binDir, carriedDir string
}

// nextCluster numbers a new cluster k: name c<k>, namespace pg-<k>, its own work
// directory, and instances on 127.0.<k>.*.
func nextCluster(t testing.TB) (*cluster, int) {
	clusterSeq.Lock()
	clusterSeq.n++
	k := clusterSeq.n
	clusterSeq.Unlock()
	c := &cluster{t: t, name: fmt.Sprintf("c%d", k), namespace: fmt.Sprintf("pg-%d", k)}
	c.dir = filepath.Join(workDir, c.name)
	mustMkdir(t, c.dir, 0o755)
	return c, k
}

// newCluster prepares n instances (not started) and the primary Lease naming the first.
func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c, k := nextCluster(t)
	c.creds = pgconf.Credentials{
		Superuser:   pgconf.Credential{Username: "postgres", Password: "su-" + c.name + "-secret"},
		Replication: pgconf.Credential{Username: "pgpilot_replication", Password: "repl'pw:with\\odd chars"},
		App:         pgconf.Credential{Username: "app", Password: "app-" + c.name + "-pw"},
	}
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Config and secrets as the chart and the controller provide them.
	cfg := map[string]any{
		"clusterName": c.name, "version": "15", "replicas": n,
		"parameters":   map[string]string{"work_mem": "8MB", "log_min_messages": "warning", "shared_buffers": "16MB"},
		"bootstrap":    map[string]string{"database": "app", "owner": "app"},
		"services":     map[string]string{"readWrite": dbv1.NamesOf(c.name).ReadWriteService(), "headless": dbv1.NamesOf(c.name).HeadlessService()},
		"primaryLease": dbv1.NamesOf(c.name).PrimaryLease(),
	}
	b, _ := json.Marshal(cfg)
	mustWrite(t, filepath.Join(c.dir, "config.json"), b)
	for name, cred := range map[string]pgconf.Credential{"superuser": c.creds.Superuser, "replication": c.creds.Replication, "app": c.creds.App} {
		mustMkdir(t, filepath.Join(c.dir, "secrets", name), 0o755)
		mustWrite(t, filepath.Join(c.dir, "secrets", name, "username"), []byte(cred.Username))
		mustWrite(t, filepath.Join(c.dir, "secrets", name, "password"), []byte(cred.Password))
	}
	c.writeAuth(map[string][]byte{
		agentapi.FileControlDigest: []byte(agentapi.Digest(token)),
		agentapi.FilePeerToken:     []byte("peer-" + c.name),
	})
	c.issueTLS()
	c.addInstances(k, n)
	c.setLease(c.instances[0].pod, false)
	t.Cleanup(c.stopAll)
	return c
}

// addInstances prepares n instances <name>-0 ... on 127.0.<k>.2+i.
func (c *cluster) addInstances(k, n int) {
	for i := range n {
		in := &instance{c: c, ordinal: i, pod: fmt.Sprintf("%s-%d", c.name, i), ip: fmt.Sprintf("127.0.%d.%d", k, 2+i)}
		in.dir = filepath.Join(c.dir, in.pod)
		in.pgdata = filepath.Join(in.dir, "pgdata")
		mustMkdir(c.t, filepath.Join(in.dir, "run"), 0o700)
		in.proxy = newAPIProxy(c.t, apiServer)
		writeKubeconfig(c.t, filepath.Join(in.dir, "kubeconfig"), in.proxy.addr())
		chownR(c.t, in.dir)
		c.instances = append(c.instances, in)
	}
}

// setConfig changes one key of the cluster's config.json, as a ConfigMap update would.
func (c *cluster) setConfig(key string, value any) {
	c.t.Helper()
	path := filepath.Join(c.dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(b, &cfg); err != nil {
		c.t.Fatal(err)
	}
	cfg[key] = value
	if b, err = json.Marshal(cfg); err != nil {
		c.t.Fatal(err)
	}
	mustWrite(c.t, path+".tmp", b)
	if err := os.Rename(path+".tmp", path); err != nil {
		c.t.Fatal(err)
	}
}

// setConfigRead is setConfig, returning once in's agent has read the changed file (it
// rereads it about each second, later under load).
func (in *instance) setConfigRead(key string, value any) {
	in.c.t.Helper()
	const changed = "The cluster configuration changed"
	before := strings.Count(in.log.String(), changed)
	in.c.setConfig(key, value)
	testutil.Eventually(in.c.t, 30*time.Second, func() error {
		if strings.Count(in.log.String(), changed) == before {
			return fmt.Errorf("%s's agent has not read the changed %s yet", in.pod, key)
		}
		return nil
	})
}

// setLease makes pod the primary in a new term, as the controller moves the Lease.
func (c *cluster) setLease(pod string, bootstrapped bool) {
	c.t.Helper()
	ctx := context.Background()
	store := primarylease.ClientsetStore{Client: kube, Namespace: c.namespace, Name: dbv1.NamesOf(c.name).PrimaryLease()}
	_, err := store.Get(ctx)
	if apierrors.IsNotFound(err) {
		l := primarylease.New(c.namespace, dbv1.NamesOf(c.name).PrimaryLease(), c.name, pod, time.Now())
		if _, err := kube.CoordinationV1().Leases(c.namespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			c.t.Fatal(err)
		}
		if !bootstrapped {
			return
		}
		err = nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	_, err = primarylease.Apply(ctx, store, nil, time.Now, func(l *coordinationv1.Lease, now time.Time) error {
		if bootstrapped {
			metav1.SetMetaDataAnnotation(&l.ObjectMeta, agent.AnnotationBootstrapped, "true")
		}
		if r := primarylease.Parse(l); r.Holder == pod {
			return nil
		}
		return primarylease.Move(primarylease.Parse(l).Term, pod, nil, 0)(l, now)
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

// setLeaseAnnotation sets one annotation of the primary Lease ("" removes it), as a
// test standing in for the operator writes it, whoever holds the Lease.
func (c *cluster) setLeaseAnnotation(key, value string) {
	c.t.Helper()
	store := primarylease.ClientsetStore{Client: kube, Namespace: c.namespace, Name: dbv1.NamesOf(c.name).PrimaryLease()}
	set := func(l *coordinationv1.Lease, _ time.Time) error {
		if value == "" {
			delete(l.Annotations, key)
		} else {
			metav1.SetMetaDataAnnotation(&l.ObjectMeta, key, value)
		}
		return nil
	}
	if _, err := primarylease.Apply(context.Background(), store, nil, time.Now, set); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) peers() string {
	var s string
	for _, in := range c.instances {
		s += in.pod + "=" + in.ip + ","
	}
	return s
}

// start starts the instance's agent as the postgres OS user.
func (in *instance) start() {
	t := in.c.t
	t.Helper()
	in.log = &bytes.Buffer{}
	in.cmd = exec.Command(agentBin, "run",
		"--pod-name", in.pod, "--namespace", in.c.namespace,
		"--pgdata", in.pgdata, "--bin-dir", cmp.Or(in.binDir, PGBin), "--carried-dir", cmp.Or(in.carriedDir, filepath.Join(in.dir, "carried")),
		"--listen", in.ip, "--port", "5432", "--socket-dir", filepath.Join(in.dir, "run"),
		"--config", filepath.Join(in.c.dir, "config.json"), "--secrets", filepath.Join(in.c.dir, "secrets"),
		"--api-address", in.ip+":8008", "--auth", filepath.Join(in.c.dir, "auth"), "--tls", in.c.tlsDir(),
		"--peers", cmp.Or(in.peers, in.c.peers()), "--kubeconfig", filepath.Join(in.dir, "kubeconfig"), "--shutdown-timeout", "20s",
		"--lease-probe", "500ms", "--linger", "0s", "--custom-queries", in.c.customQueries, "--poolers", in.c.poolers)
	in.cmd.Stdout, in.cmd.Stderr = syncWriter(in.log), syncWriter(in.log)
	in.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}, Pdeathsig: syscall.SIGKILL}
	in.cmd.Env = append(os.Environ(), "HOME="+in.dir, "LC_ALL=C.UTF-8")
	// Orphaned backends may hold the output pipe after a kill -9.
	in.cmd.WaitDelay = 2 * time.Second
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in.done = make(chan struct{})
	go func() { _ = in.cmd.Wait(); close(in.done) }()
}

// onVolume puts in's data directory on a file system of its own, a tmpfs of size
// bytes, as a pod's volume is; it returns the volume's mount point.
func (in *instance) onVolume(size int64) string {
	t := in.c.t
	t.Helper()
	vol := filepath.Join(in.dir, "volume")
	mustMkdir(t, vol, 0o700)
	opts := fmt.Sprintf("size=%d,mode=0700,uid=%d,gid=%d", size, pgUID, pgGID)
	if err := syscall.Mount("tmpfs", vol, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", vol, err)
	}
	// Lazily: an instance still running keeps it until it stops.
	t.Cleanup(func() { _ = syscall.Unmount(vol, syscall.MNT_DETACH) })
	in.pgdata = filepath.Join(vol, "pgdata")
	return vol
}

// resizeVolume changes the size of a volume onVolume mounted.
func resizeVolume(t testing.TB, vol string, size int64) {
	t.Helper()
	if err := syscall.Mount("tmpfs", vol, "tmpfs", syscall.MS_REMOUNT, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("resizing the tmpfs on %s to %d bytes: %v", vol, size, err)
	}
}

// startAll starts every instance and waits until the first is the primary and the
// others are its ready replicas; it returns the primary's status.
func (c *cluster) startAll() agentapi.Status {
	c.t.Helper()
	for _, in := range c.instances {
		in.start()
	}
	st := c.instances[0].waitRole(agentapi.RolePrimary, 1, upTimeout)
	for _, r := range c.instances[1:] {
		r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	}
	return st
}

// kill9 kills the agent and its postmaster with SIGKILL, like a pod that dies.
func (in *instance) kill9() {
	pid := in.postmasterPid()
	_ = in.cmd.Process.Kill()
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-in.done
	// Wait for the backends to go and the port to be free.
	deadline := time.Now().Add(10 * time.Second)
	for pid > 0 && syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops the agent gracefully (SIGTERM), as the kubelet does.
func (in *instance) stop() {
	if in.cmd == nil || in.cmd.Process == nil {
		return
	}
	select {
	case <-in.done:
		return
	default:
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.done:
	case <-time.After(40 * time.Second):
		in.kill9()
	}
}

// leftovers lists the processes still working in the instance's data directory (every
// postgres process does).
func (in *instance) leftovers() []string {
	dir, err := filepath.EvalSymlinks(in.pgdata)
	if err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var left []string
	for _, e := range entries {
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			left = append(left, e.Name()+" "+strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	return left
}

func (c *cluster) stopAll() {
	for _, in := range c.instances {
		in.stop()
	}
	if c.t.Failed() {
		for _, in := range c.instances {
			if in.log != nil {
				c.t.Logf("--- log of %s ---\n%s", in.pod, lastBytes(in.log.Bytes(), 60000))
			}
		}
		if c.operatorLog != nil {
			c.t.Logf("--- log of the operator of %s ---\n%s", c.name, lastBytes(syncWriter(c.operatorLog).bytes(), 100000))
		}
	}
}

// postmasterPid reads postmaster.pid; 0 when postgres is not running.
func (in *instance) postmasterPid() int {
	b, err := os.ReadFile(filepath.Join(in.pgdata, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pid, _ := strconv.Atoi(string(line))
	return pid
}

func (in *instance) api() *agentapi.Client {
	tok := token
	if in.c.token != "" {
		tok = in.c.token
	}
	return agentapi.NewClient("https://"+in.ip+":8008", tok, in.c.agentHTTP(in.pod))
}

func (in *instance) status() (agentapi.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return in.api().Status(ctx)
}

// mustStatus is the agent's status for a step that needs it now: an agent slow to answer
// under load is asked again for a while before the test ends.
func (in *instance) mustStatus() agentapi.Status {
	in.c.t.Helper()
	var st agentapi.Status
	testutil.Eventually(in.c.t, 30*time.Second, func() (err error) {
		st, err = in.status()
		return err
	})
	return st
}

// waitRole waits until the agent reports role and ready (and, when tl > 0, timeline tl).
func (in *instance) waitRole(role string, tl int64, timeout time.Duration) agentapi.Status {
	in.c.t.Helper()
	var st agentapi.Status
	var err error
	testutil.Eventually(in.c.t, timeout, func() error {
		st, err = in.status()
		if err != nil {
			return err
		}
		if st.Role != role || !st.Ready || (tl > 0 && st.Timeline != tl) {
			return fmt.Errorf("%s: role %s ready %v timeline %d error %q; want %s ready timeline %d", in.pod, st.Role, st.Ready, st.Timeline, st.Error, role, tl)
		}
		return nil
	})
	return st
}

// waitSupersededAside waits up to a minute until the agent reports exactly one set-aside
// data directory, superseded (the clone that replaced it streams), and returns it.
func (in *instance) waitSupersededAside() agentapi.SetAside {
	in.c.t.Helper()
	var kept agentapi.SetAside
	testutil.Eventually(in.c.t, time.Minute, func() error {
		st, err := in.status()
		if err != nil {
			return err
		}
		if len(st.SetAside) != 1 || !st.SetAside[0].Superseded {
			return fmt.Errorf("%s: set aside: %+v; want one, superseded", in.pod, st.SetAside)
		}
		kept = st.SetAside[0]
		return nil
	})
	return kept
}

// connConfig is a connection to the instance over TCP as the application owner.
func (in *instance) connConfig() (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=app sslmode=require connect_timeout=3", in.ip))
	if err != nil {
		return nil, err
	}
	cfg.Password = in.c.creds.App.Password
	return cfg, nil
}

// conn connects to the instance over TCP as the application owner.
func (in *instance) conn(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := in.connConfig()
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// withConn runs f on a connection to the instance as the application owner, within
// 10 s; an error fails the test.
func (in *instance) withConn(f func(ctx context.Context, conn *pgx.Conn) error) {
	in.c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		in.c.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := f(ctx, conn); err != nil {
		in.c.t.Fatal(err)
	}
}

func (in *instance) exec(sql string, args ...any) error {
	return in.onSession(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
}

// query runs one query on a new session as the application owner and scans its row.
func (in *instance) query(sql string, dest ...any) error {
	return in.onSession(func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, sql).Scan(dest...)
	})
}

// onSession runs f on a new session as the application owner, within 10 s.
func (in *instance) onSession(f func(ctx context.Context, conn *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return f(ctx, conn)
}

// mustExec runs sql on the instance and ends the test if it fails.
func (in *instance) mustExec(sql string, args ...any) {
	in.c.t.Helper()
	if err := in.exec(sql, args...); err != nil {
		in.c.t.Fatalf("%s: %s: %v", in.pod, sql, err)
	}
}

func (in *instance) count(table string) (int64, error) { return in.countRows(table, "true") }

// countWhere counts table's rows that match where, and ends the test if it cannot.
func (in *instance) countWhere(table, where string) int64 {
	in.c.t.Helper()
	n, err := in.countRows(table, where)
	if err != nil {
		in.c.t.Fatal(err)
	}
	return n
}

func (in *instance) countRows(table, where string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int64
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE "+where).Scan(&n)
	return n, err
}

// waitCount waits until the instance has n rows in table.
func (in *instance) waitCount(table string, n int64, timeout time.Duration) {
	in.c.t.Helper()
	testutil.Eventually(in.c.t, timeout, func() error {
		got, err := in.count(table)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("%s has %d rows in %s, want %d", in.pod, got, table, n)
		}
		return nil
	})
}

// waitRows waits until the ids of table's rows on the instance are want, in order.
func (in *instance) waitRows(table string, want []int64, timeout time.Duration) {
	in.c.t.Helper()
	testutil.Eventually(in.c.t, timeout, func() error {
		var got []int64
		err := in.onSession(func(ctx context.Context, conn *pgx.Conn) error {
			rows, err := conn.Query(ctx, "SELECT id FROM "+pgx.Identifier{table}.Sanitize()+" ORDER BY id")
			if err != nil {
				return err
			}
			got, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		})
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s has the ids %v in %s, want %v", in.pod, got, table, want)
		}
		return nil
	})
}

func mustMkdir(t testing.TB, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, mode)
}

func mustWrite(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func chownR(t testing.TB, dir string) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, int(pgUID), int(pgGID))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// asPostgres is the PostgreSQL program name with args, to run as the postgres OS user.
func asPostgres(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(PGBin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	return cmd
}

// startLogged starts cmd with its output kept, and stops it (SIGINT, then waits) when
// the test ends; it returns the output.
func startLogged(t testing.TB, cmd *exec.Cmd) *lockedWriter {
	t.Helper()
	log := syncWriter(&bytes.Buffer{})
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	})
	return log
}

type lockedWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// bytes is a copy of what was written so far.
func (w *lockedWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.b.Bytes())
}

var writers sync.Map

func syncWriter(b *bytes.Buffer) *lockedWriter {
	w, _ := writers.LoadOrStore(b, &lockedWriter{b: b})
	return w.(*lockedWriter)
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// apiProxy forwards TCP to the kube-apiserver until it is cut: then it drops every
// connection and refuses new ones, as a network partition would.
type apiProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	// delay holds back every answer of the API server this long (setDelay): a slow
	// API server, whose watch events and renewals both come late.
	delay atomic.Int64
}

func newAPIProxy(t testing.TB, target string) *apiProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *apiProxy) addr() string { return p.ln.Addr().String() }

func (p *apiProxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { latencyCopy(c, up, &p.delay); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// setDelay holds back the API server's answers to the agent by d (0: none).
func (p *apiProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

// latencyCopy copies src to dst, each chunk delay after it was read: a latency, not a
// lower throughput, so that a watch's events and the answers to requests on the same
// connection all come that much later, none behind the others' delays.
func latencyCopy(dst io.Writer, src io.Reader, delay *atomic.Int64) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		time.Sleep(time.Until(ch.at))
		if _, err := dst.Write(ch.b); err != nil {
			for range chunks { // let the reader end
			}
			return
		}
	}
}

// setCut cuts (true) or restores (false) the agent's way to the API server.
func (p *apiProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

// writeKubeconfig writes the test's kubeconfig with its server replaced by addr.
func writeKubeconfig(t testing.TB, path, addr string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(path, 0o644)
}
