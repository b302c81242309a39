package chart_test

import (
	"slices"
	"testing"

	"github.com/pgpilot/pgpilot/internal/tools/chart"
)

// poolerImage is PgBouncer's image as the operator passes it (operator.poolerImage).
const poolerImage = "registry.example.com/pgpilot/pgbouncer:1.18"

// The pooler's alerts are rendered exactly when the cluster has spec.pooler (the plan's
// pooler), each selecting this cluster's series (checkRule); TestAlertRules runs them.
func TestPoolerAlertRules(t *testing.T) {
	operator := []string{"monitoring.coreos.com/v1", podMonitorAPI, "monitoring.coreos.com/v1/PrometheusRule"}
	want := []string{"PgpilotPoolerClientsWaiting", "PgpilotPoolerSaturated", "PgpilotPoolerDown"}
	for _, tt := range []struct {
		name   string
		values []valuesOption
		want   []string
	}{
		{name: "without a pooler"},
		{name: "with a pooler", values: []valuesOption{set("pooler.instances", 2), set("operator.poolerImage", poolerImage)}, want: want},
		{name: "with a read-only pooler too", values: []valuesOption{set("pooler.readOnly", true), set("operator.poolerImage", poolerImage)}, want: want},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := renderWith(t, chart.Options{
				Name: name, Namespace: namespace, APIVersions: operator,
				Values: readmeValues(append(tt.values, set("monitoring.enabled", true))...),
			})
			obj, ok := m.find("PrometheusRule", name)
			if !ok {
				t.Fatal("no PrometheusRule rendered")
			}
			var got []string
			for _, g := range obj.Raw["spec"].(map[string]any)["groups"].([]any) {
				group := g.(map[string]any)
				if group["name"] != "pgpilot-"+name+"-pooler" {
					continue
				}
				for _, r := range group["rules"].([]any) {
					rule := r.(map[string]any)
					got = append(got, rule["alert"].(string))
					checkRule(t, rule)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("the pooler's alerts: %v, want %v", got, tt.want)
			}
		})
	}
}
