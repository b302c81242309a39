//go:build e2e

// Package e2e runs pgpilot on a real single-node Kubernetes cluster (hack/localcluster),
// deployed from config/default with locally built images: `make e2e` builds, starts and
// deploys, then runs these tests inside the cluster's network namespace. They are
// behind the e2e build tag so that `go test ./...` does not build them; they never skip.
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// version is the PostgreSQL major of the local image (E2E_PG_MAJOR in hack/e2e/lib.sh).
var version = envOr("E2E_PG_MAJOR", "15")

var k8s client.Client

// clientset reads container logs for the failure dumps.
var clientset kubernetes.Interface

// namespaces counts the namespaces the tests made.
var namespaces int

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func TestMain(m *testing.M) {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: no cluster (run make e2e, which starts one):", err)
		os.Exit(1)
	}
	scheme, err := controller.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// db is one PostgresCluster of a test, in a namespace of its own that enforces the
// restricted Pod Security Standard.
type db struct {
	t    testing.TB
	ns   string
	name string
	// loginAs, when set, is the cluster whose application Secret conn logs in with: a
	// replica cluster's data, roles included, is its source's.
	loginAs *db
}

func newDB(t testing.TB, replicas int32, opts ...func(*dbv1.PostgresCluster)) *db {
	t.Helper()
	// A benchmark's function runs more than once (b.N = 1, then b.N): each run gets a
	// namespace of its own, as the one before may still be terminating.
	namespaces++
	name := "e2e-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	d := &db{t: t, ns: fmt.Sprintf("%.55s-%d", name, namespaces), name: "my-db"}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			d.dump()
		}
		_ = k8s.Delete(context.Background(), ns)
	})
	pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: d.name, Namespace: d.ns},
		Spec: dbv1.PostgresClusterSpec{Replicas: replicas, Version: version}}
	for _, o := range opts {
		o(pgc)
	}
	if err := k8s.Create(ctx, pgc); err != nil {
		t.Fatal(err)
	}
	return d
}

// cluster reads the PostgresCluster. Most callers poll with it, so an error the API server
// gives now and not a moment later (a timeout under load) is waited through, not fatal.
func (d *db) cluster() dbv1.PostgresCluster {
	d.t.Helper()
	var pgc dbv1.PostgresCluster
	testutil.Eventually(d.t, apiPatience, func() error {
		return k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc)
	})
	return pgc
}

// apiPatience is how long a helper waits through failing reads of the API server.
const apiPatience = 30 * time.Second

// waitHealthy waits until the cluster is Healthy with n ready instances.
func (d *db) waitHealthy(n int32, timeout time.Duration) dbv1.PostgresCluster {
	d.t.Helper()
	var pgc dbv1.PostgresCluster
	testutil.Eventually(d.t, timeout, func() error {
		pgc = d.cluster()
		if pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != n {
			return fmt.Errorf("phase %s, %d ready instances, primary %q", pgc.Status.Phase, pgc.Status.ReadyInstances, pgc.Status.CurrentPrimary)
		}
		return nil
	})
	// Healthy counts ready pods; the Services route to them a moment later.
	if n > 1 {
		d.waitRouted(timeout, "rw", "ro")
	} else {
		d.waitRouted(timeout, "rw")
	}
	return pgc
}

// conn connects as the application owner through Service svc ("rw" or "ro"), by its
// cluster IP: the tests run in the node's network namespace, where kube-proxy routes it.
func (d *db) conn(ctx context.Context, svc string) (*pgx.Conn, error) {
	cfg, err := d.connConfig(ctx, svc)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// rwTarget is the read-write Service, for a testutil.Writer.
func (d *db) rwTarget(ctx context.Context) (*pgx.ConnConfig, error) { return d.connConfig(ctx, "rw") }

// connConfig is conn's configuration.
func (d *db) connConfig(ctx context.Context, svc string) (*pgx.ConnConfig, error) {
	var s corev1.Service
	names := dbv1.NamesOf(d.name)
	service := map[string]string{"rw": names.ReadWriteService(), "ro": names.ReadOnlyService()}[svc]
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: service}, &s); err != nil {
		return nil, err
	}
	login := d
	if d.loginAs != nil {
		login = d.loginAs
	}
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: login.ns, Name: dbv1.NamesOf(login.name).AppSecret()}, &secret); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=%s sslmode=require connect_timeout=3",
		s.Spec.ClusterIP, secret.Data["username"]))
	if err != nil {
		return nil, err
	}
	cfg.Password = string(secret.Data["password"])
	// sslmode=verify-full by the Service's name, with the CA the cluster publishes,
	// as an application in the cluster connects (it reaches the ClusterIP by that name).
	if cfg.TLSConfig, err = d.verifyFull(ctx, service+"."+d.ns+".svc"); err != nil {
		return nil, err
	}
	return cfg, nil
}

