package failover

import (
	"strings"
	"testing"

	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// viewing is inst, with data, seeing holder in term.
func viewing(inst Instance, holder string, term int32) Instance {
	inst.Status.Holder, inst.Status.Term, inst.Status.SystemIdentifier = holder, term, "7301234567890123456"
	return inst
}

// empty is an instance whose agent answers with no data directory.
func empty(name string) Instance {
	i := standby(name, "", false)
	i.Status.Running, i.Status.Role, i.Status.Timeline, i.Status.Position = false, "", 0, ""
	return i
}

func missing(instances ...Instance) MissingLease {
	return MissingLease{Expected: []string{"db-0", "db-1", "db-2"}, Instances: instances}
}

func TestDecideMissingLease(t *testing.T) {
	bootstrapped := func(m MissingLease) MissingLease { m.Bootstrapped = true; return m }
	cases := []struct {
		name string
		in   MissingLease
		// want is nil to wait.
		want      *primarylease.Record
		recreated bool
		reason    string
	}{
		{name: "new cluster, every volume empty: instance 0",
			in:   missing(empty("db-0"), empty("db-1"), empty("db-2")),
			want: &primarylease.Record{Holder: "db-0"}, reason: "no instance reports data"},
		{name: "new cluster, no pod yet: instance 0",
			in:   missing(),
			want: &primarylease.Record{Holder: "db-0"}, reason: "no instance reports data"},
		{name: "new cluster, one instance without a pod: instance 0",
			in:   missing(empty("db-0"), empty("db-1")),
			want: &primarylease.Record{Holder: "db-0"}, reason: "no instance reports data"},
		{name: "an agent reports data: the primary they all follow, same term",
			in:   missing(empty("db-0"), viewing(primary("db-1"), "db-1", 5), viewing(standby("db-2", "0/5000000", false), "db-1", 5)),
			want: &primarylease.Record{Holder: "db-1", Term: 5, Bootstrapped: true, Timeline: 1}, recreated: true,
			reason: "naming db-1 in term 5"},
		{name: "Bootstrapped condition, volumes unseen: no holder, never instance 0",
			in:   bootstrapped(missing(dead("db-0"), dead("db-1"), dead("db-2"))),
			want: &primarylease.Record{Term: 1, Bootstrapped: true}, recreated: true, reason: "Bootstrapped condition"},
		{name: "the followed primary does not run: no holder, a newer term",
			in: missing(viewing(dead("db-0"), "", 0), viewing(standby("db-1", "0/5000000", false), "db-0", 5),
				viewing(standby("db-2", "0/5000000", false), "db-0", 5)),
			want:      &primarylease.Record{Term: 6, Bootstrapped: true, Timeline: 1},
			recreated: true, reason: "naming no primary in term 6"},
		{name: "agents of the newest term disagree: no holder",
			in: missing(viewing(primary("db-0"), "db-0", 5), viewing(standby("db-1", "0/5000000", false), "db-2", 5),
				viewing(standby("db-2", "0/5000000", false), "db-0", 5)),
			want: &primarylease.Record{Term: 6, Bootstrapped: true, Timeline: 1}, recreated: true},
		{name: "the holder of a lagging view is not followed: the newest term wins",
			in: missing(viewing(primary("db-0"), "db-0", 5), viewing(standby("db-1", "0/5000000", false), "", 6),
				viewing(standby("db-2", "0/5000000", false), "db-0", 5)),
			want: &primarylease.Record{Term: 7, Bootstrapped: true, Timeline: 1}, recreated: true},
		{name: "kept volumes, their agents not answering yet: wait, never instance 0",
			in:     editMissing(missing(dead("db-0"), empty("db-1")), func(m *MissingLease) { m.KeptVolumes = []string{"db-0", "db-1", "db-2"} }),
			reason: "waiting for the agents of db-0, db-2"},
		{name: "kept volumes, every one seen empty: a new cluster",
			in:   editMissing(missing(empty("db-0"), empty("db-1")), func(m *MissingLease) { m.KeptVolumes = []string{"db-0", "db-1"} }),
			want: &primarylease.Record{Holder: "db-0"}, reason: "no instance reports data"},
		{name: "kept volumes with data: rebuilt from the agents, not a new cluster",
			in: editMissing(missing(empty("db-0"), viewing(standby("db-1", "0/5000000", false), "", 0), dead("db-2")),
				func(m *MissingLease) { m.KeptVolumes = []string{"db-0", "db-1", "db-2"} }),
			want: &primarylease.Record{Term: 1, Bootstrapped: true, Timeline: 1}, recreated: true, reason: "instances with data: db-1"},
		{name: "the operator saw a newer term than any agent: no holder above it",
			in: editMissing(missing(viewing(primary("db-0"), "db-0", 5), viewing(standby("db-1", "0/5000000", false), "db-0", 5)),
				func(m *MissingLease) { m.Remembered = &primarylease.Record{Holder: "db-2", Term: 8, Timeline: 4} }),
			want: &primarylease.Record{Term: 9, Bootstrapped: true, Timeline: 4}, recreated: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideMissingLease(tc.in)
			if !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", got.Reason, tc.reason)
			}
			if got.Recreated != tc.recreated {
				t.Errorf("recreated %v, want %v", got.Recreated, tc.recreated)
			}
			if (got.Record == nil) != (tc.want == nil) {
				t.Fatalf("record %+v, want %+v", got.Record, tc.want)
			}
			if tc.want == nil {
				return
			}
			r := *got.Record
			if r.Holder != tc.want.Holder || r.Term != tc.want.Term || r.Bootstrapped != tc.want.Bootstrapped || r.Timeline != tc.want.Timeline {
				t.Errorf("holder %q term %d bootstrapped %v timeline %d; want holder %q term %d bootstrapped %v timeline %d",
					r.Holder, r.Term, r.Bootstrapped, r.Timeline, tc.want.Holder, tc.want.Term, tc.want.Bootstrapped, tc.want.Timeline)
			}
			if r.Holder == "" && tc.recreated {
				if h := r.Handover; h == nil || !h.Recreated || h.Clean || h.Term != r.Term-1 {
					t.Errorf("handover %+v; want an unclean, recreated one from term %d", h, r.Term-1)
				}
			}
		})
	}
}

// A rebuilt Lease in synchronous mode takes every instance but the holder for a member
// until the holder writes its own set: a failover before that assumes any of them may
// have acknowledged a commit.
func TestRebuiltLeaseAssumesEveryStandbyAMember(t *testing.T) {
	in := missing(viewing(primary("db-1"), "db-1", 5), viewing(standby("db-2", "0/5000000", false), "db-1", 5))
	in.SynchronousReplicas = 1
	got := DecideMissingLease(in)
	if got.Record == nil || got.Record.Sync == nil {
		t.Fatalf("no synchronous set: %+v", got.Record)
	}
	if s := got.Record.Sync; s.K != 1 || len(s.Members) != 2 || s.Members["db-0"] != "" || s.Members["db-2"] != "" {
		t.Errorf("synchronous set %+v; want K 1 with members db-0 and db-2", s)
	}
	if _, ok := got.Record.Sync.Members["db-1"]; ok {
		t.Error("the holder is a member of its own synchronous set")
	}
}

func editMissing(m MissingLease, edit func(*MissingLease)) MissingLease {
	edit(&m)
	return m
}
