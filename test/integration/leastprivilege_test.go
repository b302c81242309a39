package integration

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/helmmanager"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The Helm manager's cache (helmmanager.CacheOptions, as the operator runs it) holds the
// clusters, Helm's release Secrets and the objects labelled with a cluster; not the
// credentials Secrets, nor anything else of the namespace.
func TestHelmManagerCachesOnlyWhatItActsOn(t *testing.T) {
	opts := helmmanager.CacheOptions()
	scheme, err := helmmanager.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	opts.Scheme = scheme
	c, err := cache.New(operatorCfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Start(ctx) }()

	ns := newNamespace(t)
	create(t, newCluster(ns, "c"))
	labelled := map[string]string{dbv1.LabelCluster: "x"}
	meta := func(name string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}
	}
	type entry struct {
		obj    client.Object
		cached bool
	}
	tests := []entry{
		{&corev1.Secret{ObjectMeta: meta("sh.helm.release.v1.x.v1", map[string]string{"owner": "helm", "name": "x"})}, true},
		{&corev1.Secret{ObjectMeta: meta("x-app", labelled)}, false},
		{&corev1.Secret{ObjectMeta: meta("other", nil)}, false},
		{&corev1.ConfigMap{ObjectMeta: meta("x-config", labelled)}, true},
		{&corev1.ConfigMap{ObjectMeta: meta("other", nil)}, false},
	}
	for _, tt := range tests {
		create(t, tt.obj)
	}
	cluster := &unstructured.Unstructured{}
	cluster.SetGroupVersionKind(dbv1.GroupVersion.WithKind("PostgresCluster"))
	cluster.SetNamespace(ns)
	cluster.SetName("c")
	tests = append(tests, entry{cluster, true})

	for _, tt := range tests {
		key := client.ObjectKeyFromObject(tt.obj)
		err := c.Get(ctx, key, tt.obj)
		switch {
		case tt.cached && err != nil:
			t.Errorf("%T %s is not in the cache: %v", tt.obj, key.Name, err)
		case !tt.cached && !apierrors.IsNotFound(err):
			t.Errorf("%T %s: %v, want not found: the Helm manager acts on no such object", tt.obj, key.Name, err)
		}
	}
}

// RBAC lets the operator delete any pod; clusterpods.Delete, the controller's only way to
// delete one, refuses every pod but the observed instance of the cluster at hand.
func TestPodDeletesAreGuarded(t *testing.T) {
	operator, err := client.New(operatorCfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := newNamespace(t)
	cluster := newCluster(ns, "a")
	pods := map[string]*corev1.Pod{}
	for name, owner := range map[string]string{"a-0": "a", "a-1": "a", "b-0": "b", "web": ""} {
		pods[name] = plainPod(t, ns, name, owner)
	}
	elsewhere := plainPod(t, newNamespace(t), "a-0", "a")

	for what, pod := range map[string]*corev1.Pod{
		"another cluster's instance": pods["b-0"],
		"a pod of no cluster":        pods["web"],
		"an instance of a cluster of the same name in another namespace": elsewhere,
	} {
		if err := clusterpods.Delete(ctx, operator, cluster, pod); err == nil {
			t.Errorf("deleting %s (%s/%s) as an instance of %s/a: no error", what, pod.Namespace, pod.Name, ns)
		}
		if err := get(pod.Namespace, pod.Name, &corev1.Pod{}); err != nil {
			t.Errorf("%s: %v after a refused deletion", what, err)
		}
	}

	// a-1 deleted and created again meanwhile: the deletion of what was observed is
	// refused by the API server, and the new pod stays.
	old := pods["a-1"]
	if err := k8s.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	recreated := plainPod(t, ns, "a-1", "a")
	if err := clusterpods.Delete(ctx, operator, cluster, old); !apierrors.IsConflict(err) {
		t.Errorf("deleting a-1 as observed before it was created again: %v, want a conflict on its UID", err)
	}
	if err := get(ns, "a-1", &corev1.Pod{}); err != nil {
		t.Errorf("the new a-1: %v", err)
	}

	for _, pod := range []*corev1.Pod{pods["a-0"], recreated} {
		if err := clusterpods.Delete(ctx, operator, cluster, pod); err != nil {
			t.Errorf("deleting the instance %s: %v", pod.Name, err)
		}
		if err := get(ns, pod.Name, &corev1.Pod{}); !apierrors.IsNotFound(err) {
			t.Errorf("instance %s after its deletion: %v, want not found", pod.Name, err)
		}
	}
}

// plainPod creates a pod that passes the restricted Pod Security Standard, labelled as
// an instance of cluster (none when ""), and returns it as the API server has it.
func plainPod(t *testing.T, ns, name, cluster string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{Name: "c", Image: "example", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			}}},
		},
	}
	if cluster != "" {
		pod.Labels[dbv1.LabelCluster] = cluster
	}
	create(t, pod)
	return pod
}

// Each cluster gets a NetworkPolicy the API server accepts, admitting the operator's pods
// of the operator's namespace to the agents; it follows spec.networkPolicy.
func TestNetworkPolicyPerCluster(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "np"))
	var policy networkingv1.NetworkPolicy
	testutil.Eventually(t, timeout, func() error { return get(ns, "np", &policy) })
	agent := policy.Spec.Ingress[len(policy.Spec.Ingress)-1]
	if got := agent.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]; got != devenv.OperatorNamespace {
		t.Errorf("the agents' port admits pods of namespace %q, want the operator's, %s", got, devenv.OperatorNamespace)
	}
	if got := policy.Spec.Ingress[1].From; len(got) != 1 || got[0].PodSelector == nil || len(got[0].PodSelector.MatchLabels) != 0 || got[0].NamespaceSelector != nil {
		t.Errorf("clients = %+v, want every pod of the namespace", got)
	}

	web := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}
	if err := update(ns, "np", func(c *dbv1.PostgresCluster) { c.Spec.NetworkPolicy.Clients = []networkingv1.NetworkPolicyPeer{web} }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "np", &policy); err != nil {
			return err
		}
		if got := policy.Spec.Ingress[1].From; !equality.Semantic.DeepEqual(got, []networkingv1.NetworkPolicyPeer{web}) {
			return fmt.Errorf("clients = %+v, want %+v", got, web)
		}
		return nil
	})

	if err := update(ns, "np", func(c *dbv1.PostgresCluster) { c.Spec.NetworkPolicy.Enabled = ptr.To(false) }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "np", &networkingv1.NetworkPolicy{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("NetworkPolicy np with networkPolicy.enabled false: %v", err)
		}
		return nil
	})
}
