package failover

import (
	"reflect"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// quietWorld is a settled three-instance cluster as its last full observation saw it.
func quietWorld(t *testing.T) (*fullObservation, *dbv1.PostgresCluster, *coordinationv1.Lease, []corev1.Pod) {
	t.Helper()
	cluster := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", Generation: 4,
		Annotations: map[string]string{"a": "b"}}}
	lease, err := primarylease.Rebuild("ns", "db-primary", "db", primarylease.Record{Holder: "db-0", Term: 3, Bootstrapped: true}, t0)
	if err != nil {
		t.Fatal(err)
	}
	lease.ResourceVersion = "10"
	var pods []corev1.Pod
	for _, n := range []string{"db-0", "db-1", "db-2"} {
		pods = append(pods, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: n, UID: types.UID("uid-" + n), ResourceVersion: "7"}})
	}
	c := &cycle{cluster: cluster, lease: lease, pods: pods, mem: &memory{},
		instances: []Instance{primary("db-0"), standby("db-1", "0/5000000", false), standby("db-2", "0/5000000", false)}}
	c.recordFull(t0)
	return c.mem.full, cluster.DeepCopy(), lease.DeepCopy(), pods
}

func TestQuietHolder(t *testing.T) {
	tests := []struct {
		name    string
		settled bool
		after   time.Duration
		edit    func(*dbv1.PostgresCluster, *coordinationv1.Lease, *[]corev1.Pod)
		want    string
	}{
		{"settled, nothing changed", true, 5 * time.Second, nil, "db-0"},
		{"renewed only", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, l *coordinationv1.Lease, _ *[]corev1.Pod) {
			now := metav1.NewMicroTime(t0.Add(4 * time.Second))
			l.Spec.RenewTime, l.ResourceVersion = &now, "11"
		}, "db-0"},
		{"not settled", false, 5 * time.Second, nil, ""},
		{"full observation too old", true, FullObservationEvery, nil, ""},
		{"clock went back", true, -time.Second, nil, ""},
		{"spec changed", true, 5 * time.Second, func(c *dbv1.PostgresCluster, _ *coordinationv1.Lease, _ *[]corev1.Pod) {
			c.Generation++
		}, ""},
		{"switchover asked", true, 5 * time.Second, func(c *dbv1.PostgresCluster, _ *coordinationv1.Lease, _ *[]corev1.Pod) {
			c.Annotations[dbv1.AnnotationSwitchoverTo] = "db-1"
		}, ""},
		{"Lease annotations changed (the synchronous set)", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, l *coordinationv1.Lease, _ *[]corev1.Pod) {
			l.Annotations["x"] = "y"
		}, ""},
		{"Lease holder changed", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, l *coordinationv1.Lease, _ *[]corev1.Pod) {
			h := "db-1"
			l.Spec.HolderIdentity = &h
		}, ""},
		{"a pod changed (readiness, address)", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, _ *coordinationv1.Lease, p *[]corev1.Pod) {
			(*p)[2].ResourceVersion = "8"
		}, ""},
		{"a pod replaced", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, _ *coordinationv1.Lease, p *[]corev1.Pod) {
			(*p)[1].UID = "new"
		}, ""},
		{"a pod gone", true, 5 * time.Second, func(_ *dbv1.PostgresCluster, _ *coordinationv1.Lease, p *[]corev1.Pod) {
			*p = (*p)[:2]
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			full, cluster, lease, pods := quietWorld(t)
			if tt.edit != nil {
				tt.edit(cluster, lease, &pods)
			}
			if got := quietHolder(full, tt.settled, t0.Add(tt.after), cluster, lease, pods); got != tt.want {
				t.Errorf("quietHolder = %q, want %q", got, tt.want)
			}
		})
	}
	if got := quietHolder(nil, true, t0, &dbv1.PostgresCluster{}, &coordinationv1.Lease{}, nil); got != "" {
		t.Errorf("quietHolder without a full observation = %q, want none", got)
	}
}

func TestVouched(t *testing.T) {
	full, _, _, _ := quietWorld(t)
	streaming := func(names ...string) []agentapi.ReplicaStatus {
		var rs []agentapi.ReplicaStatus
		for _, n := range names {
			rs = append(rs, agentapi.ReplicaStatus{Name: n, State: "streaming"})
		}
		return rs
	}
	// asked is what a quiet cycle's observation returns: the holder answered, the
	// standbys not asked.
	asked := func(edit func(*agentapi.Status)) []Instance {
		h := primary("db-0")
		h.Status.Term = 3
		h.Status.Replicas = streaming("db-1", "db-2")
		if edit != nil {
			edit(&h.Status)
		}
		return []Instance{h, {Name: "db-1", Pod: pod("db-1")}, {Name: "db-2", Pod: pod("db-2")}}
	}

	got := vouched(asked(nil), "db-0", 3, full)
	if got == nil {
		t.Fatal("a holder streaming to both standbys did not vouch for them")
	}
	for i, in := range got {
		if !in.Reachable || in.Status.Pod != in.Name {
			t.Errorf("instance %d = %+v, want reachable with its own status", i, in)
		}
	}
	if !reflect.DeepEqual(got[1].Status, full.statuses["db-1"]) || got[1].Pod == nil || got[1].Pod.Name != "db-1" {
		t.Errorf("db-1 = %+v, want the full observation's status on the current pod", got[1])
	}
	if got[0].Status.Replicas == nil {
		t.Error("the holder's status is not the fresh one")
	}

	refused := map[string]func(*agentapi.Status){
		"a standby missing from pg_stat_replication": func(s *agentapi.Status) { s.Replicas = streaming("db-1") },
		"a standby catching up": func(s *agentapi.Status) {
			s.Replicas[1].State = "catchup"
		},
		"the holder in another term": func(s *agentapi.Status) { s.Term = 4 },
		"the holder a replica":       func(s *agentapi.Status) { s.Role = agentapi.RoleReplica },
	}
	for name, edit := range refused {
		if got := vouched(asked(edit), "db-0", 3, full); got != nil {
			t.Errorf("%s: vouched = %+v, want nil", name, got)
		}
	}
	unreachable := asked(nil)
	unreachable[0].Reachable = false
	if got := vouched(unreachable, "db-0", 3, full); got != nil {
		t.Errorf("an unreachable holder vouched: %+v", got)
	}
	delete(full.statuses, "db-2")
	if got := vouched(asked(nil), "db-0", 3, full); got != nil {
		t.Errorf("a standby the full observation did not see was vouched for: %+v", got)
	}
}

// TestNotSettledWhileTheHolderDoesNotRenew: a holder that answers but whose renewal was
// last seen more than RenewingWithin ago keeps its cluster unsettled; settled, the
// renewal watchdog would wake it at every check until the renewal came.
func TestNotSettledWhileTheHolderDoesNotRenew(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	c := &cycle{r: &Reconciler{clock: clk}, mem: &memory{}}
	if c.renewing() {
		t.Error("renewing before any renewal was seen")
	}
	c.mem.sawRenewal(t0.Add(-time.Second), t0)
	for _, tt := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {RenewingWithin, true}, {RenewingWithin + time.Millisecond, false}, {time.Minute, false}} {
		clk.SetTime(t0.Add(tt.after))
		if got := c.renewing(); got != tt.want {
			t.Errorf("renewal seen %s ago: renewing = %t, want %t", tt.after, got, tt.want)
		}
	}
}
