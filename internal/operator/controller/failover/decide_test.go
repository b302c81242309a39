package failover

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func pod(name string) *corev1.Pod { return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}} }

func primary(name string) Instance {
	return Instance{Name: name, Pod: pod(name), Reachable: true, Status: agentapi.Status{Pod: name, Role: agentapi.RolePrimary, Ready: true, Running: true,
		Timeline: 1, WriteLSN: "0/5000000", Position: "0/5000000"}}
}

// standby is a running replica at position on timeline 1, frozen or not.
func standby(name, position string, frozen bool) Instance {
	return Instance{Name: name, Pod: pod(name), Reachable: true, Status: agentapi.Status{Pod: name, Role: agentapi.RoleReplica, Ready: true, Running: true,
		Timeline: 1, Position: position, Frozen: frozen}}
}

// withholding is a running primary whose commit gate withholds: not ready, as a primary
// is between its promotion and its Lease's confirmation.
func withholding(name string) Instance {
	p := primary(name)
	p.Status.Ready, p.Status.Gate = false, agentapi.GateWithholding
	return p
}

// dead has a pod whose agent does not answer.
func dead(name string) Instance { return Instance{Name: name, Pod: pod(name)} }

func held(instances ...Instance) Input {
	return Input{Lease: primarylease.Record{Holder: "db-0", Term: 3, Bootstrapped: true}, Instances: instances,
		Enabled: true, Delay: 3 * time.Second, StartTimeout: time.Minute, RenewSeen: t0.Add(-10 * time.Second), Now: t0}
}

// vacant is a Lease revoked from db-0 (term 3) long enough ago that db-0 cannot
// acknowledge anything any more.
func vacant(instances ...Instance) Input {
	in := held(instances...)
	in.Lease.Holder, in.Lease.Term = "", 4
	in.Lease.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "crashed"}
	in.RenewSeen = t0.Add(-time.Minute)
	in.VacantSince = t0.Add(-time.Second)
	return in
}

func with(in Input, edit func(*Input)) Input {
	edit(&in)
	return in
}

type decideCase struct {
	name   string
	in     Input
	action Action
	target string
	reason string // a substring of the reason
}

func check(t *testing.T, cases []decideCase, decide func(Input) Decision) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := decide(c.in)
			if d.Action != c.action || d.Target != c.target || !strings.Contains(d.Reason, c.reason) {
				t.Errorf("got %s %q (%q), want %s %q (reason containing %q)", d.Action, d.Target, d.Reason, c.action, c.target, c.reason)
			}
		})
	}
}

