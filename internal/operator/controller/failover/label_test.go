package failover

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
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

func seen(role string, ready bool) *Instance {
	return &Instance{Reachable: true, Status: agentapi.Status{Role: role, Running: true, Ready: ready}}
}

func TestLabel(t *testing.T) {
	type result struct {
		Role   string
		Change bool
	}
	cases := []struct {
		name   string
		pod    *corev1.Pod
		holder string
		obs    *Instance
		fenced bool
		want   result
	}{
		{"a new cluster's holder without a role becomes primary", newPod("db-0"), "db-0", nil, false, result{dbv1.RolePrimary, true}},
		{"holder labelled replica: primary while it promotes", newPod("db-1", withRole(dbv1.RoleReplica)), "db-1", seen(agentapi.RoleReplica, true), false, result{dbv1.RolePrimary, true}},
		{"holder whose postgres is stopped keeps its label", newPod("db-1", withRole(dbv1.RoleReplica)), "db-1", seen(agentapi.RoleStopped, false), false, result{dbv1.RoleReplica, false}},
		{"holder that promoted becomes primary", newPod("db-1", withRole(dbv1.RoleReplica)), "db-1", seen(agentapi.RolePrimary, true), false, result{dbv1.RolePrimary, true}},
		{"holder already primary", newPod("db-0", withRole(dbv1.RolePrimary)), "db-0", seen(agentapi.RolePrimary, true), false, result{dbv1.RolePrimary, false}},
		{"holder already primary, unreachable, stays primary", newPod("db-0", withRole(dbv1.RolePrimary)), "db-0", nil, false, result{dbv1.RolePrimary, false}},
		{"fenced holder serving again becomes primary", newPod("db-2", withRole(dbv1.RoleFenced)), "db-2", seen(agentapi.RolePrimary, true), false, result{dbv1.RolePrimary, true}},
		{"fenced holder not serving stays fenced", newPod("db-2", withRole(dbv1.RoleFenced)), "db-2", seen(agentapi.RoleStopped, false), false, result{dbv1.RoleFenced, false}},
		{"non-holder without a role becomes replica", newPod("db-1"), "db-0", nil, false, result{dbv1.RoleReplica, true}},
		{"former primary is fenced, not a replica", newPod("db-0", withRole(dbv1.RolePrimary)), "db-1", nil, false, result{dbv1.RoleFenced, true}},
		{"former primary still running is fenced", newPod("db-0", withRole(dbv1.RolePrimary)), "db-1", seen(agentapi.RolePrimary, false), false, result{dbv1.RoleFenced, true}},
		{"primary of a revoked Lease is fenced", newPod("db-0", withRole(dbv1.RolePrimary)), "", seen(agentapi.RoleFenced, false), false, result{dbv1.RoleFenced, true}},
		{"non-holder already replica", newPod("db-1", withRole(dbv1.RoleReplica)), "db-0", seen(agentapi.RoleReplica, true), false, result{dbv1.RoleReplica, false}},
		{"fenced non-holder stays fenced until it rejoined", newPod("db-1", withRole(dbv1.RoleFenced)), "db-0", seen(agentapi.RoleStarting, false), false, result{dbv1.RoleFenced, false}},
		{"fenced non-holder that rejoined is a replica", newPod("db-1", withRole(dbv1.RoleFenced)), "db-0", seen(agentapi.RoleReplica, true), false, result{dbv1.RoleReplica, true}},
		{"unknown role is corrected", newPod("db-1", withRole("leader")), "db-0", nil, false, result{dbv1.RoleReplica, true}},
		{"no holder: a standby stays a replica", newPod("db-1", withRole(dbv1.RoleReplica)), "", seen(agentapi.RoleReplica, true), false, result{dbv1.RoleReplica, false}},
		{"holder with nil labels", newPod("db-0", withoutLabels), "db-0", nil, false, result{dbv1.RolePrimary, true}},
		{"non-holder with nil labels", newPod("db-1", withoutLabels), "db-0", nil, false, result{dbv1.RoleReplica, true}},
		{"a replica the user fenced is fenced", newPod("db-1", withRole(dbv1.RoleReplica)), "db-0", seen(agentapi.RoleReplica, true), true, result{dbv1.RoleFenced, true}},
		{"a holder the user fenced is fenced", newPod("db-0", withRole(dbv1.RolePrimary)), "db-0", seen(agentapi.RolePrimary, true), true, result{dbv1.RoleFenced, true}},
		{"a fenced instance stays fenced", newPod("db-1", withRole(dbv1.RoleFenced)), "db-0", seen(agentapi.RoleStopped, false), true, result{dbv1.RoleFenced, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			var got result
			got.Role, got.Change = Label(tc.pod, tc.holder, tc.obs, tc.fenced)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Label(%s, %q) (-want +got):\n%s", tc.pod.Name, tc.holder, diff)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("Label modified the pod (-before +after):\n%s", diff)
			}
		})
	}
}

