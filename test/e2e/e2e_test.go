//go:build e2e

// Package e2e runs pgpilot on a real single-node Kubernetes cluster (hack/localcluster),
// deployed from config/default with locally built images: `make e2e` builds, starts and
// deploys, then runs these tests inside the cluster's network namespace. They are
// behind the e2e build tag so that `go test ./...` does not build them; they never skip.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/sidecar"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// version is the PostgreSQL major of the local image (E2E_PG_MAJOR in hack/e2e/lib.sh).
var version = envOr("E2E_PG_MAJOR", "15")

var k8s client.Client

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
	scheme, err := sidecar.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// db is one PostgresCluster of a test, in a namespace of its own that enforces the
// restricted Pod Security Standard.
type db struct {
	t    *testing.T
	ns   string
	name string
}

func newDB(t *testing.T, replicas int32, opts ...func(*dbv1.PostgresCluster)) *db {
	t.Helper()
	d := &db{t: t, ns: "e2e-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), name: "my-db"}
	if len(d.ns) > 60 {
		d.ns = d.ns[:60]
	}
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

func (d *db) cluster() dbv1.PostgresCluster {
	d.t.Helper()
	var pgc dbv1.PostgresCluster
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc); err != nil {
		d.t.Fatal(err)
	}
	return pgc
}

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
	return pgc
}

// conn connects as the application owner through Service svc ("rw" or "ro"), by its
// cluster IP: the tests run in the node's network namespace, where kube-proxy routes it.
func (d *db) conn(ctx context.Context, svc string) (*pgx.Conn, error) {
	var s corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name + "-" + svc}, &s); err != nil {
		return nil, err
	}
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name + "-app"}, &secret); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=%s connect_timeout=3",
		s.Spec.ClusterIP, secret.Data["username"]))
	if err != nil {
		return nil, err
	}
	cfg.Password = string(secret.Data["password"])
	return pgx.ConnectConfig(ctx, cfg)
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, svc)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int64
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n)
	return n, err
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
	if err := k8s.List(context.Background(), &pods, client.InNamespace(d.ns), client.MatchingLabels{dbv1.LabelCluster: d.name}); err != nil {
		d.t.Fatal(err)
	}
	return pods.Items
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
	}
	var events corev1.EventList
	if k8s.List(ctx, &events, client.InNamespace(d.ns)) == nil {
		for _, e := range events.Items {
			d.t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// The example comes up: three ready pods, running as non-root under the restricted
// profile, a primary and two streaming replicas; a write through -rw is read through -ro.
func TestExampleComesUp(t *testing.T) {
	d := newDB(t, 3)
	start := time.Now()
	pgc := d.waitHealthy(3, 10*time.Minute)
	t.Logf("Healthy %s after creation; primary %s", time.Since(start).Round(time.Second), pgc.Status.CurrentPrimary)
	roles := map[string]int{}
	for _, p := range d.pods() {
		roles[p.Labels[dbv1.LabelRole]]++
		sc := p.Spec.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("pod %s does not run as non-root", p.Name)
		}
	}
	if roles[dbv1.RolePrimary] != 1 || roles[dbv1.RoleReplica] != 2 {
		t.Errorf("roles %v, want one primary and two replicas", roles)
	}
	if err := d.exec("rw", "CREATE TABLE t (id bigserial PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if err := d.exec("rw", "INSERT INTO t (v) SELECT 'x' FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	d.waitCount("ro", "t", 100, time.Minute)
	if err := d.exec("ro", "INSERT INTO t (v) VALUES ('no')"); err == nil {
		t.Error("a write through -ro succeeded")
	}
}

// Deleting the primary's pod fails over: a replica takes writes through -rw, and the
// old primary's pod comes back as a replica.
func TestPrimaryPodDeletedFailsOver(t *testing.T) {
	d := newDB(t, 3, func(c *dbv1.PostgresCluster) { c.Spec.PostgreSQL.SynchronousReplicas = 1 })
	pgc := d.waitHealthy(3, 10*time.Minute)
	old := pgc.Status.CurrentPrimary
	if err := d.exec("rw", "CREATE TABLE t (id bigserial PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	acknowledged := 0
	for range 200 {
		if err := d.exec("rw", "INSERT INTO t DEFAULT VALUES"); err == nil {
			acknowledged++
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: old}}
	deleted := time.Now()
	if err := k8s.Delete(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, func() error { return d.exec("rw", "INSERT INTO t DEFAULT VALUES") })
	acknowledged++
	t.Logf("first write through -rw %s after deleting the primary's pod", time.Since(deleted).Round(10*time.Millisecond))
	now := d.waitHealthy(3, 5*time.Minute)
	if now.Status.CurrentPrimary == old {
		// The pod was back before the failover delay ran out: it restarted as primary.
		t.Logf("%s came back as primary before a failover was needed", old)
	}
	n, err := d.count("rw", "t")
	if err != nil {
		t.Fatal(err)
	}
	if n < int64(acknowledged) {
		t.Errorf("%d rows, %d writes acknowledged: synchronous mode lost some", n, acknowledged)
	}
}

// Scaling up adds streaming replicas, scaling down removes the highest ordinals and
// keeps their volumes.
func TestScale(t *testing.T) {
	d := newDB(t, 3)
	d.waitHealthy(3, 10*time.Minute)
	for _, n := range []int32{5, 2} {
		pgc := d.cluster()
		pgc.Spec.Replicas = n
		if err := k8s.Update(context.Background(), &pgc); err != nil {
			t.Fatal(err)
		}
		d.waitHealthy(n, 10*time.Minute)
	}
	var pvcs corev1.PersistentVolumeClaimList
	if err := k8s.List(context.Background(), &pvcs, client.InNamespace(d.ns)); err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != 5 {
		t.Errorf("%d volume claims after scaling 3 → 5 → 2, want 5 (scale-down keeps volumes)", len(pvcs.Items))
	}
}

// Deleting a cluster keeps its volumes.
func TestDeletedClusterKeepsItsVolumes(t *testing.T) {
	d := newDB(t, 1)
	d.waitHealthy(1, 10*time.Minute)
	pgc := d.cluster()
	if err := k8s.Delete(context.Background(), &pgc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, func() error {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the cluster is still there: %v", err)
		}
		if pods := d.pods(); len(pods) > 0 {
			return fmt.Errorf("%d pods left", len(pods))
		}
		return nil
	})
	var pvcs corev1.PersistentVolumeClaimList
	if err := k8s.List(context.Background(), &pvcs, client.InNamespace(d.ns)); err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != 1 {
		t.Errorf("%d volume claims after deleting the cluster, want 1", len(pvcs.Items))
	}
}
