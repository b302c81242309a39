// Package chartschema derives the chart's values.schema.json from the CRD's spec schema,
// so that the chart accepts exactly the values the API server accepts.
package chartschema

import (
	"encoding/json"
	"fmt"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// operatorValues is the schema of the block the operator injects through watches.yaml
// overrideValues; users cannot set it (the CRD has no such field).
const operatorValues = `{
  "type": "object",
  "description": "Set by the operator from its environment (RELATED_IMAGE_*, POD_NAMESPACE) through watches.yaml; not part of the PostgresCluster spec.",
  "additionalProperties": false,
  "properties": {
    "namespace": {"type": "string"},
    "agentImage": {"type": "string"},
    "poolerImage": {"type": "string"},
    "agentImagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
    "postgresImages": {"type": "object", "additionalProperties": {"type": "string"}},
    "defaultPostgresImages": {"type": "object", "additionalProperties": {"type": "string"}}
  }
}`

// planValues is the schema of the plan the operator makes before each render
// (internal/operator/plan); users cannot set it either. Its shape is plan.Plan's, which the chart
// tests render through.
const planValues = `{
  "type": "object",
  "description": "Made by the operator before each render (internal/operator/plan): names, images, config.json, backup and restore volumes, the volume claim template; not part of the PostgresCluster spec."
}`

// FromCRD returns values.schema.json for the spec of the CRD's version.
func FromCRD(crdYAML []byte, version string) ([]byte, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		return nil, fmt.Errorf("decoding the CRD: %w", err)
	}
	var spec *apiextensionsv1.JSONSchemaProps
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			s, ok := v.Schema.OpenAPIV3Schema.Properties["spec"]
			if ok {
				spec = &s
			}
		}
	}
	if spec == nil {
		return nil, fmt.Errorf("the CRD has no spec schema for version %q", version)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var tree map[string]any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return nil, err
	}
	convert(tree)
	var op map[string]any
	if err := json.Unmarshal([]byte(operatorValues), &op); err != nil {
		return nil, err
	}
	tree["properties"].(map[string]any)["operator"] = op
	var plan map[string]any
	if err := json.Unmarshal([]byte(planValues), &plan); err != nil {
		return nil, err
	}
	tree["properties"].(map[string]any)["plan"] = plan
	tree["$schema"] = "http://json-schema.org/draft-07/schema#"
	tree["title"] = "Values of the postgrescluster chart: the PostgresCluster spec (generated from the CRD by `make manifests`; do not edit)"
	out, err := json.MarshalIndent(tree, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// convert turns a structural OpenAPI v3 schema into JSON Schema draft-07 in place:
// Kubernetes extensions go (CEL rules are the API server's business), nullable becomes
// a null type, and objects with known properties refuse unknown ones, as the API server
// prunes them.
func convert(s map[string]any) {
	preserve := s["x-kubernetes-preserve-unknown-fields"] == true
	for k := range s {
		if strings.HasPrefix(k, "x-kubernetes-") {
			delete(s, k)
		}
	}
	if s["nullable"] == true {
		if t, ok := s["type"].(string); ok {
			s["type"] = []any{t, "null"}
		}
	}
	delete(s, "nullable")
	if props, ok := s["properties"].(map[string]any); ok {
		for _, p := range props {
			convert(p.(map[string]any))
		}
		if !preserve {
			s["additionalProperties"] = false
		}
	}
	if ap, ok := s["additionalProperties"].(map[string]any); ok {
		convert(ap)
	}
	if items, ok := s["items"].(map[string]any); ok {
		convert(items)
	}
	for _, k := range []string{"anyOf", "allOf", "oneOf"} {
		if list, ok := s[k].([]any); ok {
			for _, e := range list {
				convert(e.(map[string]any))
			}
		}
	}
}
