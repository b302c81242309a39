package primary_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/controller/primary"
)

type podOption func(*corev1.Pod)

// newPod returns an instance pod of cluster db labelled only with its cluster, as changed
// by opts.
func newPod(name string, opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "prod",
		Labels: map[string]string{dbv1.LabelCluster: "db"},
	}}
	for _, opt := range opts {
		opt(p)
	}
	return p
}

func withRole(r string) podOption {
	return func(p *corev1.Pod) { p.Labels[dbv1.LabelRole] = r }
}

func withoutLabels(p *corev1.Pod) { p.Labels = nil }

func TestRole(t *testing.T) {
	type result struct {
		Role   string
		Change bool
	}
	cases := []struct {
		name   string
		pod    *corev1.Pod
		holder string
		want   result
	}{
		{"holder without a role becomes primary", newPod("db-0"), "db-0", result{dbv1.RolePrimary, true}},
		{"holder labelled replica becomes primary", newPod("db-1", withRole(dbv1.RoleReplica)), "db-1", result{dbv1.RolePrimary, true}},
		{"holder already primary", newPod("db-0", withRole(dbv1.RolePrimary)), "db-0", result{dbv1.RolePrimary, false}},
		{"fenced holder becomes primary", newPod("db-2", withRole(dbv1.RoleFenced)), "db-2", result{dbv1.RolePrimary, true}},
		{"non-holder without a role becomes replica", newPod("db-1"), "db-0", result{dbv1.RoleReplica, true}},
		{"former primary is fenced, not a replica", newPod("db-0", withRole(dbv1.RolePrimary)), "db-1", result{dbv1.RoleFenced, true}},
		{"non-holder already replica", newPod("db-1", withRole(dbv1.RoleReplica)), "db-0", result{dbv1.RoleReplica, false}},
		{"fenced non-holder stays fenced", newPod("db-1", withRole(dbv1.RoleFenced)), "db-0", result{dbv1.RoleFenced, false}},
		{"unknown role is corrected", newPod("db-1", withRole("leader")), "db-0", result{dbv1.RoleReplica, true}},
		{"no holder yet: everyone is a replica", newPod("db-0"), "", result{dbv1.RoleReplica, true}},
		{"holder with nil labels", newPod("db-0", withoutLabels), "db-0", result{dbv1.RolePrimary, true}},
		{"non-holder with nil labels", newPod("db-1", withoutLabels), "db-0", result{dbv1.RoleReplica, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			var got result
			got.Role, got.Change = primary.Role(tc.pod, tc.holder)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Role(%s, %q) (-want +got):\n%s", tc.pod.Name, tc.holder, diff)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("Role modified the pod (-before +after):\n%s", diff)
			}
		})
	}
}
