//go:build e2e && monitoring

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/cli"
	"github.com/pgpilot/pgpilot/internal/tools/dashboard"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The monitoring proof on the local node (make e2e-monitoring): the chart renders the
// PodMonitor and PrometheusRule (the Prometheus Operator's CRDs are installed, not the
// operator itself); a real Prometheus scrapes the instances with exactly the
// PodMonitor's settings (its token Secret, its CA, its relabeling) and the operator,
// and evaluates the PrometheusRule's groups. Its /api/v1/query returns a series of each
// group for the example cluster, every dashboard query runs, the archiving alert fires
// when the store breaks and resolves when it is back, and kubectl pgpilot status shows
// the primary, both standbys with lag and the last backup.
func TestMonitoring(t *testing.T) {
	prometheusBin := os.Getenv("PROMETHEUS")
	if prometheusBin == "" {
		t.Fatal("PROMETHEUS is not set: run make e2e-monitoring, which builds it")
	}
	installMonitoringCRDs(t)
	const bucket = "pgpilot"
	ctx := context.Background()
	d := newDB(t, 3, func(c *dbv1.PostgresCluster) {
		// Before the cluster, so the pods find it at once.
		if err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: "queries"}, Data: map[string]string{"queries.yaml": `
pg_database_count:
  query: SELECT count(*) AS total FROM pg_database
  metrics:
    - total: {usage: GAUGE, description: Databases}
`}}); err != nil {
			t.Fatal(err)
		}
		c.Spec.Monitoring = dbv1.MonitoringSpec{Enabled: true, CustomQueries: &dbv1.CustomQueriesSource{Name: "queries"}}
		c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Path: "e2e", S3: &dbv1.S3Store{
			Endpoint: "http://s3:7070", Bucket: bucket, Credentials: dbv1.S3Credentials{SecretName: "s3-credentials"},
		}}}
		c.Spec.PostgreSQL.SuperuserNetworkAccess = true // switchWAL
	})
	s3 := startS3(t, d.ns)
	makeBucket(t, s3, bucket)
	pgc := d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, 2*time.Minute)

	prom := startPrometheus(t, prometheusBin, d)

	// kubectl pgpilot backup, then a series of every group.
	if out, err := runPlugin(d.ns, "backup", d.name, "--wait", "5m"); err != nil {
		t.Fatalf("kubectl pgpilot backup: %v\n%s", err, out)
	}
	w := d.newTable()
	w.insert(50)
	sel := fmt.Sprintf(`namespace=%q, cluster=%q`, d.ns, d.name)
	for _, q := range []struct{ group, query string }{
		{"instance role", `pgpilot_instance_role{` + sel + `, role="primary"} == 1`},
		{"databases", `pgpilot_database_xact_commit_total{` + sel + `, datname="app"}`},
		{"database size", `pgpilot_database_size_bytes{` + sel + `, datname="app"}`},
		{"connections", `pgpilot_backends{` + sel + `}`},
		{"locks and transactions", `pgpilot_oldest_transaction_seconds{` + sel + `}`},
		{"checkpointer", `pgpilot_checkpoints_total{` + sel + `, kind="timed"}`},
		{"WAL", `rate(pgpilot_wal_bytes_total{` + sel + `}[1m]) > 0`},
		{"replication bytes", `pgpilot_replica_lag_bytes{` + sel + `}`},
		{"replication seconds", `pgpilot_replica_lag_seconds{` + sel + `, kind="replay"}`},
		{"slots", `pgpilot_replication_slot_retained_bytes{` + sel + `}`},
		{"archiver", `pgpilot_wal_archived_total{` + sel + `} > 0`},
		{"xid age", `pgpilot_database_xid_age{` + sel + `, datname="template0"}`},
		{"volume", `pgpilot_volume_free_bytes{` + sel + `}`},
		{"custom query", `pg_database_count_total{` + sel + `, datname="postgres"} >= 3`},
		{"operator: phase", `pgpilot_cluster_phase{` + sel + `, phase="Healthy"} == 1`},
		{"operator: reconciles", `controller_runtime_reconcile_total{controller="failover"}`},
		{"operator: Helm reconciles", `controller_runtime_reconcile_total{controller="postgrescluster-controller"}`},
		{"backups", `pgpilot_backup_last_success_timestamp_seconds{` + sel + `}`},
		{"backup size", `pgpilot_backup_last_size_bytes{` + sel + `} > 0`},
	} {
		testutil.Eventually(t, 2*time.Minute, func() error {
			n, err := prom.Count(q.query)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("%s: no series for %s", q.group, q.query)
			}
			return nil
		})
	}
	n, err := prom.Count(`pgpilot_replica_lag_bytes{` + sel + `}`)
	if err != nil || n != 2 {
		t.Errorf("pgpilot_replica_lag_bytes: %d series (%v), want one per standby", n, err)
	}

	// Every dashboard query runs; say which are empty (a failover, for one, has not
	// happened).
	exprs, err := dashboard.Exprs()
	if err != nil {
		t.Fatal(err)
	}
	empty := 0
	for _, e := range exprs {
		q := strings.NewReplacer("$namespace", d.ns, "$cluster", d.name).Replace(e)
		n, err := prom.Count(q)
		if err != nil {
			t.Errorf("dashboard query %s: %v", q, err)
		}
		if n == 0 {
			empty++
			t.Logf("dashboard query with no data yet: %s", q)
		}
	}
	t.Logf("%d of %d dashboard queries have data", len(exprs)-empty, len(exprs))

	// kubectl pgpilot status: the primary, both standbys with their lag, the backup.
	out, err := runPlugin(d.ns, "status", d.name)
	if err != nil {
		t.Fatalf("kubectl pgpilot status: %v\n%s", err, out)
	}
	t.Logf("kubectl pgpilot status %s:\n%s", d.name, out)
	if !strings.Contains(out, "Primary:       "+pgc.Status.CurrentPrimary+" (timeline ") || !strings.Contains(out, "Last backup:   "+d.name+"-manual-") ||
		strings.Count(out, "streaming (async)") != 2 || strings.Contains(out, "Replication:   unknown") {
		t.Errorf("kubectl pgpilot status does not show the primary, two streaming standbys and the backup:\n%s", out)
	}

	// The archiving alert: the store goes away (its Service), WAL is switched, the
	// alert fires after its 5 minutes; the store comes back and it resolves.
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: "s3"}, &svc); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, &svc); err != nil {
		t.Fatal(err)
	}
	broke := time.Now()
	// A new segment to archive now and then (each switch leaves 16 MiB on the volume
	// while the archive is away): the archiver tries it at once and fails.
	switchNow := throttle(15*time.Second, d.switchWAL)
	testutil.Eventually(t, 2*time.Minute, func() error {
		switchNow()
		n, err := prom.Count(`pgpilot_wal_archive_failing{` + sel + `} == 1`)
		if err == nil && n == 0 {
			err = fmt.Errorf("archiving is not failing yet")
		}
		return err
	})
	testutil.Eventually(t, 8*time.Minute, func() error {
		return prom.Alert("PgpilotWALArchiveFailing", map[string]string{"namespace": d.ns}, "firing")
	})
	t.Logf("PgpilotWALArchiveFailing fired %s after the store went away", time.Since(broke).Round(time.Second))
	back := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "s3"},
		Spec: corev1.ServiceSpec{Selector: svc.Spec.Selector, Ports: svc.Spec.Ports}}
	if err := k8s.Create(ctx, back); err != nil {
		t.Fatal(err)
	}
	fixed := time.Now()
	// The archiver retries the failed segment by itself within a minute; a new segment
	// wakes it sooner.
	switchNow = throttle(15*time.Second, d.switchWAL)
	testutil.Eventually(t, 5*time.Minute, func() error {
		switchNow()
		if err := prom.Alert("PgpilotWALArchiveFailing", map[string]string{"namespace": d.ns}, ""); err != nil {
			return err
		}
		return nil
	})
	t.Logf("PgpilotWALArchiveFailing resolved %s after the store came back", time.Since(fixed).Round(time.Second))
}

