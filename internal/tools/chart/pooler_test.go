package chart_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// withPooler sets spec.pooler (with the operator's PgBouncer image).
func withPooler(fields map[string]any) []valuesOption {
	return []valuesOption{set("pooler", fields), set("operator.poolerImage", poolerImage)}
}

// spec.pooler renders, per pool, a Deployment of restricted PgBouncer pods whose Service
// and budget select them and no instance, and which the operator never takes for
// instances (no cluster label on the pods); one ServiceAccount that may only read the
// primary Lease; and the headless Service the primaries' agents find the pods by.
func TestPooler(t *testing.T) {
	n := dbv1.NamesOf(name)
	for _, tt := range []struct {
		name  string
		spec  map[string]any
		pools []string
	}{
		{name: "read-write", spec: map[string]any{}, pools: []string{n.PoolerReadWrite()}},
		{name: "read-write and read-only", spec: map[string]any{"readOnly": true, "instances": 3}, pools: []string{n.PoolerReadWrite(), n.PoolerReadOnly()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := render(t, readmeValues(withPooler(tt.spec)...))
			sts := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
			instancePods := labels.Set(sts.Spec.Template.Labels)
			var deployments []string
			for _, obj := range m.Objects {
				if obj.Kind == "Deployment" {
					deployments = append(deployments, obj.Name)
				}
			}
			if !slices.Equal(deployments, tt.pools) {
				t.Fatalf("Deployments %v, want %v", deployments, tt.pools)
			}
			for _, pool := range tt.pools {
				d := decode[appsv1.Deployment](t, m, "Deployment", pool)
				pod := d.Spec.Template
				if got := restrictedViolations(pod.Spec); len(got) > 0 {
					t.Errorf("%s's pod breaks the restricted profile:\n%s", pool, strings.Join(got, "\n"))
				}
				if _, ok := pod.Labels[dbv1.LabelCluster]; ok {
					t.Errorf("%s's pods carry %s: the operator would take them for instances", pool, dbv1.LabelCluster)
				}
				podLabels := labels.Set(pod.Labels)
				svc := decode[corev1.Service](t, m, "Service", pool)
				if sel := labels.SelectorFromSet(svc.Spec.Selector); !sel.Matches(podLabels) || sel.Matches(instancePods) {
					t.Errorf("Service %s selects %v: want its pool's pods and no instance", pool, svc.Spec.Selector)
				}
				if sel := labels.SelectorFromSet(labels.Set(sts.Spec.Selector.MatchLabels)); sel.Matches(podLabels) {
					t.Errorf("the StatefulSet's selector matches %s's pods", pool)
				}
				wantInstances := int32(2)
				if v, ok := tt.spec["instances"].(int); ok {
					wantInstances = int32(v)
				}
				if d.Spec.Replicas == nil || *d.Spec.Replicas != wantInstances {
					t.Errorf("%s runs %v pods, want %d", pool, d.Spec.Replicas, wantInstances)
				}
				pdb := decode[policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget", pool)
				if sel := labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels); !sel.Matches(podLabels) || sel.Matches(instancePods) {
					t.Errorf("budget %s selects %v", pool, pdb.Spec.Selector.MatchLabels)
				}
				c := pod.Spec.Containers[0]
				if c.Image != poolerImage || pod.Spec.InitContainers[0].Image != agentImage {
					t.Errorf("%s's images: %s, %s", pool, c.Image, pod.Spec.InitContainers[0].Image)
				}
				want := "rw"
				if pool == n.PoolerReadOnly() {
					want = "ro"
				}
				if got := strings.Join(c.Command, " "); got != "/pgpilot/agent pooler --pool "+want {
					t.Errorf("%s's command: %s", pool, got)
				}
				if pod.Spec.ServiceAccountName != n.PoolerHeadless() {
					t.Errorf("%s's ServiceAccount %s", pool, pod.Spec.ServiceAccountName)
				}
				secrets := map[string]string{}
				for _, v := range pod.Spec.Volumes {
					if v.Secret != nil {
						secrets[v.Name] = v.Secret.SecretName
					}
				}
				for volume, secret := range map[string]string{"tls-pooler": n.PoolerTLSSecret(), "tls-client": n.PoolerClientTLSSecret(),
					"server-ca": n.ServerTLSSecret(), "agent-auth": n.AgentAuthSecret()} {
					if secrets[volume] != secret {
						t.Errorf("%s's volume %s is Secret %q, want %s", pool, volume, secrets[volume], secret)
					}
				}
				for _, v := range pod.Spec.Volumes {
					if v.Name == "server-ca" && (len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "ca.crt") {
						t.Errorf("the instances' certificate Secret is mounted whole (%v): want its ca.crt alone", v.Secret.Items)
					}
					if v.Name == "agent-auth" {
						var keys []string
						for _, it := range v.Secret.Items {
							keys = append(keys, it.Key)
						}
						if !slices.Equal(keys, []string{"control.sha256", "metrics.sha256", "peer.sha256"}) {
							t.Errorf("the pooler mounts %v of the agents' credentials: want the digests alone, never the peers' token", keys)
						}
					}
				}
			}
			headless := decode[corev1.Service](t, m, "Service", n.PoolerHeadless())
			rwPods := labels.Set(decode[appsv1.Deployment](t, m, "Deployment", n.PoolerReadWrite()).Spec.Template.Labels)
			if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses ||
				!labels.SelectorFromSet(headless.Spec.Selector).Matches(rwPods) {
				t.Errorf("headless Service %s: %+v", n.PoolerHeadless(), headless.Spec)
			}
			role := decode[rbacv1.Role](t, m, "Role", n.PoolerHeadless())
			if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"leases"}) ||
				!slices.Equal(role.Rules[0].ResourceNames, []string{n.PrimaryLease()}) || !slices.Equal(role.Rules[0].Verbs, []string{"get", "watch"}) {
				t.Errorf("the pooler's Role: %+v, want get and watch of the primary Lease alone", role.Rules)
			}
		})
	}
}

