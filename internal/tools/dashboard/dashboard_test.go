package dashboard

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// The chart ships what Build makes (make manifests writes it).
func TestChartDashboardIsCurrent(t *testing.T) {
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(filepath.Join(root, "helm-charts", "postgrescluster", "dashboards", "pgpilot.json"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := Build()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, built) {
		t.Error("helm-charts/postgrescluster/dashboards/pgpilot.json is stale: run make manifests")
	}
}

// Every panel's query is PromQL (promtool parses it), and every pgpilot series it reads
// is documented in docs/monitoring.md.
func TestQueries(t *testing.T) {
	exprs, err := Exprs()
	if err != nil {
		t.Fatal(err)
	}
	promtool, err := devenv.Tool("PROMTOOL", "promtool")
	if err != nil {
		t.Fatal(err)
	}
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join(root, "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`\bpgpilot_[a-z_]+`)
	for _, e := range exprs {
		if out, err := exec.Command(promtool, "--experimental", "promql", "format", e).CombinedOutput(); err != nil {
			t.Errorf("%s: %v: %s", e, err, out)
		}
		for _, n := range name.FindAllString(e, -1) {
			base := regexp.MustCompile(`_bucket$`).ReplaceAllString(n, "")
			if !bytes.Contains(docs, []byte("`"+base+"`")) {
				t.Errorf("%s reads %s, which docs/monitoring.md does not list", e, base)
			}
		}
	}
	if len(exprs) < 30 {
		t.Errorf("only %d queries", len(exprs))
	}
}
