package chart_test

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Files the operator's configuration is spread over, relative to this package.
const (
	managerYAMLPath = "../../../config/manager/manager.yaml"
	watchesYAMLPath = "../../../watches.yaml"
	valuesYAMLPath  = "../../../helm-charts/postgrescluster/values.yaml"
)

// postgresMajors are the versions the CRD accepts.
var postgresMajors = []string{"14", "15", "16", "17", "18"}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// managerContainer is the Helm manager container of the Deployment in manager.yaml.
func managerContainer(t *testing.T) corev1.Container {
	t.Helper()
	for _, c := range operatorDeployment(t).Spec.Template.Spec.Containers {
		if c.Name == "manager" {
			return c
		}
	}
	t.Fatalf("%s: no container named manager", managerYAMLPath)
	return corev1.Container{}
}

// operatorDeployment is the Deployment in manager.yaml.
func operatorDeployment(t *testing.T) appsv1.Deployment {
	t.Helper()
	var deployments []appsv1.Deployment
	for _, doc := range documentSeparator.Split(string(readFile(t, managerYAMLPath)), -1) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", managerYAMLPath, err)
		}
		if meta.Kind != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
			t.Fatalf("%s: %v", managerYAMLPath, err)
		}
		deployments = append(deployments, d)
	}
	if len(deployments) != 1 {
		t.Fatalf("%s holds %d Deployments, want 1", managerYAMLPath, len(deployments))
	}
	return deployments[0]
}

// operatorValues is the operator block of values.yaml.
func operatorValues(t *testing.T) map[string]any {
	t.Helper()
	var values map[string]any
	if err := yaml.Unmarshal(readFile(t, valuesYAMLPath), &values); err != nil {
		t.Fatalf("%s: %v", valuesYAMLPath, err)
	}
	operator, ok := values["operator"].(map[string]any)
	if !ok {
		t.Fatalf("%s has no operator block", valuesYAMLPath)
	}
	return operator
}

// overrideValues are the overrideValues of every entry in watches.yaml.
func overrideValues(t *testing.T) map[string]string {
	t.Helper()
	var watches []struct {
		Kind           string            `json:"kind"`
		OverrideValues map[string]string `json:"overrideValues"`
	}
	if err := yaml.Unmarshal(readFile(t, watchesYAMLPath), &watches); err != nil {
		t.Fatalf("%s: %v", watchesYAMLPath, err)
	}
	out := map[string]string{}
	for _, w := range watches {
		for k, v := range w.OverrideValues {
			out[k] = v
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no overrideValues", watchesYAMLPath)
	}
	return out
}

// The manager's RELATED_IMAGE_POSTGRES_<major> defaults and the chart's
// operator.defaultPostgresImages must name the same image for every major.
func TestDefaultPostgresImagesAgree(t *testing.T) {
	env := map[string]string{}
	for _, e := range managerContainer(t).Env {
		env[e.Name] = e.Value
	}
	defaults, _ := operatorValues(t)["defaultPostgresImages"].(map[string]any)

	fromManager, fromValues := map[string]string{}, map[string]string{}
	for _, major := range postgresMajors {
		fromManager[major] = env["RELATED_IMAGE_POSTGRES_"+major]
		fromValues[major], _ = defaults[major].(string)
		if fromManager[major] == "" {
			t.Errorf("%s: the manager container sets no RELATED_IMAGE_POSTGRES_%s", managerYAMLPath, major)
		}
		if fromValues[major] == "" {
			t.Errorf("%s: operator.defaultPostgresImages has no %q", valuesYAMLPath, major)
		}
	}
	if diff := cmp.Diff(fromValues, fromManager); diff != "" {
		t.Errorf("images by major (-%s +%s):\n%s", valuesYAMLPath, managerYAMLPath, diff)
	}
}

// valuePathExists reports whether the dotted path names a key of values, or a new entry
// of a map that values leaves empty for the operator to fill (postgresImages: {}).
func valuePathExists(values map[string]any, path string) bool {
	keys := strings.Split(path, ".")
	node := values
	for i, key := range keys {
		child, ok := node[key]
		if !ok {
			return len(node) == 0 && i == len(keys)-1
		}
		if i == len(keys)-1 {
			return true
		}
		if node, ok = child.(map[string]any); !ok {
			return false
		}
	}
	return false
}

func TestValuePathExists(t *testing.T) {
	values := map[string]any{"operator": map[string]any{
		"agentImage":     "",
		"postgresImages": map[string]any{},
		"defaults":       map[string]any{"16": "postgres:16"},
	}}
	cases := []struct {
		path string
		want bool
	}{
		{"operator", true},
		{"operator.agentImage", true},
		{"operator.postgresImages.16", true},
		{"operator.defaults.16", true},
		{"operator.agentImages", false},
		{"operator.defaults.17", false},
		{"operator.agentImage.tag", false},
		{"operator.postgresImages.16.tag", false},
		{"operater.agentImage", false},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			if got := valuePathExists(values, tc.path); got != tc.want {
				t.Errorf("valuePathExists(%q) = %t, want %t", tc.path, got, tc.want)
			}
		})
	}
}

// Helm sets overrideValues whatever their path, so a typo would go unnoticed: every key
// must name a value of the chart's operator block.
func TestOverrideValuesNameChartValues(t *testing.T) {
	values := map[string]any{"operator": operatorValues(t)}
	for _, key := range slices.Sorted(maps.Keys(overrideValues(t))) {
		if !strings.HasPrefix(key, "operator.") {
			t.Errorf("%s: overrideValues key %q is outside the operator block", watchesYAMLPath, key)
			continue
		}
		if !valuePathExists(values, key) {
			t.Errorf("%s: overrideValues key %q names no value in %s", watchesYAMLPath, key, valuesYAMLPath)
		}
	}
}

// Every $VARIABLE an override takes its value from must be set in the manager container.
func TestOverrideValuesVariablesAreSet(t *testing.T) {
	env := map[string]bool{}
	for _, e := range managerContainer(t).Env {
		env[e.Name] = true
	}
	variable := regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
	for key, value := range overrideValues(t) {
		for _, m := range variable.FindAllStringSubmatch(value, -1) {
			if !env[m[1]] {
				t.Errorf("%s: %s takes $%s, which %s does not set on the manager container", watchesYAMLPath, key, m[1], managerYAMLPath)
			}
		}
	}
}