func TestDecideHeld(t *testing.T) {
	failedAt := t0.Add(-5 * time.Second)
	failed := func(in Input) Input {
		in.FailedSince, in.FailedHolder, in.FailedTerm = failedAt, in.Lease.Holder, in.Lease.Term
		return in
	}
	check(t, []decideCase{
		{"healthy primary", held(primary("db-0"), standby("db-1", "0/5000000", false)), None, "", "is healthy"},
		{"not bootstrapped: nothing to fail over", with(held(dead("db-0")), func(i *Input) { i.Lease.Bootstrapped = false }), None, "", "first primary"},
		{"agent does not answer but renews the Lease: alive", with(held(dead("db-0"), standby("db-1", "0/5000000", false)),
			func(i *Input) { i.RenewSeen = t0.Add(-time.Second) }), None, "", "is healthy"},
		{"primary just failed: wait for the delay", with(held(dead("db-0"), standby("db-1", "0/5000000", false)),
			func(i *Input) { i.RenewSeen = t0.Add(-2500 * time.Millisecond) }), Wait, "", "failing over after 3s"},
		{"silent since a renewal due longer than the delay ago: revoke at once", with(held(dead("db-0"), standby("db-1", "0/5000000", false)),
			func(i *Input) { i.RenewSeen, i.RenewObserved = t0.Add(-4500*time.Millisecond), true }), Revoke, "", "has not renewed the Lease for 4.5s"},
		{"silent since the controller first read the Lease: the delay counts from the detection", with(held(dead("db-0"), standby("db-1", "0/5000000", false)),
			func(i *Input) { i.RenewSeen = t0.Add(-4500 * time.Millisecond) }), Wait, "", "failing over after 3s"},
		{"a primary that answers is failed from when it was seen failed, not from its renewal", with(held(func() Instance {
			p := primary("db-0")
			p.Status.Role = agentapi.RoleFenced
			return p
		}(), standby("db-1", "0/1", false)), func(i *Input) { i.RenewSeen = t0.Add(-time.Minute) }), Wait, "", "failing over after 3s"},
		{"failed for the delay: revoke", failed(held(dead("db-0"), standby("db-1", "0/5000000", false))), Revoke, "", "does not answer"},
		// A failure counts for the holder and term it was seen in. A primary just
		// promoted is not ready until its Lease is confirmed: counted from the failure of
		// the primary before it (the Lease moved by another writer, or by a write of this
		// controller it did not see succeed), it was revoked at once.
		{"a new primary is not failed over for its predecessor's failure", with(held(withholding("db-1"), standby("db-0", "0/5000000", false),
			standby("db-2", "0/5000000", false)), func(i *Input) {
			i.Lease.Holder, i.Lease.Term = "db-1", 5
			i.FailedSince, i.FailedHolder, i.FailedTerm = failedAt, "db-0", 3
		}), Wait, "", "withholding) for 0s; failing over after 3s"},
		{"a primary given the Lease back is not failed over for its failure in the term before", with(held(withholding("db-0"),
			standby("db-1", "0/5000000", false)), func(i *Input) {
			i.Lease.Term = 5
			i.FailedSince, i.FailedHolder, i.FailedTerm = failedAt, "db-0", 3
		}), Wait, "", "withholding) for 0s; failing over after 3s"},
		{"the same primary failing in the same term is failed over", with(held(withholding("db-0"),
			standby("db-1", "0/5000000", false)), func(i *Input) {
			i.FailedSince, i.FailedHolder, i.FailedTerm = failedAt, "db-0", 3
		}), Revoke, "", "withholding) for 5s"},
		{"failover disabled", failed(with(held(dead("db-0"), standby("db-1", "0/1", false)), func(i *Input) { i.Enabled = false })), Blocked, "", "disabled"},
		{"no replica answers: keep the Lease", failed(held(dead("db-0"), dead("db-1"))), Blocked, "", "no replica is running"},
		{"terminating primary hands over by itself", held(func() Instance { p := primary("db-0"); p.Terminating = true; p.Status.Ready = false; return p }(),
			standby("db-1", "0/1", false)), None, "", "is healthy"},
		{"primary handing over (gate draining) is left to release", failed(held(func() Instance {
			p := primary("db-0")
			p.Status.Ready, p.Status.Gate = false, agentapi.GateDraining
			return p
		}(), standby("db-1", "0/1", false))), None, "", "is healthy"},
		{"primary running pg_upgrade is left to its agent", failed(with(held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready = agentapi.RoleUpgrading, false, false
			return p
		}(), standby("db-1", "0/1", false)), func(i *Input) { i.SynchronousReplicas = 1 })), None, "", "is healthy"},
		{"primary whose agent died while upgrading is failed", failed(held(dead("db-0"), standby("db-1", "0/1", false))), Revoke, "", "does not answer"},
		{"fenced primary is failed", failed(held(func() Instance { p := primary("db-0"); p.Status.Role = agentapi.RoleFenced; return p }(),
			standby("db-1", "0/1", false))), Revoke, "", "is fenced"},
		{"primary whose gate withholds is failed", failed(held(func() Instance {
			p := primary("db-0")
			p.Status.Ready, p.Status.Gate = false, "withholding"
			return p
		}(), standby("db-1", "0/1", false))), Revoke, "", "commit gate withholding"},
		{"restarting primary, asynchronous: within startTimeout", held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready, p.Status.DownForMillis = agentapi.RoleStarting, false, false, 20000
			return p
		}(), standby("db-1", "0/1", false)), None, "", "is healthy"},
		{"restarting primary, asynchronous: past startTimeout", failed(held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready, p.Status.DownForMillis = agentapi.RoleStarting, false, false, 61000
			return p
		}(), standby("db-1", "0/1", false))), Revoke, "", "longer than spec.failover.startTimeout"},
		{"restarting primary, synchronous: a standby has it all", failed(with(held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready, p.Status.DownForMillis = agentapi.RoleStarting, false, false, 1000
			return p
		}(), standby("db-1", "0/1", false)), func(i *Input) {
			i.SynchronousReplicas = 1
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": ""}}
		})), Revoke, "", "is starting"},
		{"crash loop", failed(held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready, p.Status.RecentCrashes = agentapi.RoleStopped, false, false, 3
			return p
		}(), standby("db-1", "0/1", false))), Revoke, "", "crashed 3 times"},
		{"crash loop: failed even while the last restart is up for a moment", held(func() Instance {
			p := primary("db-0")
			p.Status.RecentCrashes, p.Status.FirstRecentCrashMillisAgo = 3, 3500
			return p
		}(), standby("db-1", "0/1", false)), Revoke, "", "crashed 3 times"},
		{"crash loop: the delay counts from the first crash", held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready = agentapi.RoleStopped, false, false
			p.Status.RecentCrashes, p.Status.FirstRecentCrashMillisAgo = 3, 3500
			return p
		}(), standby("db-1", "0/1", false)), Revoke, "", "crashed 3 times"},
		{"crash loop shorter than the delay: wait", held(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Ready = agentapi.RoleStopped, false, false
			p.Status.RecentCrashes, p.Status.FirstRecentCrashMillisAgo = 3, 1000
			return p
		}(), standby("db-1", "0/1", false)), Wait, "", "failing over after 3s"},
		{"synchronous: the only sync member is down: blocked", failed(with(held(dead("db-0"), standby("db-1", "0/1", false), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-2": ""}}
		})), Blocked, "", "db-2 cannot be compared"},
		{"synchronous: either member may hold a commit the other lacks: blocked", failed(with(held(dead("db-0"), standby("db-1", "0/1", false), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": "", "db-2": ""}}
		})), Blocked, "", "db-2 cannot be compared"},
		{"synchronous: a member taken out with a bound does not block", failed(with(held(dead("db-0"), standby("db-1", "0/1", false), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": "", "db-2": "0/1"}}
		})), Revoke, "", "does not answer"},
		{"no pod at all", failed(held(Instance{Name: "db-0"}, standby("db-1", "0/1", false))), Revoke, "", "has no pod"},
		{"switchover to a caught-up replica", with(held(primary("db-0"), standby("db-1", "0/5000000", false)), func(i *Input) { i.Switchover = "db-1" }),
			Demote, "db-1", "switchover to db-1"},
		{"switchover to a lagging replica is refused", with(held(primary("db-0"), standby("db-1", "0/1", false)), func(i *Input) { i.Switchover = "db-1" }),
			RefuseSwitchover, "db-1", "bytes behind"},
		{"switchover to the primary is refused", with(held(primary("db-0")), func(i *Input) { i.Switchover = "db-0" }),
			RefuseSwitchover, "db-0", "already the primary"},
	}, Decide)
}

