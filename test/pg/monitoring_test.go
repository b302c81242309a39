//go:build monitoring

package pg

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pgpilot/pgpilot/internal/tools/chart"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A real Prometheus scrapes real agents over HTTPS with a token and the cluster's CA,
// evaluates the alert rules the chart renders for the cluster, and
// PgpilotWALArchiveFailing fires after its 5 minutes once the store refuses the
// archive's credentials, and resolves once it takes them again (make
// test-monitoring; about 8 minutes, so not in make test). make e2e-monitoring proves
// the same on the local node through the PodMonitor.
func TestPrometheusAlertsOnRealInstances(t *testing.T) {
	t.Parallel()
	bin, err := devenv.Tool("PROMETHEUS", "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	s := newS3Store(t)
	c := backedUpCluster(t, s, 2)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")

	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chart.Load(filepath.Join(root, "helm-charts", "postgrescluster"))
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := chart.Render(ch, chart.Options{Name: c.name, Namespace: c.namespace,
		APIVersions: []string{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule"},
		Values: map[string]any{"replicas": 2, "version": "15", "monitoring": map[string]any{"enabled": true},
			"operator": map[string]any{"agentImage": "pgpilot:pg-tests"}}})
	if err != nil {
		t.Fatal(err)
	}
	var rules []byte
	for _, d := range rendered.Documents {
		var obj struct {
			Kind string         `json:"kind"`
			Spec map[string]any `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(d.YAML), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "PrometheusRule" {
			if rules, err = yaml.Marshal(obj.Spec); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rules == nil {
		t.Fatal("the chart rendered no PrometheusRule")
	}
	ca := filepath.Join(c.dir, "prometheus-ca.crt")
	mustWrite(t, ca, c.caPEM)
	var jobs []any
	for _, in := range c.instances {
		// What the PodMonitor's job makes of each pod: HTTPS with the metrics token and
		// the CA, and namespace, pod and cluster labels.
		jobs = append(jobs, map[string]any{
			"job_name": in.pod, "scheme": "https",
			"authorization": map[string]any{"credentials": token},
			"tls_config":    map[string]any{"ca_file": ca, "server_name": in.pod + "." + c.name + "-headless." + c.namespace + ".svc"},
			"static_configs": []any{map[string]any{"targets": []string{in.ip + ":8008"},
				"labels": map[string]string{"namespace": c.namespace, "pod": in.pod, "cluster": c.name}}},
		})
	}
	prom := testutil.StartPrometheus(t, bin, jobs, rules)
	sel := fmt.Sprintf(`namespace=%q, cluster=%q`, c.namespace, c.name)
	testutil.Eventually(t, time.Minute, func() error {
		for _, q := range []string{`pgpilot_instance_role{` + sel + `, role="primary"} == 1`, `pgpilot_database_size_bytes{` + sel + `, datname="app"}`,
			`pgpilot_replica_lag_seconds{` + sel + `}`, `pgpilot_wal_archived_total{` + sel + `}`} {
			if n, err := prom.Count(q); err != nil || n == 0 {
				return fmt.Errorf("%s: %d series, %v", q, n, err)
			}
		}
		return nil
	})
	// Pending at the first evaluation, before the first scrapes; never firing.
	testutil.Eventually(t, 30*time.Second, func() error {
		return prom.Alert("PgpilotPrimaryUnavailable", map[string]string{"cluster": c.name}, "")
	})

	// The store refuses the archive's credentials: the alert after its 5 minutes.
	creds := filepath.Join(c.dir, "s3-credentials-"+c.name, "SECRET_ACCESS_KEY")
	mustWrite(t, creds, []byte("not-the-secret"))
	broke := time.Now()
	switchWAL := func() {
		p.mustExec("INSERT INTO t (v) VALUES ('x')")
		if err := p.superExec("SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
	}
	switchWAL()
	testutil.Eventually(t, time.Minute, func() error {
		if n, err := prom.Count(`pgpilot_wal_archive_failing{` + sel + `} == 1`); err != nil || n == 0 {
			return fmt.Errorf("archiving not failing yet (%v)", err)
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		return prom.Alert("PgpilotWALArchiveFailing", map[string]string{"cluster": c.name}, "pending")
	})
	testutil.Eventually(t, 7*time.Minute, func() error {
		return prom.Alert("PgpilotWALArchiveFailing", map[string]string{"cluster": c.name, "pod": p.pod}, "firing")
	})
	t.Logf("PgpilotWALArchiveFailing fired %s after the store refused the credentials", time.Since(broke).Round(time.Second))

	mustWrite(t, creds, []byte(s.srv.SecretAccessKey))
	fixed := time.Now()
	switchWAL()
	testutil.Eventually(t, 3*time.Minute, func() error {
		return prom.Alert("PgpilotWALArchiveFailing", map[string]string{"cluster": c.name}, "")
	})
	t.Logf("PgpilotWALArchiveFailing resolved %s after the store took them again", time.Since(fixed).Round(time.Second))
	if n, err := prom.Count(`pgpilot_wal_archive_failing{` + sel + `} == 0`); err != nil || n == 0 {
		t.Errorf("pgpilot_wal_archive_failing is not 0 again: %d, %v", n, err)
	}
}
