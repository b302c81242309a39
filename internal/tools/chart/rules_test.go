package chart_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/pgpilot/pgpilot/internal/tools/chart"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// The alert rules the chart renders, run by a real promtool against series written to
// make each alert fire, and not fire (testdata/rules_test.yaml), with every optional
// rule rendered (synchronous replicas, a backup schedule, a pooler). promtool is built
// from the Go module proxy once (make promtool, which make test-quick runs first and
// exports as PROMTOOL).
func TestAlertRules(t *testing.T) {
	promtool := promtoolPath(t)
	m := renderWith(t, chart.Options{
		Name: name, Namespace: namespace,
		APIVersions: []string{"monitoring.coreos.com/v1", podMonitorAPI, "monitoring.coreos.com/v1/PrometheusRule"},
		Values: readmeValues(set("monitoring.enabled", true), set("postgresql.synchronousReplicas", 1),
			set("backup.schedule", "0 3 * * *"), set("backup.store.volume.claimName", "backups"),
			set("pooler.instances", 2), set("operator.poolerImage", poolerImage)),
	})
	obj, ok := m.find("PrometheusRule", name)
	if !ok {
		t.Fatal("no PrometheusRule rendered")
	}
	rules, err := yaml.Marshal(obj.Raw["spec"])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// promtoolPath is the promtool the Makefile builds.
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := devenv.Tool("PROMTOOL", "promtool")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
