package restart

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

var sharedBuffers = agentapi.PendingSetting{Name: "shared_buffers", Value: "128MB", Pending: "160MB"}

// inst is a ready instance; the primary when it streams to standbys.
func inst(name string, ordinal int, opts ...func(*Instance)) Instance {
	i := Instance{Name: name, Ordinal: ordinal, Reachable: true, Status: agentapi.Status{Pod: name, Role: agentapi.RoleReplica, Ready: true, Position: "0/5000000"}}
	for _, o := range opts {
		o(&i)
	}
	return i
}

func primaryOf(standbys ...string) func(*Instance) {
	return func(i *Instance) {
		i.Status.Role, i.Status.WriteLSN, i.Status.Position = agentapi.RolePrimary, "0/5000000", "0/5000000"
		for _, s := range standbys {
			i.Status.Replicas = append(i.Status.Replicas, agentapi.ReplicaStatus{Name: s, State: "streaming"})
		}
	}
}

func pending(settings ...agentapi.PendingSetting) func(*Instance) {
	return func(i *Instance) { i.Status.PendingRestart = settings }
}

func hashed(h string) func(*Instance) {
	return func(i *Instance) { i.Status.ParametersHash = h }
}

func rejecting(i *Instance) {
	i.Status.ConfigRejected = `invalid value for parameter "shared_buffers": "lots"`
}

func notReady(i *Instance)    { i.Status.Ready = false }
func unreachable(i *Instance) { i.Reachable = false }
func outdated(i *Instance)    { i.Outdated = true }

func three(p0, p1, p2 []func(*Instance)) []Instance {
	return []Instance{
		inst("db-0", 0, append([]func(*Instance){primaryOf("db-1", "db-2")}, p0...)...),
		inst("db-1", 1, p1...),
		inst("db-2", 2, p2...),
	}
}

func opts(o ...func(*Instance)) []func(*Instance) { return o }

