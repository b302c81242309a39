package bundle

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// watchNamespaceFromOLM is how both containers learn the OperatorGroup's namespaces.
var watchNamespaceFromOLM = &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
	FieldPath: "metadata.annotations['olm.targetNamespaces']",
}}

// makefileVar returns the default of a `NAME ?= value` line of the Makefile.
func makefileVar(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + ` \?= (.*)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("the Makefile has no %s ?= line", name)
	}
	return strings.TrimSpace(string(m[1]))
}

// readmeExample is the README's PostgresCluster, as YAML text and as an object.
func readmeExample(t *testing.T) (string, map[string]any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(data)
	if m == nil {
		t.Fatal("README.md has no yaml block")
	}
	var obj map[string]any
	if err := yaml.Unmarshal(m[1], &obj); err != nil {
		t.Fatal(err)
	}
	return string(m[1]), obj
}

// configDefault is what `kubectl apply -k config/default` installs.
func configDefault(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := devenv.BuildKustomization(filepath.Join(repoRoot(t), "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatal(err)
	}
}

func TestCSVIdentity(t *testing.T) {
	csv := loadBundle(t).CSV
	version := makefileVar(t, "VERSION")
	if csv.Name != "pgpilot.v"+version || csv.Spec.Version.String() != version {
		t.Errorf("CSV %s version %s, want pgpilot.v%s (VERSION in the Makefile)", csv.Name, csv.Spec.Version, version)
	}
	want := map[string]string{
		// Failover, switchover, rolling updates, backups and restore are proven end to
		// end on a Kubernetes node (test/e2e), metrics, alerts and the dashboard's
		// queries with a real Prometheus there (make e2e-monitoring), and there too
		// major version upgrades, tuning from the resources through a rolling update,
		// and careless specs explained in the status (docs/features.md, "Auto Pilot").
		"capabilities": "Auto Pilot",
		"categories":   "Database",
	}
	for k, v := range want {
		if csv.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, csv.Annotations[k], v)
		}
	}
	if csv.Spec.DisplayName == "" || csv.Spec.Description == "" || len(csv.Spec.Keywords) == 0 ||
		len(csv.Spec.Maintainers) == 0 || len(csv.Spec.Links) == 0 || csv.Spec.Provider.Name == "" {
		t.Errorf("the CSV lacks some of display name, description, keywords, maintainers, links and provider: %+v", csv.Spec)
	}
	// The description's example is the README's, word for word.
	text, _ := readmeExample(t)
	if !strings.Contains(csv.Spec.Description, "```yaml\n"+text+"```") {
		t.Errorf("the CSV description does not show the README example:\n%s", text)
	}
}

// The first example OperatorHub offers is the README's.
func TestALMExamplesStartWithTheREADMEExample(t *testing.T) {
	csv := loadBundle(t).CSV
	var examples []map[string]any
	if err := json.Unmarshal([]byte(csv.Annotations["alm-examples"]), &examples); err != nil {
		t.Fatal(err)
	}
	_, want := readmeExample(t)
	if len(examples) == 0 {
		t.Fatal("no alm-examples")
	}
	if diff := cmp.Diff(want, examples[0]); diff != "" {
		t.Errorf("first alm-example (-README +CSV):\n%s", diff)
	}
}

// The icon is docs/images/pgpilot-icon.svg.
func TestIcon(t *testing.T) {
	csv := loadBundle(t).CSV
	svg, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "images", "pgpilot-icon.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if len(csv.Spec.Icon) != 1 || csv.Spec.Icon[0].MediaType != "image/svg+xml" {
		t.Fatalf("icon %+v, want one image/svg+xml", csv.Spec.Icon)
	}
	got, err := base64.StdEncoding.DecodeString(csv.Spec.Icon[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(svg) {
		t.Error("the CSV icon is not docs/images/pgpilot-icon.svg")
	}
}

// The CRD uses CEL's quantity library (Kubernetes 1.29+), and the chart says so too.
func TestMinKubeVersion(t *testing.T) {
	csv := loadBundle(t).CSV
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "helm-charts", "postgrescluster", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	if want := ">=" + csv.Spec.MinKubeVersion + "-0"; csv.Spec.MinKubeVersion != "1.29.0" || chart.KubeVersion != want {
		t.Errorf("minKubeVersion %q, chart kubeVersion %q; want 1.29.0 and %q", csv.Spec.MinKubeVersion, chart.KubeVersion, want)
	}
}

// Every install mode works: both containers watch the namespaces in WATCH_NAMESPACE,
// which OLM's olm.targetNamespaces annotation sets (test/image runs the binaries with a
// list of namespaces).
func TestInstallModes(t *testing.T) {
	csv := loadBundle(t).CSV
	got := map[v1alpha1.InstallModeType]bool{}
	for _, m := range csv.Spec.InstallModes {
		got[m.Type] = m.Supported
	}
	want := map[v1alpha1.InstallModeType]bool{
		v1alpha1.InstallModeTypeOwnNamespace:    true,
		v1alpha1.InstallModeTypeSingleNamespace: true,
		v1alpha1.InstallModeTypeMultiNamespace:  true,
		v1alpha1.InstallModeTypeAllNamespaces:   true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("install modes (-want +got):\n%s", diff)
	}
	deps := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs
	if len(deps) != 1 {
		t.Fatalf("%d deployments in the CSV, want 1", len(deps))
	}
	for _, c := range deps[0].Spec.Template.Spec.Containers {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "WATCH_NAMESPACE" })
		if i < 0 || c.Env[i].Value != "" || !cmp.Equal(c.Env[i].ValueFrom, watchNamespaceFromOLM) {
			t.Errorf("container %s: WATCH_NAMESPACE is not from the olm.targetNamespaces annotation: %+v", c.Name, c.Env)
		}
	}
}

// OLM runs the Deployment of config/default, with the bundle's image and the namespaces
// of the OperatorGroup: same containers, commands, probes, resources and security.
func TestDeploymentIsConfigDefault(t *testing.T) {
	csv := loadBundle(t).CSV
	var want appsv1.Deployment
	for _, o := range configDefault(t) {
		if o.GetKind() == "Deployment" {
			fromUnstructured(t, o, &want)
		}
	}
	deps := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs
	if len(deps) != 1 {
		t.Fatalf("%d deployments in the CSV, want 1", len(deps))
	}
	got := deps[0]
	if got.Name != want.Name {
		t.Errorf("deployment %s, want %s", got.Name, want.Name)
	}
	image := got.Spec.Template.Spec.Containers[0].Image
	if csv.Annotations["containerImage"] != image {
		t.Errorf("containerImage annotation %q, the manager runs %q", csv.Annotations["containerImage"], image)
	}
	spec := want.Spec.DeepCopy()
	for i := range spec.Template.Spec.Containers {
		c := &spec.Template.Spec.Containers[i]
		c.Image = image
		for j := range c.Env {
			switch c.Env[j].Name {
			case "RELATED_IMAGE_AGENT":
				c.Env[j].Value = image
			case "RELATED_IMAGE_PGBOUNCER":
				c.Env[j].Value = pgbouncerImage(t, c.Env[j].Value)
			case "WATCH_NAMESPACE":
				c.Env[j] = corev1.EnvVar{Name: "WATCH_NAMESPACE", ValueFrom: watchNamespaceFromOLM}
			}
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("container %s requests no CPU or memory", c.Name)
		}
	}
	if diff := cmp.Diff(*spec, got.Spec); diff != "" {
		t.Errorf("CSV deployment (-config/default +CSV):\n%s", diff)
	}
}

// The CSV grants the operator exactly config/rbac's rules, all as permissions: those of
// the ClusterRoles config/default binds cluster-wide (a plain install watches every
// namespace) and of the Roles of its namespace. OLM grants permissions in the
// OperatorGroup's namespaces, or cluster-wide for AllNamespaces (config/manifests).
func TestPermissionsAreConfigRBAC(t *testing.T) {
	csv := loadBundle(t).CSV
	objs := configDefault(t)
	rules := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" || o.GetKind() == "Role" {
			var r rbacv1.ClusterRole
			fromUnstructured(t, o, &r)
			rules[o.GetKind()+"/"+o.GetName()] = r.Rules
		}
	}
	var want []rbacv1.PolicyRule
	var sa string
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding
		fromUnstructured(t, o, &b)
		sa = b.Subjects[0].Name
		want = append(want, rules[b.RoleRef.Kind+"/"+b.RoleRef.Name]...)
	}
	strategy := csv.Spec.InstallStrategy.StrategySpec
	if len(strategy.ClusterPermissions) != 0 {
		t.Errorf("clusterPermissions: %+v, want none", strategy.ClusterPermissions)
	}
	got := strategy.Permissions
	if len(got) != 1 || got[0].ServiceAccountName != sa {
		t.Fatalf("permissions: %+v, want one entry for ServiceAccount %s", got, sa)
	}
	if diff := cmp.Diff(ruleSet(want), ruleSet(got[0].Rules)); diff != "" {
		t.Errorf("permissions (-config/rbac +CSV):\n%s", diff)
	}
}

func ruleSet(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		b, _ := json.Marshal(r)
		out = append(out, string(b))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// pgbouncerImage is what make bundle makes of config's PgBouncer image: pgpilot's own,
// published beside the operator's ($(IMAGE_TAG_BASE)-pgbouncer), with config's tag.
func pgbouncerImage(t *testing.T, fromConfig string) string {
	t.Helper()
	i := strings.LastIndex(fromConfig, ":")
	if i < 0 || strings.Contains(fromConfig[i:], "/") {
		t.Fatalf("config's RELATED_IMAGE_PGBOUNCER %q has no tag", fromConfig)
	}
	return makefileVar(t, "IMAGE_TAG_BASE") + "-pgbouncer" + fromConfig[i:]
}

// relatedImages lists every image the operator may run, from its RELATED_IMAGE_*
// variables: its own (for the agent), the pinned PostgreSQL images and PgBouncer's.
func TestRelatedImages(t *testing.T) {
	csv := loadBundle(t).CSV
	want := map[string]string{}
	for _, c := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if name, ok := strings.CutPrefix(e.Name, "RELATED_IMAGE_"); ok {
				want[strings.ReplaceAll(strings.ToLower(name), "_", "-")] = e.Value
			}
		}
	}
	got := map[string]string{}
	for _, ri := range csv.Spec.RelatedImages {
		got[ri.Name] = ri.Image
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("relatedImages (-RELATED_IMAGE_* +CSV):\n%s", diff)
	}
	for _, major := range []string{"14", "15", "16", "17", "18"} {
		if !strings.HasPrefix(got["postgres-"+major], "postgres:"+major+".") {
			t.Errorf("no pinned postgres:%s image in relatedImages: %v", major, got)
		}
	}
	// PgBouncer's, for spec.pooler: hack/images/pgbouncer.sh's, pinned to PgBouncer's version.
	pinned := regexp.MustCompile(`^` + regexp.QuoteMeta(makefileVar(t, "IMAGE_TAG_BASE")) + `-pgbouncer:\d+\.\d+\.\d+$`)
	if !pinned.MatchString(got["pgbouncer"]) {
		t.Errorf("no pinned %s image in relatedImages: %v", pinned, got)
	}
	if got["agent"] != csv.Annotations["containerImage"] {
		t.Errorf("agent image %q is not the operator's %q", got["agent"], csv.Annotations["containerImage"])
	}
}

// ownedKinds are the APIs pgpilot provides, each with its CRD file under
// config/crd/bases.
var ownedKinds = []struct{ name, kind, file string }{
	{"postgresbackups.db.example.com", "PostgresBackup", "db.example.com_postgresbackups.yaml"},
	{"postgresclusters.db.example.com", "PostgresCluster", "db.example.com_postgresclusters.yaml"},
}

// The bundle's CRDs are exactly config/crd's, the CSV owns exactly them, and it describes
// every field of each one's spec and status with a descriptor whose path exists.
func TestOwnedCRD(t *testing.T) {
	b := loadBundle(t)
	inBundle := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range b.V1CRDs {
		inBundle[crd.Name] = crd
	}
	owned := map[string]v1alpha1.CRDDescription{}
	for _, d := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		if _, dup := owned[d.Name]; dup {
			t.Errorf("owned CRD %s is listed twice", d.Name)
		}
		owned[d.Name] = d
	}
	var wantNames []string
	for _, k := range ownedKinds {
		wantNames = append(wantNames, k.name)
	}
	if diff := cmp.Diff(wantNames, sortedKeys(inBundle)); diff != "" {
		t.Fatalf("CRDs in the bundle (-want +bundle): run make bundle\n%s", diff)
	}
	if diff := cmp.Diff(wantNames, sortedKeys(owned)); diff != "" {
		t.Fatalf("owned CRDs of the CSV (-want +CSV):\n%s", diff)
	}
	if n := len(b.CSV.Spec.CustomResourceDefinitions.Required); n != 0 {
		t.Errorf("the CSV requires %d CRDs, want none", n)
	}

	for _, k := range ownedKinds {
		t.Run(k.kind, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "crd", "bases", k.file))
			if err != nil {
				t.Fatal(err)
			}
			var want apiextensionsv1.CustomResourceDefinition
			if err := yaml.Unmarshal(data, &want); err != nil {
				t.Fatal(err)
			}
			if want.Name != k.name || want.Spec.Names.Kind != k.kind || len(want.Spec.Versions) != 1 || want.Spec.Versions[0].Name != "v1" {
				t.Fatalf("config/crd/bases/%s is %s (%s, %d versions), want %s v1", k.file, want.Name, want.Spec.Names.Kind, len(want.Spec.Versions), k.name)
			}
			if diff := cmp.Diff(want.Spec, inBundle[k.name].Spec); diff != "" {
				t.Errorf("bundle CRD (-config/crd +bundle): run make bundle\n%s", diff)
			}

			d := owned[k.name]
			if d.Kind != k.kind || d.Version != "v1" {
				t.Errorf("owned CRD %s: kind %s version %s, want %s v1", d.Name, d.Kind, d.Version, k.kind)
			}
			if d.DisplayName == "" || d.Description == "" || len(d.Resources) == 0 {
				t.Errorf("owned CRD lacks a display name, description or resources: %+v", d)
			}
			schema := want.Spec.Versions[0].Schema.OpenAPIV3Schema
			for _, tc := range []struct {
				field       string
				descriptors []string
			}{
				{"spec", pathsOf(d.SpecDescriptors)},
				{"status", pathsOf(d.StatusDescriptors)},
			} {
				root := schema.Properties[tc.field]
				if len(root.Properties) == 0 {
					t.Errorf("%s has no %s fields in the CRD", k.kind, tc.field)
				}
				seen := map[string]bool{}
				for _, p := range tc.descriptors {
					if seen[p] {
						t.Errorf("%s descriptor %q is listed twice", tc.field, p)
					}
					seen[p] = true
					if !schemaHasPath(root, p) {
						t.Errorf("%s descriptor %q: no such field in the CRD", tc.field, p)
					}
				}
				for name := range root.Properties {
					if !slices.ContainsFunc(tc.descriptors, func(p string) bool { return p == name || strings.HasPrefix(p, name+".") }) {
						t.Errorf("%s.%s has no descriptor", tc.field, name)
					}
				}
			}
			for _, sd := range append(append([]v1alpha1.SpecDescriptor(nil), d.SpecDescriptors...), statusAsSpec(d.StatusDescriptors)...) {
				if sd.DisplayName == "" || sd.Description == "" {
					t.Errorf("descriptor %s lacks a display name or description", sd.Path)
				}
			}
		})
	}
}

// What the scorecard's basic-check-spec and olm-spec-descriptors tests check of each
// alm-example (they need a cluster to run): it is of an owned kind, has a spec, and each
// field at the top of its spec has a descriptor of exactly that path. And every owned
// kind has an example.
func TestALMExamplesHaveSpecDescriptors(t *testing.T) {
	csv := loadBundle(t).CSV
	var examples []map[string]any
	if err := json.Unmarshal([]byte(csv.Annotations["alm-examples"]), &examples); err != nil {
		t.Fatal(err)
	}
	owned := map[string]v1alpha1.CRDDescription{}
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		owned[d.Kind] = d
	}
	examplesOf := map[string]int{}
	for i, ex := range examples {
		kind, _ := ex["kind"].(string)
		d, ok := owned[kind]
		if !ok || ex["apiVersion"] != "db.example.com/"+d.Version {
			t.Errorf("alm-example %d is a %v %v, not an owned API", i, ex["apiVersion"], kind)
			continue
		}
		examplesOf[kind]++
		spec, _ := ex["spec"].(map[string]any)
		if len(spec) == 0 {
			t.Errorf("alm-example %d (%s) has no spec", i, kind)
		}
		for field := range spec {
			if !slices.Contains(pathsOf(d.SpecDescriptors), field) {
				t.Errorf("alm-example %d (%s): spec.%s has no descriptor of path %q", i, kind, field, field)
			}
		}
	}
	for _, k := range ownedKinds {
		if examplesOf[k.kind] == 0 {
			t.Errorf("no alm-example of %s", k.kind)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func pathsOf[D v1alpha1.SpecDescriptor | v1alpha1.StatusDescriptor](ds []D) []string {
	var out []string
	for _, d := range ds {
		switch d := any(d).(type) {
		case v1alpha1.SpecDescriptor:
			out = append(out, d.Path)
		case v1alpha1.StatusDescriptor:
			out = append(out, d.Path)
		}
	}
	return out
}

func statusAsSpec(ds []v1alpha1.StatusDescriptor) []v1alpha1.SpecDescriptor {
	var out []v1alpha1.SpecDescriptor
	for _, d := range ds {
		out = append(out, v1alpha1.SpecDescriptor{Path: d.Path, DisplayName: d.DisplayName, Description: d.Description})
	}
	return out
}

func schemaHasPath(s apiextensionsv1.JSONSchemaProps, path string) bool {
	for _, part := range strings.Split(path, ".") {
		next, ok := s.Properties[part]
		if !ok {
			return false
		}
		s = next
	}
	return true
}
