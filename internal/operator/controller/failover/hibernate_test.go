package failover

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// stoppedPrimary is db-0 after a kept stop in term 3 at 0/6000028, timeline 1.
func stoppedPrimary() Instance {
	p := primary("db-0")
	p.Status.Running, p.Status.Ready, p.Status.Role = false, false, agentapi.RoleStopped
	p.Status.Handover = &agentapi.Handover{Term: 3, Clean: true, FinalLSN: "0/6000028", Timeline: 1}
	return p
}

func TestDecideHibernation(t *testing.T) {
	record := func(phase string, since time.Duration) *primarylease.Hibernation {
		return &primarylease.Hibernation{Phase: phase, Holder: "db-0", Term: 3, Since: metav1.NewTime(t0.Add(-since))}
	}
	input := func(stopped bool, h *primarylease.Hibernation, instances ...Instance) HibernationInput {
		return HibernationInput{Stopped: stopped, Lease: primarylease.Record{Holder: "db-0", Term: 3, Hibernation: h}, Instances: instances, Now: t0}
	}
	next := func(phase string, final string) *primarylease.Hibernation {
		h := &primarylease.Hibernation{Phase: phase, Holder: "db-0", Term: 3, Since: metav1.NewTime(t0), FinalLSN: final}
		if final != "" {
			h.Timeline = 1
		}
		return h
	}
	cases := []struct {
		name   string
		in     HibernationInput
		want   HibernationDecision
		reason string
	}{
		{"running, not asked to stop: nothing", input(false, nil, primary("db-0")), HibernationDecision{}, ""},
		{"asked to stop: the primary stops first, keeping its role", input(true, nil, primary("db-0"), standby("db-1", "0/5000000", false)),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopping, ""), Event: dbv1.ReasonStopping}, "db-0 stops first"},
		{"stopping, the primary still runs: wait", input(true, record(primarylease.Stopping, time.Second), primary("db-0")),
			HibernationDecision{Active: true, RequeueAfter: 200 * time.Millisecond}, "waiting for the primary db-0 to stop"},
		{"stopping, the primary stopped, a standby lacks its final WAL: wait", input(true, record(primarylease.Stopping, time.Second), stoppedPrimary(), standby("db-1", "0/6000028", false), standby("db-2", "0/5000000", false)),
			HibernationDecision{Active: true, RequeueAfter: 200 * time.Millisecond}, "waiting for db-2 to receive its final WAL"},
		{"stopping, every standby has the final WAL: stopped", input(true, record(primarylease.Stopping, time.Second), stoppedPrimary(), standby("db-1", "0/6000028", false), standby("db-2", "0/60000A0", false)),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopped, "0/6000028"), Event: dbv1.ReasonStopped}, "every running standby has its final WAL"},
		{"stopping, a standby still lacks it after the catch-up time: stopped anyway, said", input(true, record(primarylease.Stopping, StopCatchUp), stoppedPrimary(), standby("db-2", "0/5000000", false)),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopped, "0/6000028"), Event: dbv1.ReasonStopped, Warning: true}, "db-2 did not receive its final WAL"},
		{"stopping, a standby on another timeline lacks it", input(true, record(primarylease.Stopping, time.Second), stoppedPrimary(), func() Instance {
			s := standby("db-1", "0/7000000", false)
			s.Status.Timeline = 2
			return s
		}()), HibernationDecision{Active: true, RequeueAfter: 200 * time.Millisecond}, "waiting for db-1"},
		{"stopping, a stopped standby is not waited for", input(true, record(primarylease.Stopping, time.Second), stoppedPrimary(), dead("db-1")),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopped, "0/6000028"), Event: dbv1.ReasonStopped}, "keeps its role"},
		{"stopping, the primary never answers: stopped after the timeout", input(true, record(primarylease.Stopping, StopTimeout), dead("db-0")),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopped, ""), Event: dbv1.ReasonStopped, Warning: true}, "did not report a clean stop"},
		{"stopped: holds", input(true, record(primarylease.Stopped, time.Hour)), HibernationDecision{Active: true}, "db-0 resumes as the primary"},
		{"a stale record of another term while asked to stop: stopping again", HibernationInput{Stopped: true, Now: t0,
			Lease: primarylease.Record{Holder: "db-1", Term: 5, Hibernation: record(primarylease.Stopped, time.Hour)}},
			HibernationDecision{Write: true, Active: true, Event: dbv1.ReasonStopping,
				Next: &primarylease.Hibernation{Phase: primarylease.Stopping, Holder: "db-1", Term: 5, Since: metav1.NewTime(t0)}}, "db-1 stops first"},
		{"asked to resume: resuming, the same primary", input(false, record(primarylease.Stopped, time.Hour)),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Resuming, ""), Event: dbv1.ReasonResuming}, "db-0 starts again"},
		{"asked to resume while stopping", input(false, record(primarylease.Stopping, time.Second), primary("db-0")),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Resuming, ""), Event: dbv1.ReasonResuming}, "db-0 starts again"},
		{"resuming, the primary not back yet: holds", input(false, record(primarylease.Resuming, time.Minute), dead("db-0")),
			HibernationDecision{Active: true, RequeueAfter: time.Second}, "waiting for db-0"},
		{"resuming, the primary serves: done", input(false, record(primarylease.Resuming, time.Minute), primary("db-0")),
			HibernationDecision{Write: true, Event: dbv1.ReasonResumed}, "db-0 is the primary again"},
		{"resuming, the primary is not back in time: the failover rules apply", input(false, record(primarylease.Resuming, ResumeTimeout), dead("db-0"), standby("db-1", "0/6000028", false)),
			HibernationDecision{Write: true, Event: dbv1.ReasonResumed, Warning: true}, "the failover rules apply again"},
		{"asked to stop while resuming: stopping again", input(true, record(primarylease.Resuming, time.Second), primary("db-0")),
			HibernationDecision{Write: true, Active: true, Next: next(primarylease.Stopping, ""), Event: dbv1.ReasonStopping}, "db-0 stops first"},
		{"a stale record while running: removed", HibernationInput{Now: t0, Lease: primarylease.Record{Holder: "db-1", Term: 5, Hibernation: record(primarylease.Resuming, time.Hour)}},
			HibernationDecision{Write: true}, "another primary"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := DecideHibernation(c.in)
			if !strings.Contains(got.Reason, c.reason) {
				t.Errorf("reason %q, want it to contain %q", got.Reason, c.reason)
			}
			got.Reason = ""
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("DecideHibernation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideFencing(t *testing.T) {
	input := func(requested string, fenced []string, instances ...Instance) FencingInput {
		return FencingInput{Requested: requested, Lease: primarylease.Record{Holder: "db-0", Term: 3, Fenced: fenced},
			Instances: instances, Cluster: "db", Replicas: 3}
	}
	three := []Instance{primary("db-0"), standby("db-1", "0/4000000", false), standby("db-2", "0/5000000", false)}
	cases := []struct {
		name    string
		in      FencingInput
		want    FencingDecision
		waiting string
	}{
		{"nothing asked", input("", nil, three...), FencingDecision{}, ""},
		{"a standby", input("db-1", nil, three...), FencingDecision{Fenced: []string{"db-1"}}, ""},
		{"two standbys, spaces", input(" db-2, db-1 ", nil, three...), FencingDecision{Fenced: []string{"db-1", "db-2"}}, ""},
		{"unfenced", input("", []string{"db-1"}, three...), FencingDecision{}, ""},
		{"the primary: switches over to the most advanced other instance first",
			input("db-0", nil, three...), FencingDecision{SwitchoverTo: "db-2"}, ""},
		{"the primary and a standby: the switchover goes to the other one",
			input("db-0,db-2", nil, three...), FencingDecision{Fenced: []string{"db-2"}, SwitchoverTo: "db-1"}, ""},
		{"the primary, no other instance ready: waits, said",
			input("db-0", nil, primary("db-0"), dead("db-1"), dead("db-2")), FencingDecision{}, "no instance that is not fenced can take over yet"},
		{"every instance: the primary too, in place", input("*", nil, three...), FencingDecision{Fenced: []string{"db-0", "db-1", "db-2"}}, ""},
		{"every instance by name", input("db-0,db-1,db-2", nil, three...), FencingDecision{Fenced: []string{"db-0", "db-1", "db-2"}}, ""},
		{"every instance, one of them without a pod", input("*", nil, primary("db-0"), standby("db-1", "0/4000000", false)),
			FencingDecision{Fenced: []string{"db-0", "db-1", "db-2"}}, ""},
		{"names of no instance are ignored", input("db-7,other-1,db-1", nil, three...), FencingDecision{Fenced: []string{"db-1"}, Ignored: []string{"db-7", "other-1"}}, ""},
		{"a pod beyond spec.replicas (a scale-down under way) can be fenced",
			input("db-3", nil, append(three[:3:3], standby("db-3", "0/5000000", false))...), FencingDecision{Fenced: []string{"db-3"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := DecideFencing(c.in)
			if !strings.Contains(got.Waiting, c.waiting) || (c.waiting == "") != (got.Waiting == "") {
				t.Errorf("waiting %q, want %q", got.Waiting, c.waiting)
			}
			got.Waiting = ""
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("DecideFencing (-want +got):\n%s", diff)
			}
		})
	}
}

// The failover rules leave a held primary alone and never elect a fenced instance.
func TestDecideWithFencingAndHibernation(t *testing.T) {
	fenced := func(in Input, pods ...string) Input { in.Lease.Fenced = pods; return in }
	check(t, []decideCase{
		{"a fenced primary (every instance fenced) is not failed over", fenced(held(stoppedPrimary(), standby("db-1", "0/6000028", false)), "db-0", "db-1"),
			None, "", "db-0 is fenced"},
		{"a hibernating primary is not failed over", with(held(stoppedPrimary(), standby("db-1", "0/6000028", false)), func(i *Input) {
			i.Lease.Hibernation = &primarylease.Hibernation{Phase: primarylease.Stopped, Holder: "db-0", Term: 3}
		}), None, "", "spec.stopped"},
		{"a switchover to a fenced instance is refused", with(fenced(held(primary("db-0"), standby("db-1", "0/5000000", false)), "db-1"), func(i *Input) {
			i.Switchover = "db-1"
		}), RefuseSwitchover, "db-1", "db-1 is fenced"},
		{"a switchover while hibernating is refused", with(held(primary("db-0"), standby("db-1", "0/5000000", false)), func(i *Input) {
			i.Switchover = "db-1"
			i.Lease.Hibernation = &primarylease.Hibernation{Phase: primarylease.Stopping, Holder: "db-0", Term: 3}
		}), RefuseSwitchover, "db-1", "spec.stopped"},
		{"a failover never elects a fenced standby", fenced(vacant(dead("db-0"), standby("db-1", "0/4000000", true), standby("db-2", "0/5000000", true)), "db-2"),
			Move, "db-1", ""},
		{"a failed primary with only fenced standbys: blocked", with(fenced(held(dead("db-0"), standby("db-1", "0/4000000", false)), "db-1"), func(i *Input) {
			i.FailedSince, i.FailedHolder, i.FailedTerm = t0.Add(-5*time.Second), "db-0", 3
		}), Blocked, "", "no replica is running"},
	}, Decide)
}

func TestRequestedFencing(t *testing.T) {
	instances := []Instance{primary("db-0"), standby("db-1", "0/4000000", false), standby("db-2", "0/5000000", false)}
	for requested, want := range map[string][]string{
		"":               nil,
		"db-2, db-0":     {"db-0", "db-2"},
		"*":              {"db-0", "db-1", "db-2"},
		"db-9,other-1":   nil,
		"db-1,db-1,db-9": {"db-1"},
	} {
		got := RequestedFencing(FencingInput{Requested: requested, Instances: instances, Cluster: "db", Replicas: 3})
		if !slices.Equal(got, want) {
			t.Errorf("RequestedFencing(%q) = %v, want %v", requested, got, want)
		}
	}
}