func TestPlan(t *testing.T) {
	all := opts(pending(sharedBuffers))
	for _, tc := range []struct {
		name   string
		in     Input
		action Action
		target string
		reason string // a part of the reason
	}{
		{"nothing pending", Input{Instances: three(nil, nil, nil), Replicas: 3, Primary: "db-0"}, Done, "", "no setting waits"},
		{"a fenced standby (stopped) neither waits nor is restarted", Input{Instances: three(all, all, opts(notReady, pending())), Replicas: 3, Primary: "db-0", Fenced: []string{"db-2"}},
			RestartStandby, "db-1", "restarting standby db-1"},
		{"every instance pending: the highest-ordinal standby first", Input{Instances: three(all, all, all), Replicas: 3, Primary: "db-0"},
			RestartStandby, "db-2", "restarting standby db-2 in place to apply shared_buffers"},
		{"db-2 restarted: db-1 next", Input{Instances: three(all, all, nil), Replicas: 3, Primary: "db-0"},
			RestartStandby, "db-1", "standby db-1"},
		{"the restarted standby does not stream yet: wait", Input{Instances: func() []Instance {
			in := three(all, all, nil)
			in[0].Status.Replicas = in[0].Status.Replicas[:1] // db-2 not streaming
			return in
		}(), Replicas: 3, Primary: "db-0"}, Wait, "", "db-2 does not stream"},
		{"the restarted standby is not ready: wait", Input{Instances: three(all, all, opts(notReady)), Replicas: 3, Primary: "db-0"},
			Wait, "", "db-2 is not ready"},
		{"an agent does not answer: wait", Input{Instances: three(all, all, opts(unreachable)), Replicas: 3, Primary: "db-0"},
			Wait, "", "db-2 is not ready"},
		{"an instance is missing: wait", Input{Instances: three(all, all, all)[:2], Replicas: 3, Primary: "db-0"},
			Wait, "", "2 of 3 instances"},
		{"only the primary is left: a switchover to the lowest-ordinal standby", Input{Instances: three(all, nil, nil), Replicas: 3, Primary: "db-0"},
			Switchover, "db-1", "switching over from db-0 to db-1"},
		{"primary db-1: switchover to db-0", Input{Instances: []Instance{
			inst("db-0", 0), inst("db-1", 1, primaryOf("db-0", "db-2"), pending(sharedBuffers)), inst("db-2", 2),
		}, Replicas: 3, Primary: "db-1"}, Switchover, "db-0", "from db-1 to db-0"},
		{"a standby has not taken the change yet: its empty pending list says nothing, wait", Input{Instances: three(opts(pending(sharedBuffers), hashed("new")),
			opts(hashed("old")), opts(hashed("new"))), Replicas: 3, Primary: "db-0"},
			Wait, "", "have not all taken the same settings"},
		{"every instance has taken it: the standbys' lists are to be believed", Input{Instances: three(opts(pending(sharedBuffers), hashed("new")),
			opts(hashed("new")), opts(hashed("new"))), Replicas: 3, Primary: "db-0"},
			Switchover, "db-1", "switching over from db-0 to db-1"},
		{"the switchover target lags: wait (the failover controller would refuse)", Input{Instances: three(all, opts(func(i *Instance) { i.Status.Position = "0/1" }), nil), Replicas: 3, Primary: "db-0"},
			Wait, "", "db-1 is 83886079 bytes behind"},
		{"a switchover under way: wait", Input{Instances: three(all, nil, nil), Replicas: 3, Primary: "db-0", Switchover: "db-1"},
			Wait, "", "switchover to db-1 is under way"},
		{"a rolling update under way: wait", Input{Instances: three(all, all, opts(pending(sharedBuffers), outdated)), Replicas: 3, Primary: "db-0"},
			Wait, "", "rolling update"},
		{"a single instance is restarted in place", Input{Instances: []Instance{inst("db-0", 0, primaryOf(), pending(sharedBuffers))}, Replicas: 1, Primary: "db-0"},
			RestartPrimary, "db-0", "the only instance, in place"},
		{"the primary is not running as primary: wait", Input{Instances: three(opts(func(i *Instance) { i.Status.Role = agentapi.RoleFenced }), all, all), Replicas: 3, Primary: "db-0"},
			Wait, "", "not running as primary"},
		{"max_connections raised: standbys first", Input{Instances: three(opts(pending(agentapi.PendingSetting{Name: "max_connections", Value: "100", Pending: "200"})),
			opts(pending(agentapi.PendingSetting{Name: "max_connections", Value: "100", Pending: "200"})), nil), Replicas: 3, Primary: "db-0"},
			RestartStandby, "db-1", "max_connections"},
		{"a setting postgres rejects: nothing restarted, which would not start again", Input{Instances: three(all, all, opts(rejecting, pending(sharedBuffers))), Replicas: 3, Primary: "db-0"},
			Blocked, "", `db-2 cannot use its settings (invalid value for parameter "shared_buffers": "lots"), so no instance was restarted`},
		{"max_connections lowered: blocked", Input{Instances: three(all, all, opts(pending(sharedBuffers, agentapi.PendingSetting{Name: "max_connections", Value: "200", Pending: "100"}))), Replicas: 3, Primary: "db-0"},
			Blocked, "", "max_connections is lowered from 200 to 100 on db-2"},
		{"max_worker_processes lowered: blocked even while an instance is not ready", Input{Instances: three(opts(pending(agentapi.PendingSetting{Name: "max_worker_processes", Value: "16", Pending: "8"})), opts(notReady), nil), Replicas: 3, Primary: "db-0"},
			Blocked, "", "max_worker_processes is lowered from 16 to 8 on db-0"},
		{"max_connections lowered on a single instance: restarted in place", Input{Instances: []Instance{inst("db-0", 0, primaryOf(),
			pending(agentapi.PendingSetting{Name: "max_connections", Value: "200", Pending: "100"}))}, Replicas: 1, Primary: "db-0"},
			RestartPrimary, "db-0", "max_connections"},
		{"shared_buffers lowered is no concern", Input{Instances: three(all, all, opts(pending(agentapi.PendingSetting{Name: "shared_buffers", Value: "256MB", Pending: "128MB"}))), Replicas: 3, Primary: "db-0"},
			RestartStandby, "db-2", "shared_buffers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.action || d.Target != tc.target || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("Plan = %s %q (%q), want %s %q (%q)", d.Action, d.Target, d.Reason, tc.action, tc.target, tc.reason)
			}
			if (d.Action == Done) != (d.Pending == "") {
				t.Errorf("Pending = %q with %s", d.Pending, d.Action)
			}
		})
	}
}