// Without spec.pooler nothing of it is rendered.
func TestNoPooler(t *testing.T) {
	for _, obj := range render(t, readmeValues()).Objects {
		if strings.Contains(obj.Name, "pooler") || obj.Kind == "Deployment" {
			t.Errorf("%s %s rendered without spec.pooler", obj.Kind, obj.Name)
		}
	}
}

// With a pooler the instances admit its pods on 5432 whoever the clients are, and the
// pooler's own NetworkPolicy admits the clients to PgBouncer and the instances (a
// primary's pause), the operator and the scrapers to its agent.
func TestPoolerNetworkPolicies(t *testing.T) {
	n := dbv1.NamesOf(name)
	clients := map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"role": "app"}}}
	m := render(t, readmeValues(append(withPooler(map[string]any{"readOnly": true}), set("networkPolicy.clients", []any{clients}))...))
	sts := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
	admits := func(np *networkingv1.NetworkPolicy, pod labels.Set, port int) bool {
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port.IntValue() != port {
					continue
				}
				for _, from := range rule.From {
					if from.PodSelector != nil && from.NamespaceSelector == nil && labels.SelectorFromSet(from.PodSelector.MatchLabels).Matches(pod) {
						return true
					}
				}
			}
		}
		return false
	}
	instances := decode[networkingv1.NetworkPolicy](t, m, "NetworkPolicy", name)
	pooler := decode[networkingv1.NetworkPolicy](t, m, "NetworkPolicy", n.PoolerHeadless())
	app := labels.Set{"role": "app"}
	for _, pool := range []string{n.PoolerReadWrite(), n.PoolerReadOnly()} {
		pod := labels.Set(decode[appsv1.Deployment](t, m, "Deployment", pool).Spec.Template.Labels)
		if !admits(instances, pod, 5432) {
			t.Errorf("the instances' NetworkPolicy does not admit %s's pods to PostgreSQL", pool)
		}
		if !labels.SelectorFromSet(pooler.Spec.PodSelector.MatchLabels).Matches(pod) {
			t.Errorf("the pooler's NetworkPolicy does not select %s's pods", pool)
		}
	}
	if labels.SelectorFromSet(pooler.Spec.PodSelector.MatchLabels).Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Error("the pooler's NetworkPolicy selects the instances")
	}
	if !admits(pooler, app, 5432) || admits(pooler, app, 8008) {
		t.Error("the pooler's NetworkPolicy: want the clients on 5432 only")
	}
	if !admits(pooler, labels.Set(sts.Spec.Template.Labels), 8008) {
		t.Error("the pooler's NetworkPolicy does not admit the instances' agents to the pooler agent")
	}
}
