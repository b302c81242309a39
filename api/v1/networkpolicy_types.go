package v1

import (
	networkingv1 "k8s.io/api/networking/v1"
)

// NetworkPolicySpec says who may connect to the instances. It takes effect where the
// cluster's network plugin enforces NetworkPolicies; traffic from the pod's own node
// (the kubelet's probes) is always allowed.
type NetworkPolicySpec struct {
	// enabled renders a NetworkPolicy that lets into the instance pods only: the
	// instances themselves (replication, the agents' calls to each other), clients to
	// PostgreSQL (port 5432), and the operator and metrics scrapers to the agents
	// (port 8008). Outgoing traffic is not limited.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// clients may connect to PostgreSQL (port 5432): pods, namespaces or address blocks,
	// as a NetworkPolicy's peers. Empty: every pod of the cluster's namespace.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.podSelector) || has(p.namespaceSelector) || has(p.ipBlock))",message="each of clients needs a podSelector, a namespaceSelector or an ipBlock"
	// +optional
	Clients []networkingv1.NetworkPolicyPeer `json:"clients,omitempty"`

	// metricsScrapers may read the agents' metrics (port 8008, which also serves the
	// agents' authenticated API), besides the operator. Empty: with monitoring.enabled,
	// the Prometheus Operator's Prometheus pods (label app.kubernetes.io/name=prometheus)
	// of every namespace; without it, none.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.podSelector) || has(p.namespaceSelector) || has(p.ipBlock))",message="each of metricsScrapers needs a podSelector, a namespaceSelector or an ipBlock"
	// +optional
	MetricsScrapers []networkingv1.NetworkPolicyPeer `json:"metricsScrapers,omitempty"`
}
