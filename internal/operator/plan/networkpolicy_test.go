package plan_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/pgpilot/pgpilot/internal/operator/plan"
)

func selector(labels map[string]string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: labels}
}

func namespaceNamed(name string) *metav1.LabelSelector {
	return selector(map[string]string{"kubernetes.io/metadata.name": name})
}

func TestNetworkPolicy(t *testing.T) {
	inNamespace := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
	operator := networkingv1.NetworkPolicyPeer{NamespaceSelector: namespaceNamed("pgpilot-system"), PodSelector: selector(plan.OperatorPodLabels)}
	prometheus := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: selector(plan.PrometheusPodLabels)}
	teamA := networkingv1.NetworkPolicyPeer{NamespaceSelector: selector(map[string]string{"team": "a"})}
	web := networkingv1.NetworkPolicyPeer{PodSelector: selector(map[string]string{"app": "web"})}
	office := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/16"}}
	scraper := networkingv1.NetworkPolicyPeer{NamespaceSelector: namespaceNamed("monitoring"), PodSelector: selector(map[string]string{"app": "vmagent"})}

	withPolicy := func(change func(*plan.Values)) plan.Values {
		return readme(func(v *plan.Values) {
			v.Operator.Namespace = "pgpilot-system"
			change(v)
		})
	}
	tests := []struct {
		name   string
		values plan.Values
		want   *plan.NetworkPolicy
	}{
		{
			name:   "by default: the namespace's pods and the operator",
			values: withPolicy(func(*plan.Values) {}),
			want:   &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{operator}},
		},
		{
			name:   "disabled",
			values: withPolicy(func(v *plan.Values) { v.NetworkPolicy.Enabled = ptr.To(false) }),
		},
		{
			name:   "enabled explicitly",
			values: withPolicy(func(v *plan.Values) { v.NetworkPolicy.Enabled = ptr.To(true) }),
			want:   &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{operator}},
		},
		{
			name: "the user's clients instead of the namespace",
			values: withPolicy(func(v *plan.Values) {
				v.NetworkPolicy.Clients = []networkingv1.NetworkPolicyPeer{teamA, web, office}
			}),
			want: &plan.NetworkPolicy{Clients: []networkingv1.NetworkPolicyPeer{teamA, web, office}, Agent: []networkingv1.NetworkPolicyPeer{operator}},
		},
		{
			name:   "monitoring: Prometheus too",
			values: withPolicy(func(v *plan.Values) { v.Monitoring.Enabled = true }),
			want:   &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{operator, prometheus}},
		},
		{
			name: "monitoring with the user's scrapers: those instead of Prometheus",
			values: withPolicy(func(v *plan.Values) {
				v.Monitoring.Enabled = true
				v.NetworkPolicy.MetricsScrapers = []networkingv1.NetworkPolicyPeer{scraper}
			}),
			want: &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{operator, scraper}},
		},
		{
			name:   "the user's scrapers without monitoring",
			values: withPolicy(func(v *plan.Values) { v.NetworkPolicy.MetricsScrapers = []networkingv1.NetworkPolicyPeer{scraper} }),
			want:   &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{operator, scraper}},
		},
		{
			name:   "an operator outside a pod: its pods in any namespace",
			values: withPolicy(func(v *plan.Values) { v.Operator.Namespace = "" }),
			want: &plan.NetworkPolicy{Clients: inNamespace, Agent: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: selector(plan.OperatorPodLabels)},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decide(t, tt.values, plan.Observed{}, "")
			if diff := cmp.Diff(tt.want, p.NetworkPolicy); diff != "" {
				t.Errorf("network policy (-want +got):\n%s", diff)
			}
		})
	}
}
