package integration

import (
	"context"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// The operator's RBAC has no wildcard and denies what the operator never needs.
func TestOperatorRBACIsLeastPrivilege(t *testing.T) {
	objs, err := devenv.BuildKustomization(filepath.Join(repoRoot, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		var role rbacv1.ClusterRole // Role has the same rules field
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
			t.Fatal(err)
		}
		for _, r := range role.Rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.NonResourceURLs} {
				for _, v := range list {
					if v == "*" {
						t.Errorf("%s %s has a wildcard rule: %+v", o.GetKind(), o.GetName(), r)
					}
				}
			}
		}
	}

	scheme := k8s.Scheme()
	operator, err := client.New(operatorCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	ctx := context.Background()
	denied := map[string]error{
		"create a PostgresCluster": operator.Create(ctx, newCluster(ns, "nope")),
		"delete pods":              operator.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns)),
		"delete PVCs":              operator.DeleteAllOf(ctx, &corev1.PersistentVolumeClaim{}, client.InNamespace(ns)),
		"create ClusterRoles": operator.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pgpilot-escalate"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}}),
		"update nodes": operator.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}),
	}
	for what, err := range denied {
		if !apierrors.IsForbidden(err) {
			t.Errorf("the operator may %s (got %v, want Forbidden)", what, err)
		}
	}
	if err := operator.List(ctx, &dbv1.PostgresClusterList{}); err != nil {
		t.Errorf("the operator cannot list PostgresClusters: %v", err)
	}
}

// The operator's own pod passes the restricted Pod Security Standard, enforced on its
// namespace by config/manager.
func TestOperatorPodIsRestricted(t *testing.T) {
	objs, err := devenv.BuildKustomization(filepath.Join(repoRoot, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(dep.Spec.Template.Spec.Containers) != 2 {
		t.Fatalf("the operator Deployment has %d containers, want manager and controller", len(dep.Spec.Template.Spec.Containers))
	}
	pod := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "operator-", Namespace: dep.Namespace},
			Spec:       *dep.Spec.Template.Spec.DeepCopy(),
		}
	}
	ctx := context.Background()
	if err := k8s.Create(ctx, pod(), client.DryRunAll); err != nil {
		t.Errorf("the operator pod is refused in %s: %v", dep.Namespace, err)
	}
	// Enforcement is really on: the same pod without its seccomp profile is refused.
	weaker := pod()
	weaker.Spec.SecurityContext.SeccompProfile = nil
	for i := range weaker.Spec.Containers {
		weaker.Spec.Containers[i].SecurityContext.SeccompProfile = nil
	}
	if err := k8s.Create(ctx, weaker, client.DryRunAll); !apierrors.IsForbidden(err) {
		t.Errorf("a pod without seccomp was not refused (%v): the namespace does not enforce restricted", err)
	}
}
