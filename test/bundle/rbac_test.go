package bundle

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Least privilege (docs/security.md): what the operator's ServiceAccount may change.

// writeVerbs are the verbs that change objects or grant access.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "bind", "escalate", "impersonate", "*"}

// writes are the write verbs of rule.
func writes(rule rbacv1.PolicyRule) []string {
	var out []string
	for _, v := range rule.Verbs {
		if slices.Contains(writeVerbs, v) {
			out = append(out, v)
		}
	}
	return out
}

// Everything pgpilot writes is namespaced, so under OLM each write is a CSV permission:
// OLM grants permissions in the OperatorGroup's namespaces only (and lifts them to the
// whole cluster only for AllNamespaces), whereas a clusterPermission is cluster-wide
// whatever namespaces the operator watches.
func TestBundleGrantsNoClusterWideWrite(t *testing.T) {
	strategy := loadBundle(t).CSV.Spec.InstallStrategy.StrategySpec
	for _, p := range strategy.ClusterPermissions {
		for _, r := range p.Rules {
			if w := writes(r); len(w) > 0 {
				t.Errorf("clusterPermissions of %s: %v on %v %v: cluster-wide under every install mode; make it a permission",
					p.ServiceAccountName, w, r.APIGroups, r.Resources)
			}
		}
	}
}

// sensitiveWrites are the write verbs config/rbac's ClusterRoles may hold on the kinds
// whose write lets the holder read credentials, grant access or stop databases, by
// ClusterRole; docs/security.md ("Least privilege") says why each is needed. A plain
// install watches every namespace, so these are cluster-wide.
var sensitiveWrites = map[string]map[string][]string{
	"pgpilot-manager-role": {
		// Helm's release storage: a Secret per release revision in the cluster's
		// namespace. Helm's Secrets driver creates, updates (superseded) and deletes
		// (history) them, and never patches.
		"secrets": {"create", "update", "delete"},
		// The chart's Role and RoleBinding of each cluster's instances. Helm patches,
		// replaces with the upgrade-force annotation, creates and deletes.
		"roles":        {"create", "update", "patch", "delete"},
		"rolebindings": {"create", "update", "patch", "delete"},
	},
	"pgpilot-controller-role": {
		// The credentials Secrets: created once, never changed or deleted by pgpilot. The
		// certificates' Secrets: renewed in place (update) before they expire.
		"secrets": {"create", "update"},
		// Rolling updates restart pods, and the role label follows the primary;
		// internal/operator/clusterpods refuses a pod that is not the cluster's.
		"pods": {"delete", "patch"},
	},
}

// sensitiveResources are the resources sensitiveWrites covers.
var sensitiveResources = []string{"secrets", "roles", "rolebindings", "clusterroles", "clusterrolebindings", "pods", "pods/eviction", "serviceaccounts/token", "*"}

func TestConfigRBACSensitiveWrites(t *testing.T) {
	objs := configDefault(t)
	roles := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" {
			var r rbacv1.ClusterRole
			fromUnstructured(t, o, &r)
			roles[r.Name] = r.Rules
		}
	}
	bound := 0
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.ClusterRoleBinding
		fromUnstructured(t, o, &b)
		bound++
		got := map[string][]string{}
		for _, r := range roles[b.RoleRef.Name] {
			for _, res := range r.Resources {
				if !slices.Contains(sensitiveResources, res) {
					continue
				}
				got[res] = append(got[res], writes(r)...)
			}
		}
		for res, verbs := range got {
			slices.Sort(verbs)
			got[res] = slices.Compact(verbs)
			if len(got[res]) == 0 {
				delete(got, res)
			}
		}
		want := sensitiveWrites[b.RoleRef.Name]
		for res := range want {
			want[res] = slices.Sorted(slices.Values(want[res]))
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ClusterRole %s: write verbs on sensitive resources (-docs/security.md +config/rbac):\n%s", b.RoleRef.Name, diff)
		}
	}
	if bound == 0 {
		t.Fatal("config/default binds no ClusterRole")
	}
}