// verifyFull is the TLS configuration of sslmode=verify-full for host, with the CA the
// cluster publishes in its Secret <cluster>-ca.
func (d *db) verifyFull(ctx context.Context, host string) (*tls.Config, error) {
	var ca corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).CASecret()}, &ca); err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.Data["ca.crt"]) {
		return nil, fmt.Errorf("the CA Secret %s has no ca.crt", dbv1.NamesOf(d.name).CASecret())
	}
	return &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12}, nil
}

func (d *db) exec(svc, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, svc)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

func (d *db) count(svc, table string) (int64, error) {
	var n int64
	err := d.queryRow(svc, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize(), nil, &n)
	return n, err
}

// queryRow runs one query through svc and scans its row.
func (d *db) queryRow(svc, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, svc)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

func (d *db) waitCount(svc, table string, n int64, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		got, err := d.count(svc, table)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("%d rows through -%s, want %d", got, svc, n)
		}
		return nil
	})
}

func (d *db) pods() []corev1.Pod {
	d.t.Helper()
	var pods corev1.PodList
	testutil.Eventually(d.t, apiPatience, func() error {
		return k8s.List(context.Background(), &pods, client.InNamespace(d.ns), client.MatchingLabels{dbv1.LabelCluster: d.name})
	})
	return pods.Items
}

// otherThan is the name of a pod of the cluster other than pod (the last one listed);
// it fails the test when there is none.
func (d *db) otherThan(pod string) string {
	d.t.Helper()
	other := ""
	for _, p := range d.pods() {
		if p.Name != pod {
			other = p.Name
		}
	}
	if other == "" {
		d.t.Fatalf("no pod of %s other than %s", d.name, pod)
	}
	return other
}

// dump logs what a failed test needs: the cluster's status, its pods and events.
func (d *db) dump() {
	ctx := context.Background()
	var pgc dbv1.PostgresCluster
	if k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc) == nil {
		d.t.Logf("status: phase %s primary %s ready %d conditions %+v", pgc.Status.Phase, pgc.Status.CurrentPrimary, pgc.Status.ReadyInstances, pgc.Status.Conditions)
	}
	for _, p := range d.pods() {
		d.t.Logf("pod %s: phase %s labels %v", p.Name, p.Status.Phase, p.Labels)
		for _, cs := range p.Status.ContainerStatuses {
			d.t.Logf("  container %s ready %v restarts %d state %+v", cs.Name, cs.Ready, cs.RestartCount, cs.State)
		}
		st, err := d.agentStatus(p.Name)
		d.t.Logf("  agent: %+v %v", st, err)
		logTail(d.t, p.Namespace, p.Name, "postgres", 40)
	}
	var operators corev1.PodList
	if k8s.List(ctx, &operators, client.InNamespace("pgpilot-system")) == nil {
		for _, p := range operators.Items {
			logTail(d.t, p.Namespace, p.Name, "controller", 60)
		}
	}
	var events corev1.EventList
	if k8s.List(ctx, &events, client.InNamespace(d.ns)) == nil {
		for _, e := range events.Items {
			d.t.Logf("event %s %s %s: %s", e.LastTimestamp.Format(time.TimeOnly), e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// logTail logs the last lines of a container's log.
func logTail(t testing.TB, ns, pod, container string, lines int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := clientset.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: &lines}).DoRaw(ctx)
	if err != nil {
		t.Logf("  log of %s/%s: %v", pod, container, err)
		return
	}
	t.Logf("  last %d lines of %s/%s:\n%s", lines, pod, container, b)
}

// logWindow logs the lines of a container's log written from a second before from to
// a second after to, by the kubelet's timestamps: what each part did around a moment
// the test measured (the longest time without an acknowledged write, say).
func logWindow(t testing.TB, ns, pod, container string, from, to time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	since := metav1.NewTime(from.Add(-time.Second))
	b, err := clientset.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Timestamps: true, SinceTime: &since}).DoRaw(ctx)
	if err != nil {
		t.Logf("  log of %s/%s: %v", pod, container, err)
		return
	}
	var window []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		stamp, _, _ := strings.Cut(line, " ")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err == nil && at.After(to.Add(time.Second)) {
			break
		}
		window = append(window, line)
	}
	t.Logf("  log of %s/%s from %s to %s:\n%s", pod, container, since.UTC().Format("15:04:05.000"),
		to.Add(time.Second).UTC().Format("15:04:05.000"), strings.Join(window, ""))
}