// clean is in with db-0's clean release of the Lease at final.
func clean(in Input, final string) Input {
	in.Lease.Handover = &primarylease.Handover{From: "db-0", Term: 3, Clean: true, Released: true, FinalLSN: final, Timeline: 1, Reason: "shutting down"}
	in.RenewSeen = t0 // a release needs no waiting
	return in
}

func TestDecideVacant(t *testing.T) {
	frozenFailsafe := func(ago time.Duration) Instance {
		s := standby("db-2", "0/4000000", true)
		s.Status.FailsafeConfirmed = &agentapi.FailsafeConfirmation{Primary: "db-0", Term: 3, AgoMillis: ago.Milliseconds()}
		return s
	}
	check(t, []decideCase{
		{"revoked just now: wait T + margin after the last renewal", with(vacant(dead("db-0"), standby("db-1", "0/5000000", true)),
			func(i *Input) { i.RenewSeen = t0.Add(-2 * time.Second) }), Wait, "", "T + margin after its last renewal"},
		{"old primary confirmed fenced: no waiting", with(vacant(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running, p.Status.Fenced = agentapi.RoleFenced, false, true
			return p
		}(), standby("db-1", "0/5000000", true)), func(i *Input) { i.RenewSeen = t0 }), Move, "db-1", "has the most WAL"},
		{"a fenced old primary that still runs postgres is not safe", with(vacant(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Fenced = agentapi.RoleFenced, true
			return p
		}(), standby("db-1", "0/5000000", true)), func(i *Input) { i.RenewSeen = t0 }), Wait, "", "T + margin"},
		{"failsafe confirmation extends the wait", vacant(dead("db-0"), standby("db-1", "0/5000000", true), frozenFailsafe(2*time.Second)),
			Wait, "", "failsafe confirmation"},
		{"an old failsafe confirmation does not", vacant(dead("db-0"), standby("db-1", "0/5000000", true), frozenFailsafe(time.Minute)),
			Move, "db-1", "has the most WAL"},
		{"only frozen standbys are candidates", vacant(dead("db-0"), standby("db-1", "0/9000000", false), standby("db-2", "0/5000000", true)),
			Move, "db-2", "db-2 has the most WAL"},
		{"the most advanced frozen standby wins", vacant(dead("db-0"), standby("db-1", "0/4000000", true), standby("db-2", "0/5000000", true)),
			Move, "db-2", "0/5000000"},
		{"a standby the user fences is no candidate before the Lease records it (a rebuilt Lease)", with(vacant(dead("db-0"), standby("db-1", "0/4000000", true), standby("db-2", "0/5000000", true)),
			func(i *Input) { i.Fenced = []string{"db-2"} }), Move, "db-1", "has the most WAL"},
		{"every standby fenced by the user: no candidate", with(vacant(dead("db-0"), standby("db-1", "0/4000000", true)),
			func(i *Input) { i.Fenced = []string{"db-0", "db-1"} }), Blocked, "", "no frozen standby answers"},
		{"a higher timeline wins over a higher position", vacant(dead("db-0"), standby("db-1", "0/9000000", true), func() Instance {
			s := standby("db-2", "0/5000000", true)
			s.Status.Timeline = 2
			return s
		}()), Move, "db-2", "timeline 2"},
		{"no frozen standby, old primary gone", vacant(dead("db-0"), dead("db-1")), Blocked, "", "no frozen standby answers"},
		{"no frozen standby, old primary back", vacant(func() Instance {
			p := primary("db-0")
			p.Status.Role, p.Status.Running = agentapi.RoleStopped, false
			return p
		}(), dead("db-1")), GiveBack, "db-0", "is back"},
		{"clean handover: a standby with the final LSN", clean(vacant(dead("db-0"), standby("db-1", "0/5000000", true), standby("db-2", "0/4FFFFFF", true)), "0/5000000"),
			Move, "db-1", "has its final WAL"},
		{"clean handover: standbys need no freezing", clean(vacant(dead("db-0"), standby("db-1", "0/5000000", false)), "0/5000000"),
			Move, "db-1", "has its final WAL"},
		{"revoked, not clean: an unfrozen standby is no candidate", vacant(dead("db-0"), standby("db-1", "0/5000000", false)),
			Blocked, "", "no frozen standby answers"},
		{"clean handover: nobody has it yet: wait", clean(vacant(dead("db-0"), standby("db-1", "0/4000000", true)), "0/5000000"),
			Wait, "", "waiting for a standby with db-0's final WAL"},
		{"clean handover: the final LSN on another timeline does not count", clean(vacant(dead("db-0"), func() Instance {
			s := standby("db-1", "0/6000000", true)
			s.Status.Timeline = 2
			return s
		}()), "0/5000000"), Wait, "", "final WAL"},
		{"clean handover timed out: failover rules", clean(with(vacant(dead("db-0"), standby("db-1", "0/4000000", true)),
			func(i *Input) { i.VacantSince = t0.Add(-HandoverTimeout - time.Second) }), "0/5000000"), Move, "db-1", "has the most WAL"},
		{"switchover: the target has the final LSN", clean(with(vacant(dead("db-0"), standby("db-1", "0/5000000", true), standby("db-2", "0/5000000", true)),
			func(i *Input) { i.Switchover = "db-2" }), "0/5000000"), Move, "db-2", "switchover from db-0"},
		{"switchover: target behind, within the catch-up time: wait", clean(with(vacant(primaryStopped("db-0"), standby("db-1", "0/5000000", true), standby("db-2", "0/4000000", true)),
			func(i *Input) { i.Switchover = "db-2" }), "0/5000000"), Wait, "", "waiting for db-2"},
		{"switchover: target behind after the catch-up time: give back", clean(with(vacant(primaryStopped("db-0"), standby("db-1", "0/5000000", true), standby("db-2", "0/4000000", true)),
			func(i *Input) { i.Switchover = "db-2"; i.VacantSince = t0.Add(-SwitchoverCatchUp - time.Second) }), "0/5000000"), GiveBack, "db-0", "switchover aborted"},
		{"synchronous: a member that cannot be compared blocks", with(vacant(dead("db-0"), standby("db-1", "0/5000000", true), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-2": ""}}
		}), Blocked, "", "db-2 cannot be compared"},
		{"synchronous: a removed member's bound lets the others decide", with(vacant(dead("db-0"), standby("db-1", "0/5000000", true), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": "", "db-2": "0/3000000"}}
		}), Move, "db-1", "has the most WAL"},
		{"synchronous: the best candidate lacks what a member acknowledged", with(vacant(dead("db-0"), standby("db-1", "0/5000000", true), dead("db-2")), func(i *Input) {
			i.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-2": "0/6000000"}}
		}), Blocked, "", "no standby has every acknowledged commit"},
	}, DecideVacant)
}

