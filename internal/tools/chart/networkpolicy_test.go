package chart_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// operatorPodLabels are config/manager's labels of the operator's pods
// (TestNetworkPolicyAdmitsTheOperator).
var operatorPodLabels = map[string]string{"app.kubernetes.io/name": "pgpilot", "control-plane": "controller-manager"}

// The NetworkPolicy lets the operator's pods reach the agents: config/manager's pod
// template carries the labels it selects, and the manager container tells the chart its
// namespace (watches.yaml's operator.namespace from POD_NAMESPACE).
func TestNetworkPolicyAdmitsTheOperator(t *testing.T) {
	pod := operatorDeployment(t).Spec.Template.Labels
	for k, v := range operatorPodLabels {
		if pod[k] != v {
			t.Errorf("%s: the operator's pods are not labelled %s=%s, which the NetworkPolicy admits: %v", managerYAMLPath, k, v, pod)
		}
	}
	if got := overrideValues(t)["operator.namespace"]; got != "$"+"POD_NAMESPACE" {
		t.Errorf("%s: operator.namespace is %q, want $POD_NAMESPACE", watchesYAMLPath, got)
	}
	for _, e := range managerContainer(t).Env {
		if e.Name == "POD_NAMESPACE" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace") {
			t.Errorf("%s: POD_NAMESPACE of the manager container is not the pod's namespace: %+v", managerYAMLPath, e)
		}
	}
}

func tcp(port int) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(int32(port)))}
}

// wantNetworkPolicy is the README example's NetworkPolicy: the instances reach each other
// on both ports, the namespace's pods PostgreSQL, the operator's pods the agents.
func wantNetworkPolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: objectLabels(name)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selectorLabels(name)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: selectorLabels(name)}}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(5432), tcp(8008)},
				},
				{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(5432)},
				},
				{
					From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": operatorNamespace}},
						PodSelector:       &metav1.LabelSelector{MatchLabels: operatorPodLabels},
					}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(8008)},
				},
			},
		},
	}
}

// The chart renders the plan's NetworkPolicy (internal/operator/plan decides its peers): the README
// example's in full, none when disabled.
func TestNetworkPolicy(t *testing.T) {
	got := decode[networkingv1.NetworkPolicy](t, render(t, readmeValues()), "NetworkPolicy", name)
	if diff := cmp.Diff(wantNetworkPolicy(), got); diff != "" {
		t.Errorf("NetworkPolicy (-want +got):\n%s", diff)
	}
	if _, ok := render(t, readmeValues(set("networkPolicy.enabled", false))).find("NetworkPolicy", name); ok {
		t.Errorf("NetworkPolicy rendered with networkPolicy.enabled false")
	}
}

// Every rule admits someone in particular (a rule without peers admits everyone), on
// ports the postgres container serves.
func TestNetworkPolicyRules(t *testing.T) {
	peer := map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "a"}}}
	for _, values := range []map[string]any{
		readmeValues(),
		readmeValues(set("monitoring.enabled", true)),
		readmeValues(set("networkPolicy.clients", []any{peer}), set("networkPolicy.metricsScrapers", []any{peer})),
		readmeValues(set("operator.namespace", "")),
	} {
		m := render(t, values)
		policy := decode[networkingv1.NetworkPolicy](t, m, "NetworkPolicy", name)
		served := map[int32]bool{}
		for _, p := range decode[appsv1.StatefulSet](t, m, "StatefulSet", name).Spec.Template.Spec.Containers[0].Ports {
			served[p.ContainerPort] = true
		}
		for i, rule := range policy.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("values %v: rule %d admits everyone: %+v", values, i, rule)
			}
			for _, p := range rule.Ports {
				if !served[p.Port.IntVal] {
					t.Errorf("values %v: rule %d opens port %v, which the postgres container does not serve", values, i, p.Port)
				}
			}
		}
	}
}
