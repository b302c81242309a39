package status

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestMonitoringReady(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC))
	cluster := func(enabled bool, conds ...dbv1.Condition) *dbv1.PostgresCluster {
		c := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: "db", Generation: 3}}
		c.Spec.Replicas, c.Spec.Monitoring.Enabled, c.Status.Conditions = 1, enabled, conds
		return c
	}
	had := dbv1.Condition{Type: dbv1.ConditionMonitoringReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonPrometheusOperatorFound}
	for _, tc := range []struct {
		name       string
		cluster    *dbv1.PostgresCluster
		served     map[string]bool
		wantStatus metav1.ConditionStatus // "" for no condition
		wantReason string
		wantSays   string
	}{
		{name: "not enabled: no condition", cluster: cluster(false, had), served: map[string]bool{}},
		{name: "enabled, both served", cluster: cluster(true), served: map[string]bool{"PodMonitor": true, "PrometheusRule": true},
			wantStatus: metav1.ConditionTrue, wantReason: dbv1.ReasonPrometheusOperatorFound},
		{name: "enabled, no Prometheus Operator", cluster: cluster(true, had), served: map[string]bool{},
			wantStatus: metav1.ConditionFalse, wantReason: dbv1.ReasonPrometheusOperatorMissing, wantSays: "does not serve PodMonitor and PrometheusRule"},
		{name: "enabled, PrometheusRule missing", cluster: cluster(true), served: map[string]bool{"PodMonitor": true},
			wantStatus: metav1.ConditionFalse, wantReason: dbv1.ReasonPrometheusOperatorMissing, wantSays: "does not serve PrometheusRule ("},
		{name: "enabled, unknown: kept", cluster: cluster(true, had),
			wantStatus: metav1.ConditionTrue, wantReason: dbv1.ReasonPrometheusOperatorFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := Decide(Observed{Cluster: tc.cluster, MonitoringAPIs: tc.served}, now)
			got := dbv1.FindCondition(st.Conditions, dbv1.ConditionMonitoringReady)
			if tc.wantStatus == "" {
				if got != nil {
					t.Fatalf("condition %+v, want none", *got)
				}
				return
			}
			if got == nil {
				t.Fatal("no MonitoringReady condition")
			}
			if got.Status != tc.wantStatus || got.Reason != tc.wantReason || !strings.Contains(got.Message, tc.wantSays) {
				t.Errorf("condition %s %s %q, want %s %s saying %q", got.Status, got.Reason, got.Message, tc.wantStatus, tc.wantReason, tc.wantSays)
			}
		})
	}
}

// Discovery is asked at most once a minute.
func TestDiscoveryMonitoringAPIs(t *testing.T) {
	fake := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	now := time.Unix(0, 0)
	d := &DiscoveryMonitoringAPIs{Client: fake, Now: func() time.Time { return now }}
	served, err := d.Served(context.Background())
	if err != nil || len(served) != 0 {
		t.Fatalf("Served = %v, %v; want none", served, err)
	}
	fake.Resources = []*metav1.APIResourceList{{GroupVersion: MonitoringAPI, APIResources: []metav1.APIResource{{Kind: "PodMonitor"}, {Kind: "PrometheusRule"}}}}
	now = now.Add(30 * time.Second)
	if served, _ := d.Served(context.Background()); len(served) != 0 {
		t.Errorf("asked again within a minute: %v", served)
	}
	now = now.Add(31 * time.Second)
	if served, _ := d.Served(context.Background()); !served["PodMonitor"] || !served["PrometheusRule"] {
		t.Errorf("Served = %v after a minute, want both", served)
	}
}
