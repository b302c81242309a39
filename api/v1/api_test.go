package v1_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile("../../config/crd/bases/db.example.com_postgresclusters.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	return &crd
}

func submatches(ms [][]string) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m[1])
	}
	return out
}

// The CEL rule and its message must name exactly ManagedParameters.
func TestManagedParametersMatchTheCRDRule(t *testing.T) {
	crd := loadCRD(t)
	params := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["postgresql"].Properties["parameters"]
	if len(params.XValidations) != 1 {
		t.Fatalf("want one rule on spec.postgresql.parameters, got %d", len(params.XValidations))
	}
	rule := params.XValidations[0]
	ruleNames := regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(rule.Rule, -1)
	_, listed, _ := strings.Cut(rule.Message, ": ")
	for what, names := range map[string][]string{"rule": submatches(ruleNames), "message": strings.Split(listed, ", ")} {
		got := names
		want := slices.Clone(dbv1.ManagedParameters)
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s names %v, ManagedParameters are %v", what, got, want)
		}
	}
}

func TestCRDNamesAndColumns(t *testing.T) {
	crd := loadCRD(t)
	n := crd.Spec.Names
	if n.Kind != "PostgresCluster" || n.Plural != "postgresclusters" || !slices.Equal(n.ShortNames, []string{"pgc"}) ||
		crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("names = %+v, scope %s", n, crd.Spec.Scope)
	}
	v := crd.Spec.Versions[0]
	var cols []string
	for _, c := range v.AdditionalPrinterColumns {
		cols = append(cols, strings.ToUpper(c.Name))
	}
	if want := []string{"VERSION", "INSTANCES", "READY", "PRIMARY", "PHASE", "AGE"}; !slices.Equal(cols, want) {
		t.Errorf("printer columns = %v, want %v", cols, want)
	}
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Error("the status subresource is not enabled")
	}
}