func primaryStopped(name string) Instance {
	p := primary(name)
	p.Status.Role, p.Status.Running, p.Status.Ready = agentapi.RoleStopped, false, false
	return p
}

func TestAsynchronousMoveSaysWhatMayBeLost(t *testing.T) {
	d := DecideVacant(vacant(dead("db-0"), standby("db-1", "0/5000000", true)))
	if d.Action != Move || d.Lost == "" {
		t.Fatalf("asynchronous failover after a crash: got %s, Lost %q; want Move with what may be lost", d.Action, d.Lost)
	}
	in := vacant(dead("db-0"), standby("db-1", "0/5000000", true))
	in.Lease.Sync = &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": ""}}
	if d := DecideVacant(in); d.Action != Move || d.Lost != "" {
		t.Fatalf("synchronous failover: got %s, Lost %q; want Move losing nothing", d.Action, d.Lost)
	}
}

func TestSyncFrontier(t *testing.T) {
	cands := []Instance{standby("a", "0/500", true), standby("b", "0/300", true), standby("c", "0/400", true)}
	cases := []struct {
		name    string
		set     *primarylease.SyncSet
		want    uint64
		wantErr string
	}{
		{"asynchronous", nil, 0, ""},
		{"K=1 of three: the highest", &primarylease.SyncSet{K: 1, Members: map[string]string{"a": "", "b": "", "c": ""}}, 0x500, ""},
		{"K=2 of three: the second highest", &primarylease.SyncSet{K: 2, Members: map[string]string{"a": "", "b": "", "c": ""}}, 0x400, ""},
		{"a bound lowers a member's frontier", &primarylease.SyncSet{K: 1, Members: map[string]string{"a": "0/350", "b": ""}}, 0x350, ""},
		{"an absent member without a bound is infinite", &primarylease.SyncSet{K: 1, Members: map[string]string{"x": ""}}, 0, "x cannot be compared"},
		{"K=2 with one infinite: the other decides", &primarylease.SyncSet{K: 2, Members: map[string]string{"x": "", "b": ""}}, 0x300, ""},
		{"fewer members than K", &primarylease.SyncSet{K: 2, Members: map[string]string{"a": ""}}, 0, "records 1 standbys for 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := syncFrontier(c.set, cands, false)
			if got != c.want || !strings.Contains(err, c.wantErr) || (c.wantErr == "" && err != "") {
				t.Errorf("got %#x %q, want %#x %q", got, err, c.want, c.wantErr)
			}
		})
	}
}

