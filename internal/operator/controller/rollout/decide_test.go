package rollout

import (
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	pod := func(name string, ordinal int, rev string) Pod {
		return Pod{Name: name, Ordinal: ordinal, Revision: rev, Ready: true}
	}
	three := func(r0, r1, r2 string) []Pod {
		return []Pod{pod("db-0", 0, r0), pod("db-1", 1, r1), pod("db-2", 2, r2)}
	}
	starting := three("b", "b", "a")
	starting[2].Ready = false
	// db-2 fenced by the user: stopped, never ready.
	fenced := func(p []Pod) []Pod { p[2].Fenced, p[2].Ready = true, false; return p }
	// The update revision is "b" in every case.
	for _, tc := range []struct {
		name     string
		pods     []Pod
		replicas int
		primary  string
		want     Decision
	}{
		{"every pod updated", three("b", "b", "b"), 3, "db-1", Decision{Action: Done}},
		{"the highest replica first", three("a", "a", "a"), 3, "db-0", Decision{Action: DeleteReplica, Target: "db-2"}},
		{"a replica starting", starting, 3, "db-0", Decision{Action: Wait}},
		{"a pod missing", three("b", "a", "a")[:2], 3, "db-0", Decision{Action: Wait}},
		{"the next replica", three("a", "a", "b"), 3, "db-0", Decision{Action: DeleteReplica, Target: "db-1"}},
		{"the primary last, handing over as it stops", three("a", "b", "b"), 3, "db-0", Decision{Action: HandOver, Target: "db-0"}},
		{"the role moving", three("a", "b", "b"), 3, "", Decision{Action: Wait}},
		{"the old primary is a replica now", three("a", "b", "b"), 3, "db-1", Decision{Action: DeleteReplica, Target: "db-0"}},
		{"the primary at another ordinal", three("b", "a", "a"), 3, "db-2", Decision{Action: DeleteReplica, Target: "db-1"}},
		{"one instance", []Pod{pod("db-0", 0, "a")}, 1, "db-0", Decision{Action: DeletePrimary, Target: "db-0"}},
		{"a fenced instance does not hold the rollout up, and restarts like a replica", fenced(three("a", "a", "a")), 3, "db-0", Decision{Action: DeleteReplica, Target: "db-2"}},
		{"a fenced instance restarts before the primary", fenced(three("a", "a", "b")), 3, "db-1", Decision{Action: DeleteReplica, Target: "db-0"}},
		{"the primary hands over with a replica that is not fenced", fenced(three("b", "a", "b")), 3, "db-1", Decision{Action: HandOver, Target: "db-1"}},
		{"the primary restarts alone when every other instance is fenced", func() []Pod {
			p := fenced(three("b", "a", "b"))
			p[0].Fenced, p[0].Ready = true, false
			return p
		}(), 3, "db-1", Decision{Action: DeletePrimary, Target: "db-1"}},
	} {
		got := Decide(tc.pods, tc.replicas, tc.primary, "b")
		if got.Action != tc.want.Action || got.Target != tc.want.Target {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := Decide(three("a", "a", "a"), 3, "db-0", ""); got.Action != Done {
		t.Errorf("no update revision: %+v", got)
	}
}

// At most Max clusters roll at once; one that began always goes on, and a finished one
// makes room.
func TestAdmission(t *testing.T) {
	a := Admission{Max: 2}
	if !a.Admit("ns/a", false) || !a.Admit("ns/b", false) {
		t.Fatal("the first two clusters were not admitted")
	}
	if a.Admit("ns/c", false) {
		t.Error("a third cluster was admitted with two rolling and Max 2")
	}
	if !a.Admit("ns/a", false) {
		t.Error("a cluster already rolling was stopped")
	}
	if !a.Admit("ns/d", true) {
		t.Error("a cluster half rolled (an operator restarted midway) was stopped")
	}
	a.Done("ns/a")
	a.Done("ns/d")
	if !a.Admit("ns/c", false) {
		t.Error("a cluster was not admitted once others finished")
	}
	if n := a.Rolling(); n != 2 {
		t.Errorf("%d rolling, want 2 (b, c)", n)
	}
	unlimited := Admission{}
	for _, c := range []string{"a", "b", "c", "d", "e"} {
		if !unlimited.Admit(c, false) {
			t.Errorf("no limit, and %s was not admitted", c)
		}
	}
}

func TestBegun(t *testing.T) {
	pods := []Pod{{Name: "db-0", Revision: "a"}, {Name: "db-1", Revision: "b"}}
	if !Begun(pods, "b") {
		t.Error("one pod of two on the new revision: not begun")
	}
	if Begun(pods[:1], "b") || Begun(pods[1:], "b") {
		t.Error("all old or all new counted as begun")
	}
}

// No pod is deleted within RouteSettle of the primary role's move: the routes to the
// old primary may still be in some node's kube-proxy.
func TestSettleLeft(t *testing.T) {
	moved := time.Date(2026, 11, 29, 16, 32, 18, 0, time.UTC)
	for _, tc := range []struct {
		acquired, now time.Time
		want          time.Duration
	}{
		{time.Time{}, moved, 0},
		{moved, moved, RouteSettle},
		{moved, moved.Add(500 * time.Millisecond), RouteSettle - 500*time.Millisecond},
		{moved, moved.Add(RouteSettle), 0},
		{moved, moved.Add(time.Minute), 0},
	} {
		if got := settleLeft(tc.acquired, tc.now); got != tc.want {
			t.Errorf("settleLeft(%s, %s) = %s, want %s", tc.acquired, tc.now, got, tc.want)
		}
	}
}
