package failover

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func primary(name string) Instance {
	return Instance{Name: name, Reachable: true, Status: agentapi.Status{Pod: name, Role: agentapi.RolePrimary, Ready: true, Running: true, WriteLSN: "0/5000000"}}
}

func replica(name, received, replayed string) Instance {
	return Instance{Name: name, Reachable: true, Status: agentapi.Status{Pod: name, Role: agentapi.RoleReplica, Ready: true, Running: true,
		ReceivedLSN: received, ReplayedLSN: replayed}}
}

func dead(name string) Instance { return Instance{Name: name} }

func input(instances ...Instance) Input {
	return Input{Holder: "db-0", Instances: instances, Enabled: true, Delay: 3 * time.Second, Now: t0}
}

func TestDecide(t *testing.T) {
	failedAt := t0.Add(-5 * time.Second)
	cases := []struct {
		name   string
		in     Input
		action Action
		target string
		reason string // a substring of the reason
	}{
		{"healthy primary", input(primary("db-0"), replica("db-1", "0/5000000", "0/5000000")), None, "", "is healthy"},
		{"no Lease holder yet", func() Input { i := input(); i.Holder = ""; return i }(), None, "", "no primary"},
		{"primary starting is not a failure", func() Input {
			i := input(primary("db-0"), replica("db-1", "0/1", "0/1"))
			i.Instances[0].Status.Role, i.Instances[0].Status.Ready = agentapi.RoleStarting, false
			return i
		}(), None, "", "is healthy"},
		{"primary just failed: wait", input(dead("db-0"), replica("db-1", "0/5000000", "0/5000000")), Wait, "", "failing over after 3s"},
		{"failed long enough: promote", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/5000000", "0/5000000"))
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-1", "does not answer for 5s; promoting db-1"},
		{"most WAL received wins", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), replica("db-2", "0/5000000", "0/3000000"))
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-2", "received 0/5000000"},
		{"then most replayed", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/5000000", "0/4000000"), replica("db-2", "0/5000000", "0/4500000"))
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-2", ""},
		{"then the lower name", func() Input {
			i := input(dead("db-0"), replica("db-2", "0/5000000", "0/5000000"), replica("db-1", "0/5000000", "0/5000000"))
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-1", ""},
		{"primary reachable but not ready", func() Input {
			i := input(primary("db-0"), replica("db-1", "0/5000000", "0/5000000"))
			i.Instances[0].Status.Ready, i.Instances[0].Status.Error = false, "disk full"
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-1", "not ready (disk full)"},
		{"primary pod gone", func() Input {
			i := input(replica("db-1", "0/5000000", "0/5000000"))
			i.FailedSince = failedAt
			return i
		}(), Promote, "db-1", "has no pod"},
		{"no replica answers", func() Input {
			i := input(dead("db-0"), dead("db-1"))
			i.FailedSince = failedAt
			return i
		}(), Blocked, "", "no replica is running"},
		{"a replica without an LSN does not count", func() Input {
			i := input(dead("db-0"), replica("db-1", "", ""))
			i.FailedSince = failedAt
			return i
		}(), Blocked, "", "no replica is running"},
		{"disabled", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/5000000", "0/5000000"))
			i.Enabled, i.FailedSince = false, failedAt
			return i
		}(), Blocked, "", "automatic failover is disabled"},
		{"sync ANY 1 of 2: both answer", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), replica("db-2", "0/5000000", "0/5000000"))
			i.SynchronousReplicas, i.SyncStandbys, i.FailedSince = 1, []string{"db-1", "db-2"}, failedAt
			return i
		}(), Promote, "db-2", ""},
		{"sync ANY 1 of 2: one answers, the ack may be on the other", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), dead("db-2"))
			i.SynchronousReplicas, i.SyncStandbys, i.FailedSince = 1, []string{"db-1", "db-2"}, failedAt
			return i
		}(), Blocked, "", "needs 2 of the synchronous standbys [db-1, db-2] to compare"},
		{"sync ANY 2 of 2: one answering is enough", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), dead("db-2"))
			i.SynchronousReplicas, i.SyncStandbys, i.FailedSince = 2, []string{"db-1", "db-2"}, failedAt
			return i
		}(), Promote, "db-1", ""},
		{"sync: an async replica never qualifies", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), replica("db-3", "0/9000000", "0/9000000"))
			i.SynchronousReplicas, i.SyncStandbys, i.FailedSince = 1, []string{"db-1"}, failedAt
			return i
		}(), Promote, "db-1", ""},
		{"sync, set never observed: every other instance counts", func() Input {
			i := input(dead("db-0"), replica("db-1", "0/4000000", "0/4000000"), dead("db-2"))
			i.SynchronousReplicas, i.FailedSince = 1, failedAt
			return i
		}(), Blocked, "", "needs 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if diff := cmp.Diff([]any{tc.action, tc.target}, []any{d.Action, d.Target}); diff != "" {
				t.Errorf("action, target (-want +got):\n%s\nreason: %s", diff, d.Reason)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", d.Reason, tc.reason)
			}
		})
	}
}

func TestDecideRemembersWhenThePrimaryFailed(t *testing.T) {
	in := input(dead("db-0"), replica("db-1", "0/1", "0/1"))
	d := Decide(in)
	if d.Action != Wait || !d.FailedSince.Equal(t0) || d.RequeueAfter != 3*time.Second {
		t.Fatalf("first sight of the failure: %+v", d)
	}
	in.FailedSince, in.Now = d.FailedSince, t0.Add(2*time.Second)
	if d = Decide(in); d.Action != Wait || d.RequeueAfter != time.Second {
		t.Fatalf("2 s later: %+v", d)
	}
	in.Now = t0.Add(3 * time.Second)
	if d = Decide(in); d.Action != Promote {
		t.Fatalf("3 s later: %+v", d)
	}
	// Healthy again before the delay: the clock starts over.
	in.Instances[0] = primary("db-0")
	if d = Decide(in); d.Action != None || !d.FailedSince.IsZero() {
		t.Fatalf("recovered: %+v", d)
	}
}

func TestCheckSwitchover(t *testing.T) {
	healthy := []Instance{primary("db-0"), replica("db-1", "0/5000000", "0/5000000"), replica("db-2", "0/1000000", "0/1000000")}
	notReady := replica("db-1", "0/5000000", "0/5000000")
	notReady.Status.Ready = false
	cases := []struct {
		name      string
		target    string
		instances []Instance
		want      string // substring; "" means allowed
	}{
		{"caught-up replica", "db-1", healthy, ""},
		{"already primary", "db-0", healthy, "already the primary"},
		{"unknown pod", "db-9", healthy, "not an instance"},
		{"far behind", "db-2", healthy, "bytes behind the primary"},
		{"not ready", "db-1", []Instance{primary("db-0"), notReady}, "not a ready replica"},
		{"unreachable", "db-1", []Instance{primary("db-0"), dead("db-1")}, "does not answer"},
		{"primary unhealthy", "db-1", []Instance{dead("db-0"), replica("db-1", "0/5000000", "0/5000000")}, "a failover, not a switchover"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckSwitchover("db-0", tc.target, tc.instances)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