func (d *db) pod(name string) corev1.Pod {
	d.t.Helper()
	p, err := d.getPod(name)
	if err != nil {
		d.t.Fatal(err)
	}
	return p
}

// getPod is pod for a condition polled while the pod may be gone: the StatefulSet makes a
// deleted pod again, so its absence is a state to wait through, not a failure.
func (d *db) getPod(name string) (corev1.Pod, error) {
	var p corev1.Pod
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: name}, &p)
	return p, err
}

// waitRouted waits until each Service in svcs ("rw", "ro") takes a connection from the
// node. A pod that just became ready reaches a Service's endpoints and then kube-proxy's
// rules a moment later; until then a connection to the cluster IP is refused.
func (d *db) waitRouted(timeout time.Duration, svcs ...string) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		for _, svc := range svcs {
			if err := d.exec(svc, "SELECT 1"); err != nil {
				return fmt.Errorf("-%s: %w", svc, err)
			}
		}
		return nil
	})
}

// agentStatus asks an instance's agent for its /status at the pod's IP (the tests run in
// the node's network namespace, which reaches pod IPs).
func (d *db) agentStatus(name string) (agentapi.Status, error) {
	p, err := d.getPod(name)
	if err != nil {
		return agentapi.Status{}, err
	}
	if p.Status.PodIP == "" {
		return agentapi.Status{}, fmt.Errorf("pod %s has no IP yet", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	token, http, err := d.agentAccess(ctx, name)
	if err != nil {
		return agentapi.Status{}, err
	}
	return agentapi.NewClient(agentapi.BaseURL(p.Status.PodIP), token, http).Status(ctx)
}

// systemIdentifier is the database system identifier pod's agent reports, waiting up to
// 30 s for an agent that does not answer yet or has not read it yet.
func (d *db) systemIdentifier(pod string) string {
	d.t.Helper()
	var st agentapi.Status
	testutil.Eventually(d.t, 30*time.Second, func() (err error) {
		if st, err = d.agentStatus(pod); err == nil && st.SystemIdentifier == "" {
			err = fmt.Errorf("%s's agent reports no system identifier yet", pod)
		}
		return err
	})
	return st.SystemIdentifier
}

// agentAccess is what calling pod's agent takes, as the operator calls it: the
// operator's token, and an HTTP client that verifies the agent's certificate with the
// cluster's CA.
func (d *db) agentAccess(ctx context.Context, pod string) (string, *http.Client, error) {
	n := dbv1.NamesOf(d.name)
	var token, ca corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.AgentTokenSecret()}, &token); err != nil {
		return "", nil, err
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.CASecret()}, &ca); err != nil {
		return "", nil, err
	}
	return string(token.Data["token"]), testutil.AgentHTTP(pod+"."+n.HeadlessService()+"."+d.ns+".svc", ca.Data["ca.crt"]), nil
}

