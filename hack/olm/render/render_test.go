package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A module laid out as operator-lifecycle-manager's: deploy/chart (templates, crds) and
// deploy/upstream/values.yaml.
func fakeModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"deploy/chart/Chart.yaml":                                  "apiVersion: v2\nname: olm\nversion: 0.0.0-dev\n",
		"deploy/chart/values.yaml":                                 "namespace: operator-lifecycle-manager\n",
		"deploy/chart/crds/0000_50_olm_00-catalogsources.crd.yaml": "kind: CustomResourceDefinition\nmetadata:\n  name: catalogsources.operators.coreos.com\n",
		"deploy/chart/templates/0000_50_olm_00-namespace.yaml":     "kind: Namespace\nmetadata:\n  name: {{ .Values.namespace }}\n",
		"deploy/chart/templates/0000_50_olm_08-catalog-operator.deployment.yaml": "kind: Deployment\nargs: [{{ .Values.catalog.opmImageArgs }}]\n" +
			"image: {{ .Values.catalog.image.ref }}\npull: {{ .Values.catalog.image.pullPolicy }}\n",
		"deploy/chart/templates/0000_50_olm_07-olm-operator.deployment.yaml":          "kind: Deployment\nimage: {{ .Values.olm.image.ref }}\n",
		"deploy/chart/templates/0000_50_olm_15-packageserver.yaml":                    "kind: ClusterServiceVersion\nreplicas: {{ .Values.package.replicaCount }}\nimage: {{ .Values.package.image.ref }}\n",
		"deploy/chart/templates/0000_50_olm_17-upstream-operators.catalogsource.yaml": "kind: CatalogSource\nimage: quay.io/operatorhubio/catalog:latest\n",
		"deploy/chart/templates/_helpers.tpl":                                         "{{- define \"x\" }}x{{ end }}\n",
		"deploy/upstream/values.yaml": "namespace: olm\nolm:\n  image:\n    ref: quay.io/operator-framework/olm@sha256:abc\n    pullPolicy: Always\n" +
			"catalog:\n  image:\n    ref: quay.io/operator-framework/olm@sha256:abc\n    pullPolicy: Always\npackage:\n  replicaCount: 2\n  image:\n    ref: quay.io/operator-framework/olm@sha256:abc\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRender(t *testing.T) {
	crds, manifests, err := render(fakeModule(t), "quay.io/operator-framework/olm:v0.28.0", "quay.io/operator-framework/opm:v1.35.0")
	if err != nil {
		t.Fatal(err)
	}
	m := string(manifests)
	for _, want := range []string{
		"name: olm\n", // the upstream values' namespace
		"image: quay.io/operator-framework/olm:v0.28.0\npull: IfNotPresent",
		"args: [--opmImage=quay.io/operator-framework/opm:v1.35.0]",
		"replicas: 1\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("the manifests lack %q:\n%s", want, m)
		}
	}
	for _, unwanted := range []string{"sha256:abc", "operatorhubio", "define"} {
		if strings.Contains(m, unwanted) {
			t.Errorf("the manifests hold %q:\n%s", unwanted, m)
		}
	}
	// The chart's order: its file names.
	if ns, olm, cat := strings.Index(m, "kind: Namespace"), strings.Index(m, "07-olm-operator"), strings.Index(m, "08-catalog-operator"); ns < 0 || ns > olm || olm > cat {
		t.Errorf("the manifests are not in the chart's order:\n%s", m)
	}
	if !strings.Contains(string(crds), "name: catalogsources.operators.coreos.com") {
		t.Errorf("the CRDs lack catalogsources:\n%s", crds)
	}
	if _, _, err := render(t.TempDir(), "a", "b"); err == nil {
		t.Error("a module without deploy/chart rendered")
	}
}