// installMonitoringCRDs installs the PodMonitor and PrometheusRule CRDs (schemas of
// their own that accept any spec: the chart's capability checks and the API server's
// storage are what matter here), unless the Prometheus Operator's are there.
func installMonitoringCRDs(t *testing.T) {
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, f := range []string{"monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "test", "testdata", "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &crd.Object); err != nil {
			t.Fatal(err)
		}
		if err := k8s.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		// The restarted operator must find the kind served.
		testutil.Eventually(t, time.Minute, func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
				return err
			}
			conditions, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conditions {
				if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CustomResourceDefinition %s is not established yet", crd.GetName())
		})
	}
	// The operator learns which kinds the API server serves when it starts (Helm's
	// capabilities): restart it, as installing the Prometheus Operator after pgpilot
	// would need too.
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace("pgpilot-system"), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if err := k8s.Delete(ctx, &pods.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 3*time.Minute, func() error {
		var now corev1.PodList
		if err := k8s.List(ctx, &now, client.InNamespace("pgpilot-system"), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
			return err
		}
		for _, p := range now.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			}
			if ready && p.DeletionTimestamp == nil && !slices.ContainsFunc(pods.Items, func(o corev1.Pod) bool { return o.UID == p.UID }) {
				return nil
			}
		}
		return fmt.Errorf("the operator's new pod is not ready")
	})
}

