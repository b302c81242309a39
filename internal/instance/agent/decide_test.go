package agent

import (
	"testing"

	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

func TestDecide(t *testing.T) {
	view := func(holder string, term int32) LeaseView { return LeaseView{Known: true, Holder: holder, Term: term} }
	running := func(role, upstream string) Observation {
		return Observation{Me: "db-1", Running: true, Role: role, Upstream: upstream}
	}
	stopped := func(data postgres.DataState) Observation { return Observation{Me: "db-1", Data: data} }
	with := func(o Observation, v LeaseView, edit func(*Observation)) Observation {
		o.View = v
		if edit != nil {
			edit(&o)
		}
		return o
	}
	hibernating := func(holder string, term int32, phase string) LeaseView {
		v := view(holder, term)
		v.Hibernation = &primarylease.Hibernation{Phase: phase, Holder: holder, Term: term}
		return v
	}
	fenced := func(v LeaseView, pods ...string) LeaseView {
		v.Fenced = pods
		return v
	}
	cases := []struct {
		name   string
		o      Observation
		act    Act
		target string
	}{
		{"Lease not read yet: nothing", Observation{Me: "db-1"}, Idle, ""},

		// The Lease names this instance.
		{"holder, running primary: keep", with(running(agentapi.RolePrimary, ""), view("db-1", 3), nil), KeepPrimary, ""},
		{"holder, running standby: promote", with(running(agentapi.RoleReplica, "db-0"), view("db-1", 3), nil), Promote, ""},
		{"holder, frozen standby: promote", with(running(agentapi.RoleReplica, ""), view("db-1", 3), func(o *Observation) { o.Frozen, o.FrozenTerm = true, 2 }), Promote, ""},
		{"holder, stopped: start as primary", with(stopped(postgres.DataPrimary), view("db-1", 3), nil), StartPrimary, ""},
		{"holder fenced in this term: stays down", with(stopped(postgres.DataPrimary), view("db-1", 3), func(o *Observation) { o.Fenced, o.FencedTerm = true, 3 }), Idle, ""},
		{"holder fenced in an earlier term: starts", with(stopped(postgres.DataPrimary), view("db-1", 4), func(o *Observation) { o.Fenced, o.FencedTerm = true, 3 }), StartPrimary, ""},
		{"holder, postgres starting: wait", with(running(agentapi.RoleStarting, ""), view("db-1", 3), nil), Idle, ""},

		// A replica cluster: the holder is its designated primary, a standby of the source.
		{"designated, empty: clones the source", with(stopped(postgres.DataEmpty), view("db-1", 1), func(o *Observation) { o.Source = "src-rw.prod.svc" }), StartStandby, "src-rw.prod.svc"},
		{"designated, standby data: starts on the source", with(stopped(postgres.DataStandby), view("db-1", 1), func(o *Observation) { o.Source = "src-rw.prod.svc" }), StartStandby, "src-rw.prod.svc"},
		{"designated, primary data: starts on the source", with(stopped(postgres.DataPrimary), view("db-1", 1), func(o *Observation) { o.Source = "src-rw.prod.svc" }), StartStandby, "src-rw.prod.svc"},
		{"designated, running primary: demoted", with(running(agentapi.RolePrimary, ""), view("db-1", 3), func(o *Observation) { o.Source = "src-rw.prod.svc" }), Demote, "src-rw.prod.svc"},
		{"designated after a failover: follows the source", with(running(agentapi.RoleReplica, "db-0"), view("db-1", 3), func(o *Observation) { o.Source = "src-rw.prod.svc" }), Follow, "src-rw.prod.svc"},
		{"designated, frozen: follows the source", with(running(agentapi.RoleReplica, ""), view("db-1", 3), func(o *Observation) { o.Source, o.Frozen, o.FrozenTerm = "src-rw.prod.svc", true, 2 }), Follow, "src-rw.prod.svc"},
		{"designated, following the source: keep", with(running(agentapi.RoleReplica, "src-rw.prod.svc"), view("db-1", 3), func(o *Observation) { o.Source = "src-rw.prod.svc" }), KeepStandby, "src-rw.prod.svc"},
		{"designated, replica cluster promoted: promote", with(running(agentapi.RoleReplica, "src-rw.prod.svc"), view("db-1", 3), nil), Promote, ""},
		{"replica cluster, not the holder: follows the holder", with(running(agentapi.RoleReplica, "src-rw.prod.svc"), view("db-0", 3), func(o *Observation) { o.Source = "src-rw.prod.svc" }), Follow, "db-0"},

		// The Lease names no holder: a failover or handover is under way.
		{"vacant, running primary: step down", with(running(agentapi.RolePrimary, ""), view("", 4), nil), StepDown, ""},
		{"vacant, streaming standby: freeze", with(running(agentapi.RoleReplica, "db-0"), view("", 4), nil), Freeze, ""},
		{"vacant after a clean release, streaming standby: no freeze", with(running(agentapi.RoleReplica, "db-0"),
			LeaseView{Known: true, Term: 4, Handover: &primarylease.Handover{From: "db-0", Clean: true, Released: true}}, nil), Idle, ""},
		{"vacant after an unclean release, streaming standby: freeze", with(running(agentapi.RoleReplica, "db-0"),
			LeaseView{Known: true, Term: 4, Handover: &primarylease.Handover{From: "db-0", Released: true}}, nil), Freeze, ""},
		{"vacant, frozen standby: keep", with(running(agentapi.RoleReplica, ""), view("", 4), func(o *Observation) { o.Frozen, o.FrozenTerm = true, 4 }), KeepStandby, ""},
		{"vacant, stopped standby: start frozen", with(stopped(postgres.DataStandby), view("", 4), nil), StartStandby, ""},
		{"vacant, stopped primary data: nothing", with(stopped(postgres.DataPrimary), view("", 4), nil), Idle, ""},

		// The Lease names another instance.
		{"follower, running primary: step down", with(running(agentapi.RolePrimary, ""), view("db-0", 5), nil), StepDown, ""},
		{"follower, standby of the holder: keep", with(running(agentapi.RoleReplica, "db-0"), view("db-0", 5), nil), KeepStandby, "db-0"},
		{"follower, standby of another: follow the holder", with(running(agentapi.RoleReplica, "db-2"), view("db-0", 5), nil), Follow, "db-0"},
		{"follower, frozen in this term: stays frozen", with(running(agentapi.RoleReplica, ""), view("db-0", 4), func(o *Observation) { o.Frozen, o.FrozenTerm = true, 4 }), KeepStandby, ""},
		{"follower, frozen in an earlier term: follow the new holder", with(running(agentapi.RoleReplica, ""), view("db-0", 5), func(o *Observation) { o.Frozen, o.FrozenTerm = true, 4 }), Follow, "db-0"},
		{"follower, stopped: start as the holder's standby", with(stopped(postgres.DataStandby), view("db-0", 5), nil), StartStandby, "db-0"},
		{"follower, stopped after a freeze in this term: start frozen, never streaming from the old holder",
			with(stopped(postgres.DataStandby), view("db-0", 4), func(o *Observation) { o.Frozen, o.FrozenTerm = true, 4 }), StartStandby, ""},
		{"follower, stopped old primary: start as standby (rewind)", with(stopped(postgres.DataPrimary), view("db-0", 5), nil), StartStandby, "db-0"},

		// Kept down by the Lease: hibernation and the user's fencing.
		{"holder of a stopping cluster, running primary: stop, keeping the Lease", with(running(agentapi.RolePrimary, ""),
			hibernating("db-1", 3, primarylease.Stopping), nil), Stop, ""},
		{"holder of a stopped cluster, stopped: stays down", with(stopped(postgres.DataPrimary), hibernating("db-1", 3, primarylease.Stopped), nil), Idle, ""},
		{"holder of a resuming cluster: starts as primary", with(stopped(postgres.DataPrimary), hibernating("db-1", 3, primarylease.Resuming), nil), StartPrimary, ""},
		{"holder of a hibernation recorded in an earlier term: starts as primary", with(stopped(postgres.DataPrimary),
			LeaseView{Known: true, Holder: "db-1", Term: 4, Hibernation: &primarylease.Hibernation{Phase: primarylease.Stopped, Holder: "db-1", Term: 3}}, nil), StartPrimary, ""},
		{"standby of a stopping cluster: keeps streaming its final WAL", with(running(agentapi.RoleReplica, "db-0"),
			hibernating("db-0", 3, primarylease.Stopping), nil), KeepStandby, "db-0"},
		{"fenced standby, running: stop", with(running(agentapi.RoleReplica, "db-0"), fenced(view("db-0", 5), "db-1"), nil), Stop, ""},
		{"fenced standby, stopped: stays down", with(stopped(postgres.DataStandby), fenced(view("db-0", 5), "db-1"), nil), Idle, ""},
		{"fenced standby while the Lease is vacant: stays down", with(stopped(postgres.DataStandby), fenced(view("", 5), "db-1"), nil), Idle, ""},
		{"fenced holder, running primary: stop, keeping the Lease", with(running(agentapi.RolePrimary, ""), fenced(view("db-1", 5), "db-1", "db-0"), nil), Stop, ""},
		{"another instance fenced: follow as usual", with(stopped(postgres.DataStandby), fenced(view("db-0", 5), "db-2"), nil), StartStandby, "db-0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.o)
			if d.Act != c.act || d.Target != c.target {
				t.Errorf("Decide = %s %q (%s), want %s %q", d.Act, d.Target, d.Reason, c.act, c.target)
			}
			if d.Reason == "" {
				t.Error("a decision without a reason")
			}
		})
	}
}

func TestParsePromotionToken(t *testing.T) {
	tok, err := parsePromotionToken("7716692280013944060:3:0/6000028")
	if err != nil || tok.system != "7716692280013944060" || tok.timeline != 3 || tok.lsn.String() != "0/6000028" {
		t.Errorf("parsed %+v, %v", tok, err)
	}
	for _, bad := range []string{"", "0/6000028", "x:1", "7:one:0/1", "7:1:zz"} {
		if _, err := parsePromotionToken(bad); err == nil {
			t.Errorf("%q was taken for a token", bad)
		}
	}
}