// waitStreaming waits until the primary reports n standbys streaming from it.
func (d *db) waitStreaming(n int, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		primary := d.cluster().Status.CurrentPrimary
		st, err := d.agentStatus(primary)
		if err != nil {
			return err
		}
		streaming := 0
		for _, r := range st.Replicas {
			if r.State == "streaming" {
				streaming++
			}
		}
		if st.Role != agentapi.RolePrimary || streaming != n {
			return fmt.Errorf("%s is %s with %d standbys streaming (%+v), want primary with %d", primary, st.Role, streaming, st.Replicas, n)
		}
		return nil
	})
}

// writes records the inserts into table t through -rw, each with its own id, as
// testutil.Attempts: check compares them with the table by id (testutil.CheckRows).
type writes struct {
	d        *db
	next     int64
	attempts []testutil.Attempt
}

func (d *db) newTable() *writes {
	d.t.Helper()
	if err := d.exec("rw", "CREATE TABLE t (id bigint PRIMARY KEY, at timestamptz DEFAULT now())"); err != nil {
		d.t.Fatal(err)
	}
	return &writes{d: d, next: 1}
}

// try inserts the next id through -rw once and records the attempt.
func (w *writes) try() error {
	a := testutil.Attempt{ID: w.next, Start: time.Now()}
	w.next++
	a.Err = w.d.exec("rw", "INSERT INTO t (id) VALUES ($1)", a.ID)
	a.End = time.Now()
	w.attempts = append(w.attempts, a)
	return a.Err
}

// acked counts the acknowledged inserts.
func (w *writes) acked() int64 {
	var n int64
	for _, a := range w.attempts {
		if a.Acked() {
			n++
		}
	}
	return n
}

// insert writes n rows one transaction each through -rw and fails the test on an error.
func (w *writes) insert(n int) {
	w.d.t.Helper()
	for range n {
		if err := w.try(); err != nil {
			w.d.t.Fatal(err)
		}
	}
}

// untilWritable retries one insert through -rw until it is acknowledged and returns how
// long that took from since.
func (w *writes) untilWritable(since time.Time, timeout time.Duration) time.Duration {
	w.d.t.Helper()
	testutil.Eventually(w.d.t, timeout, w.try)
	return time.Since(since)
}

// check asserts that every acknowledged row is on the primary and, once replicated, on
// the replicas behind -ro.
func (w *writes) check() {
	w.d.t.Helper()
	if check := w.d.checkRows("t", w.attempts); len(check.Lost) > 0 {
		w.d.t.Fatalf("%d of %d acknowledged writes lost: ids %v", len(check.Lost), check.Acked, check.Lost)
	}
	n, err := w.d.count("rw", "t")
	if err != nil {
		w.d.t.Fatal(err)
	}
	w.d.waitCount("ro", "t", n, time.Minute)
}

// checkRows compares table, read through -rw, with the attempts that wrote into it
// (testutil.CheckRows), and fails the test when it cannot read it.
func (d *db) checkRows(table string, attempts []testutil.Attempt) testutil.RowCheck {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, "rw")
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	check, err := testutil.CheckRows(ctx, conn, table, attempts)
	if err != nil {
		d.t.Fatal(err)
	}
	return check
}

// postmasters returns the PIDs of the postmasters running in pod's containers: postgres
// processes of the pod's cgroup whose parent is not postgres. The tests run as root in
// the host's PID namespace.
func postmasters(pod corev1.Pod) ([]int, error) {
	uid := string(pod.UID)
	under := strings.ReplaceAll(uid, "-", "_")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || comm(pid) != "postgres" {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !(strings.Contains(string(cg), "pod"+uid) || strings.Contains(string(cg), "pod"+under)) {
			continue
		}
		if comm(ppid(pid)) == "postgres" {
			continue
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// update changes the cluster's spec with a merge patch (no conflict with the operator's
// status writes).
func (d *db) update(change func(*dbv1.PostgresCluster)) {
	d.t.Helper()
	pgc := d.cluster()
	patch := client.MergeFrom(pgc.DeepCopy())
	change(&pgc)
	if err := k8s.Patch(context.Background(), &pgc, patch); err != nil {
		d.t.Fatal(err)
	}
}
