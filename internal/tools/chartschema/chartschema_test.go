package chartschema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/tools/chartschema"
)

const (
	crdPath    = "../../../config/crd/bases/db.example.com_postgresclusters.yaml"
	schemaPath = "../../../helm-charts/postgrescluster/values.schema.json"
)

// fromRealCRD converts the committed CRD.
func fromRealCRD(t *testing.T) []byte {
	t.Helper()
	crd, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	out, err := chartschema.FromCRD(crd, "v1")
	if err != nil {
		t.Fatalf("FromCRD: %v", err)
	}
	return out
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		t.Fatalf("the output is not JSON: %v", err)
	}
	return tree
}

func TestCommittedSchemaIsUpToDate(t *testing.T) {
	got := fromRealCRD(t)
	want, err := os.ReadFile(schemaPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what the CRD generates; run `make manifests` and commit the result (-committed +generated):\n%s",
			schemaPath, cmp.Diff(string(want), string(got)))
	}
}

// kubernetesExtensions returns the path of every key that starts with x-kubernetes-.
func kubernetesExtensions(path string, v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			if strings.HasPrefix(k, "x-kubernetes-") {
				out = append(out, path+"."+k)
			}
			out = append(out, kubernetesExtensions(path+"."+k, child)...)
		}
	case []any:
		for i, child := range v {
			out = append(out, kubernetesExtensions(fmt.Sprintf("%s[%d]", path, i), child)...)
		}
	}
	return out
}

func TestNoKubernetesExtensions(t *testing.T) {
	tree := decode(t, fromRealCRD(t))
	if found := kubernetesExtensions("$", tree); len(found) > 0 {
		slices.Sort(found)
		t.Errorf("the schema keeps %d Kubernetes extensions, first %s", len(found), strings.Join(found[:min(len(found), 5)], ", "))
	}
	// The check above must be able to fail: the CRD itself has such keys.
	crd, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(crd, []byte("x-kubernetes-")) {
		t.Error("the CRD has no x-kubernetes- key: this test checks nothing")
	}
}

func TestTopLevel(t *testing.T) {
	tree := decode(t, fromRealCRD(t))
	props, _ := tree["properties"].(map[string]any)
	type top struct {
		Schema               any
		Type                 any
		AdditionalProperties any
		HasOperator          bool
		HasPlan              bool
		HasVersion           bool
	}
	want := top{
		Schema:               "http://json-schema.org/draft-07/schema#",
		Type:                 "object",
		AdditionalProperties: false,
		HasOperator:          true,
		HasPlan:              true,
		HasVersion:           true,
	}
	got := top{
		Schema:               tree["$schema"],
		Type:                 tree["type"],
		AdditionalProperties: tree["additionalProperties"],
		HasOperator:          props["operator"] != nil,
		HasPlan:              props["plan"] != nil,
		HasVersion:           props["version"] != nil,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("top level (-want +got):\n%s", diff)
	}
	operator, _ := props["operator"].(map[string]any)
	if operator["additionalProperties"] != false {
		t.Errorf("operator accepts unknown keys: %v", operator)
	}
}

// crdYAML is a CRD written for this test: each field exercises one conversion.
const crdYAML = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: the spec
            required: [size]
            x-kubernetes-validations:
            - rule: self.size > 0
            properties:
              size:
                type: integer
                minimum: 1
              nickname:
                type: string
                nullable: true
              port:
                x-kubernetes-int-or-string: true
                anyOf:
                - type: integer
                - type: string
              free:
                type: object
                x-kubernetes-preserve-unknown-fields: true
              partlyKnown:
                type: object
                x-kubernetes-preserve-unknown-fields: true
                properties:
                  known:
                    type: string
              labels:
                type: object
                additionalProperties:
                  type: string
                  nullable: true
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name:
                      type: string
                    tags:
                      type: array
                      nullable: true
                      items:
                        type: object
                        properties:
                          key:
                            type: string
                            nullable: true
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
`

func TestFromCRDConversions(t *testing.T) {
	out, err := chartschema.FromCRD([]byte(crdYAML), "v1")
	if err != nil {
		t.Fatalf("FromCRD: %v", err)
	}
	got := decode(t, out)
	props, ok := got["properties"].(map[string]any)
	if !ok || props["operator"] == nil || props["plan"] == nil {
		t.Fatalf("no operator or plan property in %v", got)
	}
	// Their schemas are TestTopLevel's business.
	delete(props, "operator")
	delete(props, "plan")
	want := map[string]any{
		"$schema":              "http://json-schema.org/draft-07/schema#",
		"title":                "Values of the postgrescluster chart: the PostgresCluster spec (generated from the CRD by `make manifests`; do not edit)",
		"type":                 "object",
		"description":          "the spec",
		"required":             []any{"size"},
		"additionalProperties": false,
		"properties": map[string]any{
			"size":     map[string]any{"type": "integer", "minimum": float64(1)},
			"nickname": map[string]any{"type": []any{"string", "null"}},
			"port": map[string]any{"anyOf": []any{
				map[string]any{"type": "integer"},
				map[string]any{"type": "string"},
			}},
			"free": map[string]any{"type": "object"},
			"partlyKnown": map[string]any{
				"type":       "object",
				"properties": map[string]any{"known": map[string]any{"type": "string"}},
			},
			"labels": map[string]any{
				"type":                 "object",
				"additionalProperties": map[string]any{"type": []any{"string", "null"}},
			},
			"ports": map[string]any{
				"type": "array",
				"items": map[string]any{
					"type":                 "object",
					"required":             []any{"name"},
					"additionalProperties": false,
					"properties": map[string]any{
						"name": map[string]any{"type": "string"},
						"tags": map[string]any{
							"type": []any{"array", "null"},
							"items": map[string]any{
								"type":                 "object",
								"additionalProperties": false,
								"properties": map[string]any{
									"key": map[string]any{"type": []any{"string", "null"}},
								},
							},
						},
					},
				},
			},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FromCRD (-want +got):\n%s", diff)
	}
}

func TestFromCRDErrors(t *testing.T) {
	cases := []struct {
		name    string
		crd     string
		version string
		want    string
	}{
		{"unknown version", crdYAML, "v3", `the CRD has no spec schema for version "v3"`},
		{"version without a spec", crdYAML, "v2", `the CRD has no spec schema for version "v2"`},
		{"not a CRD", "spec: {versions: 3}", "v1", "decoding the CRD"},
		{"unknown field", crdYAML + "bogus: true\n", "v1", "decoding the CRD"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := chartschema.FromCRD([]byte(tc.crd), tc.version)
			if err == nil {
				t.Fatalf("FromCRD returned %d bytes, want an error", len(out))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}