func TestRelabelsJoinBeforeTheyLeave(t *testing.T) {
	pods := func(ps ...*corev1.Pod) []corev1.Pod {
		var out []corev1.Pod
		for _, p := range ps {
			out = append(out, *p)
		}
		return out
	}
	named := func(name string, i *Instance) Instance {
		i.Name = name
		return *i
	}
	cases := []struct {
		name      string
		pods      []corev1.Pod
		holder    string
		fenced    []string
		instances []Instance
		want      []Relabel
	}{
		{
			// One pass after the move: the old primary (listed first) is fenced only
			// after the new one joined -rw, or -rw has no endpoint for a proxy sync.
			name:   "handover: the new primary before the old one is fenced",
			pods:   pods(newPod("db-0", withRole(dbv1.RolePrimary)), newPod("db-1", withRole(dbv1.RoleReplica)), newPod("db-2", withRole(dbv1.RoleReplica))),
			holder: "db-1",
			instances: []Instance{named("db-0", &Instance{}), named("db-1", seen(agentapi.RoleReplica, true)),
				named("db-2", seen(agentapi.RoleReplica, true))},
			want: []Relabel{{Pod: "db-1", Role: dbv1.RolePrimary}, {Pod: "db-0", Role: dbv1.RoleFenced}},
		},
		{
			name:      "a rejoined replica and a fenced former primary",
			pods:      pods(newPod("db-0", withRole(dbv1.RolePrimary)), newPod("db-2", withRole(dbv1.RoleFenced))),
			holder:    "db-1",
			instances: []Instance{named("db-2", seen(agentapi.RoleReplica, true))},
			want:      []Relabel{{Pod: "db-2", Role: dbv1.RoleReplica}, {Pod: "db-0", Role: dbv1.RoleFenced}},
		},
		{
			name:      "a replica the user fenced leaves -ro",
			pods:      pods(newPod("db-0", withRole(dbv1.RolePrimary)), newPod("db-1", withRole(dbv1.RoleReplica))),
			holder:    "db-0",
			fenced:    []string{"db-1"},
			instances: []Instance{named("db-0", seen(agentapi.RolePrimary, true)), named("db-1", seen(agentapi.RoleReplica, true))},
			want:      []Relabel{{Pod: "db-1", Role: dbv1.RoleFenced}},
		},
		{
			name:      "nothing to change",
			pods:      pods(newPod("db-0", withRole(dbv1.RolePrimary)), newPod("db-1", withRole(dbv1.RoleReplica))),
			holder:    "db-0",
			instances: []Instance{named("db-0", seen(agentapi.RolePrimary, true)), named("db-1", seen(agentapi.RoleReplica, true))},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Relabels(tc.pods, tc.holder, tc.fenced, tc.instances)); diff != "" {
				t.Errorf("Relabels (-want +got):\n%s", diff)
			}
		})
	}
}