// A scale-down that removes the primary's pod moves it first, to the most advanced
// instance that stays; it waits while none can take over.
func TestDecideScaleDown(t *testing.T) {
	scaled := func(replicas int, holder string, instances ...Instance) Input {
		in := held(instances...)
		in.Cluster, in.Replicas, in.Lease.Holder = "db", replicas, holder
		return in
	}
	check(t, []decideCase{
		{"the primary stays", scaled(2, "db-1", standby("db-0", "0/5000000", false), primary("db-1"), standby("db-2", "0/5000000", false)),
			None, "", "is healthy"},
		{"the primary leaves: the most advanced that stays",
			scaled(2, "db-2", standby("db-0", "0/4000000", false), standby("db-1", "0/5000000", false), primary("db-2")),
			ScaleDown, "db-1", "spec.replicas 2 removes the primary db-2: switching over to db-1"},
		{"among equals, the lowest ordinal",
			scaled(2, "db-2", standby("db-0", "0/5000000", false), standby("db-1", "0/5000000", false), primary("db-2")),
			ScaleDown, "db-0", "switching over to db-0"},
		{"never to an instance that leaves too",
			scaled(1, "db-2", standby("db-0", "0/4000000", false), standby("db-1", "0/5000000", false), primary("db-2")),
			ScaleDown, "db-0", "switching over to db-0"},
		{"none that stays can take over: wait",
			scaled(1, "db-2", dead("db-0"), standby("db-1", "0/5000000", false), primary("db-2")),
			ScaleDown, "", "no instance that stays can take over yet: db-0's agent does not answer"},
		{"a switchover already requested goes first",
			with(scaled(1, "db-2", standby("db-0", "0/5000000", false), standby("db-1", "0/5000000", false), primary("db-2")),
				func(i *Input) { i.Switchover = "db-1" }),
			Demote, "db-1", "switchover to db-1 requested"},
	}, Decide)
}