func TestPending(t *testing.T) {
	in := three(opts(pending(sharedBuffers, agentapi.PendingSetting{Name: "max_connections", Value: "100", Pending: "200"})), opts(pending(sharedBuffers)), opts(unreachable, pending(sharedBuffers)))
	want := "max_connections (100 → 200), shared_buffers (128MB → 160MB) waiting for a restart on db-0 (primary), db-1"
	if got := Pending(in, "db-0"); got != want {
		t.Errorf("Pending =\n%q, want\n%q", got, want)
	}
}

func TestRecordOf(t *testing.T) {
	in := three(opts(pending(sharedBuffers)), nil, nil)
	r := RecordOf(Decide(Input{Instances: in, Replicas: 3, Primary: "db-0"}), in)
	if !r.Pending || r.Blocked || len(r.Instances) != 1 || r.Instances["db-0"][0] != "shared_buffers: 128MB → 160MB" ||
		!strings.Contains(r.Message, "on db-0 (primary); switching over from db-0 to db-1") {
		t.Errorf("record %+v", r)
	}
	if r := RecordOf(Decide(Input{Instances: three(nil, nil, nil), Replicas: 3, Primary: "db-0"}), nil); r.Pending || r.Message != "No setting waits for a restart" {
		t.Errorf("nothing pending: %+v", r)
	}
	// What postgres rejects is recorded whether or not anything waits for a restart.
	in = three(nil, opts(rejecting), opts(rejecting, unreachable))
	r = RecordOf(Decide(Input{Instances: in, Replicas: 3, Primary: "db-0"}), in)
	if r.Pending || len(r.Rejected) != 1 || r.Rejected["db-1"] == "" || !strings.Contains(r.RejectedMessage(), `db-1: invalid value for parameter "shared_buffers"`) {
		t.Errorf("rejected: %+v", r)
	}
}

// A switchover is asked for only once it has stayed the decision for switchoverConfirm:
// a standby's empty list of waiting settings may be one read before postgres took the
// file.
func TestConfirmedSwitchover(t *testing.T) {
	r := &Reconciler{switchovers: map[types.NamespacedName]decided{}}
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	t0 := time.Unix(1000, 0)
	for i, tc := range []struct {
		target string
		at     time.Duration
		forget bool
		want   bool
	}{
		{"db-1", 0, false, false},
		{"db-1", 2 * time.Second, false, false},
		{"db-2", 3 * time.Second, false, false}, // another target: counted anew
		{"db-2", 5 * time.Second, false, false},
		{"db-2", 6 * time.Second, false, true},
		{"db-2", 7 * time.Second, false, false}, // asked for: a new decision starts over
		{"db-2", 8 * time.Second, true, false},  // another decision came between
		{"db-2", 12 * time.Second, false, true},
	} {
		if tc.forget {
			r.forgetSwitchover(key)
		}
		if got := r.confirmedSwitchover(key, tc.target, t0.Add(tc.at)); got != tc.want {
			t.Errorf("step %d (%s at %s): %v, want %v", i, tc.target, tc.at, got, tc.want)
		}
	}
}
