package plan

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// NetworkPolicy is who may connect to the instances, besides the instances themselves
// (which reach each other on both ports). Neither list is ever empty: a NetworkPolicy
// rule without peers admits everyone.
type NetworkPolicy struct {
	// Clients may connect to PostgreSQL (5432).
	Clients []networkingv1.NetworkPolicyPeer `json:"clients"`
	// Agent may connect to the agents' API and metrics (8008): the operator, and
	// the metrics scrapers.
	Agent []networkingv1.NetworkPolicyPeer `json:"agent"`
}

// OperatorPodLabels select the operator's pods (config/manager's pod template).
var OperatorPodLabels = map[string]string{"app.kubernetes.io/name": "pgpilot", "control-plane": "controller-manager"}

// PrometheusPodLabels select the Prometheus Operator's Prometheus pods, the metrics
// scrapers admitted by default where monitoring is enabled.
var PrometheusPodLabels = map[string]string{"app.kubernetes.io/name": "prometheus"}

// namespaceNameLabel is the label the API server sets on every namespace to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// networkPolicy is the NetworkPolicy of v, nil when disabled. Clients default to the
// pods of the cluster's namespace. The agents' port admits the operator's pods in the
// operator's namespace (in any namespace when the operator runs outside a pod and does
// not know its own), and the metrics scrapers: those of the spec, or by default
// Prometheus where monitoring is enabled.
func networkPolicy(v Values) *NetworkPolicy {
	spec := v.NetworkPolicy
	if !ptr.Deref(spec.Enabled, true) {
		return nil
	}
	p := &NetworkPolicy{Clients: spec.Clients}
	if len(p.Clients) == 0 {
		p.Clients = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
	}
	operator := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{},
		PodSelector:       &metav1.LabelSelector{MatchLabels: OperatorPodLabels},
	}
	if v.Operator.Namespace != "" {
		operator.NamespaceSelector.MatchLabels = map[string]string{namespaceNameLabel: v.Operator.Namespace}
	}
	p.Agent = append([]networkingv1.NetworkPolicyPeer{operator}, spec.MetricsScrapers...)
	if len(spec.MetricsScrapers) == 0 && v.Monitoring.Enabled {
		p.Agent = append(p.Agent, networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{},
			PodSelector:       &metav1.LabelSelector{MatchLabels: PrometheusPodLabels},
		})
	}
	return p
}