// switchWAL writes a row and switches the primary to a new WAL segment, as the
// superuser, so the archiver has a segment to archive.
func (d *db) switchWAL() {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := d.superuserConn(ctx)
	if err != nil {
		d.t.Log(err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS wal_switches (at timestamptz); INSERT INTO wal_switches VALUES (now()); SELECT pg_switch_wal()"); err != nil {
		d.t.Log(err)
	}
}

// throttle returns fn, run at most once per period.
func throttle(period time.Duration, fn func()) func() {
	var last time.Time
	return func() {
		if time.Since(last) >= period {
			last = time.Now()
			fn()
		}
	}
}

// The plugin's controller-runtime client logs nothing the test needs (cli.Main does
// the same).
func init() { ctrllog.SetLogger(logr.Discard()) }

// runPlugin runs kubectl pgpilot in this process against the local cluster.
func runPlugin(ns string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := cli.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out})
	cmd.SetArgs(append([]string{"--kubeconfig", os.Getenv("KUBECONFIG"), "-n", ns}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// startPrometheus runs Prometheus with the rendered PodMonitor as a scrape job, the
// operator's metrics as another, and the rendered PrometheusRule's groups.
func startPrometheus(t *testing.T, bin string, d *db) *testutil.Prometheus {
	t.Helper()
	ctx := context.Background()
	pm := &unstructured.Unstructured{}
	pm.SetAPIVersion("monitoring.coreos.com/v1")
	pm.SetKind("PodMonitor")
	pr := pm.DeepCopy()
	pr.SetKind("PrometheusRule")
	testutil.Eventually(t, 2*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name}, pm); err != nil {
			return err
		}
		return k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: d.name}, pr)
	})
	job, err := scrapeJob(ctx, d.ns, pm, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rules, err := yaml.Marshal(map[string]any{"groups": pr.Object["spec"].(map[string]any)["groups"]})
	if err != nil {
		t.Fatal(err)
	}
	return testutil.StartPrometheus(t, bin, []any{job, operatorJob()}, rules)
}

// scrapeJob is the scrape configuration the Prometheus Operator makes of a PodMonitor
// with one endpoint: pods by the selector and port name, HTTPS with the token and CA
// Secrets as files, and the PodMonitor's relabelings after the standard ones.
func scrapeJob(ctx context.Context, ns string, pm *unstructured.Unstructured, dir string) (map[string]any, error) {
	spec := pm.Object["spec"].(map[string]any)
	ep := spec["podMetricsEndpoints"].([]any)[0].(map[string]any)
	secret := func(ref map[string]any, file string) (string, error) {
		var s corev1.Secret
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref["name"].(string)}, &s); err != nil {
			return "", err
		}
		path := filepath.Join(dir, file)
		return path, os.WriteFile(path, s.Data[ref["key"].(string)], 0o600)
	}
	token, err := secret(ep["bearerTokenSecret"].(map[string]any), "token")
	if err != nil {
		return nil, err
	}
	tlsConfig := ep["tlsConfig"].(map[string]any)
	ca, err := secret(tlsConfig["ca"].(map[string]any)["secret"].(map[string]any), "ca.crt")
	if err != nil {
		return nil, err
	}
	relabel := []any{}
	for k, v := range spec["selector"].(map[string]any)["matchLabels"].(map[string]any) {
		relabel = append(relabel, map[string]any{"source_labels": []string{"__meta_kubernetes_pod_label_" + sanitize(k)}, "regex": v, "action": "keep"})
	}
	relabel = append(relabel,
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_port_name"}, "regex": ep["port"], "action": "keep"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"})
	for _, r := range ep["relabelings"].([]any) {
		r := r.(map[string]any)
		relabel = append(relabel, map[string]any{"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]})
	}
	return map[string]any{
		"job_name":              "podMonitor/" + ns + "/" + pm.GetName(),
		"scheme":                ep["scheme"],
		"metrics_path":          ep["path"],
		"authorization":         map[string]any{"credentials_file": token},
		"tls_config":            map[string]any{"ca_file": ca, "server_name": tlsConfig["serverName"]},
		"kubernetes_sd_configs": []any{map[string]any{"role": "pod", "kubeconfig_file": os.Getenv("KUBECONFIG"), "namespaces": map[string]any{"names": []string{ns}}}},
		"relabel_configs":       relabel,
	}, nil
}

// operatorJob scrapes both operator containers' metrics, keeping their own namespace
// and cluster labels (docs/monitoring.md: honorLabels).
func operatorJob() map[string]any {
	return map[string]any{
		"job_name":     "pgpilot-operator",
		"honor_labels": true,
		"kubernetes_sd_configs": []any{map[string]any{"role": "pod", "kubeconfig_file": os.Getenv("KUBECONFIG"),
			"namespaces": map[string]any{"names": []string{"pgpilot-system"}}}},
		"relabel_configs": []any{
			map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_port_name"}, "regex": ".*-metrics", "action": "keep"},
		},
	}
}

func sanitize(label string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, label)
}