// A primary is not warned of as failed (PrimaryFailed) while the role is settling: the
// holder took the Lease less than spec.failover.delay ago (a new primary is not ready
// for a moment after every promotion), or, with no holder, the last one released it
// cleanly that recently (a switchover's target is receiving its final WAL). A
// revocation is a failover under way, never settling.
func TestSettling(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.MicroTime { m := metav1.NewMicroTime(now.Add(-d)); return &m }
	held := primarylease.Record{Holder: "db-1", Term: 4}
	released := func(d time.Duration, clean bool) primarylease.Record {
		return primarylease.Record{Term: 3, Handover: &primarylease.Handover{From: "db-0", Term: 3, Clean: clean, Released: true,
			At: metav1.NewTime(now.Add(-d))}}
	}
	revoked := primarylease.Record{Term: 3, Handover: &primarylease.Handover{From: "db-0", Term: 3, At: metav1.NewTime(now)}}
	for _, tc := range []struct {
		name     string
		rec      primarylease.Record
		acquired *metav1.MicroTime
		want     bool
	}{
		{"just promoted", held, at(0), true},
		{"promoted within the delay", held, at(2999 * time.Millisecond), true},
		{"promoted the delay ago", held, at(3 * time.Second), false},
		{"primary for a minute", held, at(time.Minute), false},
		{"no acquire time", held, nil, false},
		{"released cleanly just now", released(0, true), at(time.Hour), true},
		{"released cleanly within the delay", released(2*time.Second, true), at(time.Hour), true},
		{"released cleanly the delay ago", released(3*time.Second, true), at(time.Hour), false},
		{"released after an unclean stop", released(0, false), at(time.Hour), false},
		{"revoked just now", revoked, at(0), false},
		{"vacant with no handover recorded", primarylease.Record{Term: 3}, at(0), false},
	} {
		if got := settling(tc.rec, tc.acquired, now, 3*time.Second); got != tc.want {
			t.Errorf("%s: settling = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSettled(t *testing.T) {
	lease := primarylease.Record{Holder: "db-0", Term: 3, Bootstrapped: true}
	healthy := func() []Instance {
		p := primary("db-0")
		p.Status.Term, p.Status.Gate, p.Status.Confirmation = 3, agentapi.GateAcking, &agentapi.Confirmation{Valid: true, Via: "api"}
		var out = []Instance{p}
		for _, name := range []string{"db-1", "db-2"} {
			s := standby(name, "0/5000000", false)
			s.Status.Term = 3
			s.Status.Receiver = &agentapi.ReceiverStatus{State: agentapi.ReceiverStreaming, Upstream: "db-0", Healthy: true}
			out = append(out, s)
		}
		return out
	}
	none := Decision{Action: None}
	tests := []struct {
		name  string
		lease func(*primarylease.Record)
		d     *Decision
		edit  func([]Instance) []Instance
		want  string // the reason, "" for settled
	}{
		{name: "healthy"},
		{name: "a failover to wait for", d: &Decision{Action: Wait}, want: UnsettledDeciding},
		{name: "no holder", lease: func(r *primarylease.Record) { r.Holder = "" }, want: UnsettledLease},
		{name: "not bootstrapped", lease: func(r *primarylease.Record) { r.Bootstrapped = false }, want: UnsettledLease},
		{name: "hibernating", lease: func(r *primarylease.Record) { r.Hibernation = &primarylease.Hibernation{Phase: primarylease.Stopping} }, want: UnsettledLease},
		{name: "an instance fenced by the user", lease: func(r *primarylease.Record) { r.Fenced = []string{"db-2"} }, want: UnsettledLease},
		{name: "an instance missing", edit: func(in []Instance) []Instance { return in[:2] }, want: UnsettledInstances},
		{name: "a standby that does not answer", edit: func(in []Instance) []Instance { in[2] = dead("db-2"); return in }, want: UnsettledUnreachable},
		{name: "a pod being deleted", edit: func(in []Instance) []Instance { in[1].Terminating = true; return in }, want: UnsettledPod},
		{name: "a primary that crashed", edit: func(in []Instance) []Instance { in[0].Status.RecentCrashes = 1; return in }, want: UnsettledNotReady},
		{name: "a primary whose gate withholds", edit: func(in []Instance) []Instance { in[0].Status.Gate = agentapi.GateWithholding; return in }, want: UnsettledPrimary},
		{name: "a primary not confirmed", edit: func(in []Instance) []Instance { in[0].Status.Confirmation.Valid = false; return in }, want: UnsettledPrimary},
		{name: "an agent behind the Lease's term", edit: func(in []Instance) []Instance { in[1].Status.Term = 2; return in }, want: UnsettledTerm},
		{name: "a frozen standby", edit: func(in []Instance) []Instance { in[1].Status.Frozen = true; return in }, want: UnsettledAgent},
		{name: "a standby not streaming", edit: func(in []Instance) []Instance {
			in[1].Status.Receiver.State = agentapi.ReceiverConnecting
			return in
		}, want: UnsettledStandby},
		{name: "a standby lagging past its bound", edit: func(in []Instance) []Instance { in[2].Status.Receiver.Healthy = false; return in }, want: UnsettledStandby},
		{name: "a standby following another", edit: func(in []Instance) []Instance { in[2].Status.Receiver.Upstream = "db-1"; return in }, want: UnsettledStandby},
		{name: "a second primary", edit: func(in []Instance) []Instance { in[1].Status.Role = agentapi.RolePrimary; return in }, want: UnsettledStandby},
		{name: "an agent error", edit: func(in []Instance) []Instance { in[1].Status.Error = "cloning"; return in }, want: UnsettledAgent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, d, in := lease, none, healthy()
			if tt.lease != nil {
				tt.lease(&l)
			}
			if tt.d != nil {
				d = *tt.d
			}
			if tt.edit != nil {
				in = tt.edit(in)
			}
			if got := Unsettled(l, d, in, 3, ""); got != tt.want {
				t.Errorf("Unsettled = %q, want %q", got, tt.want)
			}
			if got := Settled(l, d, in, 3, ""); got != (tt.want == "") {
				t.Errorf("Settled = %t, want %t", got, tt.want == "")
			}
		})
	}
}

// A primary not ready within PromotionGrace of becoming one (its Lease confirmed, its
// gate started, its clients let in one after the other) is waited for without a
// warning, counted from its promotion; still not ready after it, it is failed over. So
// is a switchover's target receiving the final WAL.
func TestANewPrimaryHasItsFirstSeconds(t *testing.T) {
	promoted := func(promoting time.Duration, ready bool, gate string) Input {
		p := primary("db-1")
		p.Status.Ready, p.Status.Gate, p.Status.Term = ready, gate, 5
		if !ready {
			p.Status.PromotingForMillis = promoting.Milliseconds()
		}
		in := held(p, standby("db-0", "0/5000000", false))
		in.Lease.Holder, in.Lease.Term = "db-1", 5
		return in
	}
	seen := func(in Input, ago time.Duration) Input {
		in.FailedSince, in.FailedHolder, in.FailedTerm = t0.Add(-ago), in.Lease.Holder, in.Lease.Term
		return in
	}
	for _, tc := range []struct {
		name     string
		in       Input
		action   Action
		settling bool
		reason   string
	}{
		{"clients not yet let in, 4 s after its promotion", promoted(4*time.Second, false, agentapi.GateAcking), Wait, true,
			"not ready (commit gate acking) for 4s; failing over after 10s (a new primary's first seconds)"},
		{"its Lease not yet confirmed, 2 s after", seen(promoted(2*time.Second, false, agentapi.GateWithholding), time.Second), Wait, true,
			"for 2s; failing over after 10s"},
		{"still not ready after PromotionGrace", seen(promoted(PromotionGrace+500*time.Millisecond, false, agentapi.GateAcking), PromotionGrace),
			Revoke, false, "not ready (commit gate acking) for 10s"},
		{"ready", promoted(time.Second, true, agentapi.GateAcking), None, false, "is healthy"},
		{"ready once since its promotion, not any more", with(promoted(0, false, agentapi.GateWithholding), func(in *Input) {
			in.Instances[0].Status.PromotingForMillis = 0
		}), Wait, false, "failing over after 3s (spec.failover.delay)"},
		{"in a crash loop", with(promoted(4*time.Second, false, agentapi.GateAcking), func(in *Input) {
			in.Instances[0].Status.RecentCrashes, in.Instances[0].Status.FirstRecentCrashMillisAgo = CrashLoop, 4000
		}), Revoke, false, "crashed 3 times"},
		{"its promotion seen in an earlier term", with(promoted(4*time.Second, false, agentapi.GateAcking), func(in *Input) {
			in.Instances[0].Status.Term = 4
		}), Wait, false, "failing over after 3s (spec.failover.delay)"},
		{"a delay longer than the grace", with(promoted(4*time.Second, false, agentapi.GateAcking), func(in *Input) { in.Delay = 30 * time.Second }),
			Wait, true, "failing over after 30s (spec.failover.delay)"},
		// The switchover's step before: its target receives the final WAL, within its
		// own bound, SwitchoverCatchUp.
		{"a switchover's target receiving the final WAL", clean(with(vacant(primaryStopped("db-0"), standby("db-1", "0/4000000", true)),
			func(i *Input) { i.Switchover = "db-1" }), "0/5000000"), Wait, true, "switchover: waiting for db-1"},
		{"a clean handover waiting for any standby is no switchover step", clean(vacant(dead("db-0"), standby("db-1", "0/4000000", true)), "0/5000000"),
			Wait, false, "waiting for a standby with db-0's final WAL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.action || d.Settling != tc.settling || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("got %s, settling %v (%q); want %s, settling %v, reason containing %q", d.Action, d.Settling, d.Reason,
					tc.action, tc.settling, tc.reason)
			}
		})
	}
}
