package primarylease_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// A writeCase is one write applied by Apply to a Lease in the state seed, with nobody
// else writing.
type writeCase struct {
	name   string
	seed   *coordinationv1.Lease
	change primarylease.Change
	// err is the error the write ends with; a refused write leaves the Lease as it was,
	// resourceVersion included.
	err error
	// want makes the Lease expected after the write from the seed.
	want func(*state)
}

// runWrites runs each case as by (the agent or the operator) writes in production.
func runWrites(t *testing.T, by writer, cases []writeCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tl, before := create(t, tc.seed)
			written, err := tl.apply(by, nil, tc.change, writeTime)
			wantErr(t, err, tc.err)
			after := tl.get()
			if tc.err != nil {
				if after.ResourceVersion != before.ResourceVersion {
					t.Errorf("a refused write changed the Lease: resourceVersion %s, was %s", after.ResourceVersion, before.ResourceVersion)
				}
				wantState(t, after, before, nil)
				return
			}
			if written.ResourceVersion != after.ResourceVersion {
				t.Errorf("Apply returned the Lease at resourceVersion %s; the API server has %s", written.ResourceVersion, after.ResourceVersion)
			}
			wantState(t, after, before, tc.want)
		})
	}
}

// runGuarded runs cases, then the refusals of a write that only the holder in its term
// may make: change(holder, term) is that write, decided for db-0 in term 3 unless the
// case says otherwise. Each refusal ends with ErrNotHolder and leaves the Lease as it
// was.
func runGuarded(t *testing.T, by writer, cases []writeCase, change func(holder string, term int32) primarylease.Change) {
	refusals := []writeCase{
		{name: "refused: another pod in the holder's term", seed: held("db-0", 3), change: change("db-1", 3)},
		{name: "refused: the Lease moved to another pod", seed: held("db-1", 4), change: change("db-0", 3)},
		{name: "refused: the holder of a past term, holding the Lease again", seed: held("db-0", 5), change: change("db-0", 3)},
		{name: "refused: the last holder after the Lease was vacated", seed: vacant("db-0", 4), change: change("db-0", 3)},
		{name: "refused: the last holder in the vacant term", seed: vacant("db-0", 4), change: change("db-0", 4)},
	}
	for i := range refusals {
		refusals[i].err = primarylease.ErrNotHolder
	}
	runWrites(t, by, append(cases, refusals...))
}

func TestRenew(t *testing.T) {
	nextSync := &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": "0/4000000", "db-2": ""}}
	runGuarded(t, agent, []writeCase{{
		name:   "the holder in its term: only the renewal time changes",
		seed:   held("db-0", 3),
		change: primarylease.Renew("db-0", 3, nil),
		want:   func(s *state) { s.RenewTime = writeTime },
	}, {
		name:   "the holder with a synchronous set: the set is replaced",
		seed:   held("db-0", 3),
		change: primarylease.Renew("db-0", 3, nextSync),
		want:   func(s *state) { s.RenewTime, s.Sync = writeTime, nextSync },
	}}, func(holder string, term int32) primarylease.Change {
		return primarylease.Renew(holder, term, nextSync)
	})
}

func TestRelease(t *testing.T) {
	runGuarded(t, agent, []writeCase{{
		name: "the holder after a clean stop records its final position; From, Term, Released and At are its own",
		seed: held("db-0", 3),
		change: primarylease.Release("db-0", 3, primarylease.Handover{From: "db-9", Term: 9, At: metav1.NewTime(t0),
			Reason: "stopping", Clean: true, FinalLSN: "0/6000000", Timeline: 4}),
		want: func(s *state) {
			s.Holder, s.Term = "", 4
			s.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "stopping", Clean: true, FinalLSN: "0/6000000",
				Timeline: 4, Released: true, At: metav1.NewTime(writeTime)}
		},
	}, {
		name:   "the holder after an unclean stop records no position",
		seed:   held("db-0", 3),
		change: primarylease.Release("db-0", 3, primarylease.Handover{Reason: "postgres did not stop"}),
		want: func(s *state) {
			s.Holder, s.Term = "", 4
			s.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "postgres did not stop", Released: true, At: metav1.NewTime(writeTime)}
		},
	}}, func(holder string, term int32) primarylease.Change {
		// After a vacancy, a second release: the term does not grow again.
		return primarylease.Release(holder, term, primarylease.Handover{Reason: "stopping", Clean: true, FinalLSN: "0/7000000"})
	})
}

func TestRevoke(t *testing.T) {
	runGuarded(t, operator, []writeCase{{
		name:   "the holder in its term: vacated in a new term, the rest kept",
		seed:   held("db-0", 3),
		change: primarylease.Revoke("db-0", 3, "db-0 failed"),
		want: func(s *state) {
			s.Holder, s.Term = "", 4
			s.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "db-0 failed", At: metav1.NewTime(writeTime)}
		},
	}}, func(holder string, term int32) primarylease.Change {
		// After a vacancy: the holder's own clean release is kept.
		return primarylease.Revoke(holder, term, "failed")
	})
}

func TestMove(t *testing.T) {
	sync := &primarylease.SyncSet{K: 1, Members: map[string]string{"db-2": ""}}
	// moved is the Lease moved to to in term, with timeline and sync.
	moved := func(to string, term int32, timeline int64, sync *primarylease.SyncSet) func(*state) {
		return func(s *state) {
			s.Holder, s.Term, s.Timeline, s.Sync = to, term, timeline, sync
			s.Acquired, s.RenewTime, s.DurationSeconds = writeTime, writeTime, 4
			s.Handover = nil
		}
	}
	runWrites(t, operator, []writeCase{{
		name:   "a failover from a vacant Lease: the handover goes",
		seed:   vacant("db-0", 4),
		change: primarylease.Move(4, "db-1", sync, 2),
		want:   moved("db-1", 5, 5, sync),
	}, {
		name:   "the timeline goes above the highest in use",
		seed:   vacant("db-0", 4),
		change: primarylease.Move(4, "db-1", sync, 8),
		want:   moved("db-1", 5, 9, sync),
	}, {
		name:   "asynchronous mode: no synchronous set is recorded",
		seed:   vacant("db-0", 4),
		change: primarylease.Move(4, "db-1", nil, 2),
		want:   moved("db-1", 5, 5, nil),
	}, {
		name:   "a held Lease, given back to its holder in a new term",
		seed:   held("db-0", 3),
		change: primarylease.Move(3, "db-0", sync, 4),
		want:   moved("db-0", 4, 5, sync),
	}, {
		name:   "refused: a Lease in a later term (another move came first)",
		seed:   vacant("db-0", 4),
		change: primarylease.Move(3, "db-1", sync, 2),
		err:    primarylease.ErrNotHolder,
	}})
}

func TestReserveTimelineOnTheAPIServer(t *testing.T) {
	runGuarded(t, agent, []writeCase{{
		name:   "the holder's history reaches the reservation: it takes the next one",
		seed:   held("db-0", 3),
		change: primarylease.ReserveTimeline("db-0", 3, 4),
		want:   func(s *state) { s.Timeline = 5 },
	}, {
		name:   "a reservation above the holder's history is kept",
		seed:   held("db-0", 3),
		change: primarylease.ReserveTimeline("db-0", 3, 3),
	}}, func(holder string, term int32) primarylease.Change {
		return primarylease.ReserveTimeline(holder, term, 9)
	})
}

func TestSetHibernation(t *testing.T) {
	stopping := &primarylease.Hibernation{Phase: primarylease.Stopping, Holder: "db-0", Term: 3, Since: metav1.NewTime(t0)}
	stopped := &primarylease.Hibernation{Phase: primarylease.Stopped, Holder: "db-0", Term: 3, Since: metav1.NewTime(writeTime),
		FinalLSN: "0/6000000", Timeline: 4}
	runGuarded(t, operator, []writeCase{{
		name:   "stopping, for the holder in its term",
		seed:   held("db-0", 3),
		change: primarylease.SetHibernation("db-0", 3, stopping),
		want:   func(s *state) { s.Hibernation = stopping },
	}, {
		name:   "stopped, with the final position",
		seed:   held("db-0", 3),
		change: primarylease.SetHibernation("db-0", 3, stopped),
		want:   func(s *state) { s.Hibernation = stopped },
	}, {
		name:   "nil removes the record",
		seed:   held("db-0", 3),
		change: primarylease.SetHibernation("db-0", 3, nil),
		want:   func(s *state) { s.Hibernation = nil },
	}, {
		name:   "nil with no record changes nothing",
		seed:   with(held("db-0", 3), dbv1.AnnotationHibernation, ""),
		change: primarylease.SetHibernation("db-0", 3, nil),
	}}, func(holder string, term int32) primarylease.Change {
		// A removal refused: the record is kept.
		return primarylease.SetHibernation(holder, term, nil)
	})
}

func TestSetFenced(t *testing.T) {
	runGuarded(t, operator, []writeCase{{
		name:   "fencing standbys replaces the list",
		seed:   held("db-0", 3),
		change: primarylease.SetFenced("db-0", 3, []string{"db-1", "db-2"}),
		want:   func(s *state) { s.Fenced = []string{"db-1", "db-2"} },
	}, {
		name:   "every instance, the holder among them",
		seed:   held("db-0", 3),
		change: primarylease.SetFenced("db-0", 3, []string{"db-0", "db-1", "db-2"}),
		want:   func(s *state) { s.Fenced = []string{"db-0", "db-1", "db-2"} },
	}, {
		name:   "none removes the record",
		seed:   held("db-0", 3),
		change: primarylease.SetFenced("db-0", 3, nil),
		want:   func(s *state) { s.Fenced = nil },
	}, {
		name:   "an empty list removes the record",
		seed:   held("db-0", 3),
		change: primarylease.SetFenced("db-0", 3, []string{}),
		want:   func(s *state) { s.Fenced = nil },
	}}, func(holder string, term int32) primarylease.Change {
		// An unfencing refused: the fenced instance stays fenced.
		return primarylease.SetFenced(holder, term, nil)
	})
}

// MarkBootstrapped and DropLegacyReports have no precondition: they are written
// whoever holds the Lease, and touch nothing else of it.
func TestUnguardedWrites(t *testing.T) {
	runWrites(t, operator, []writeCase{{
		name:   "bootstrapped on a held Lease that was not",
		seed:   with(held("db-0", 3), dbv1.AnnotationBootstrapped, ""),
		change: primarylease.MarkBootstrapped(),
		want:   func(s *state) { s.Bootstrapped = true },
	}, {
		name:   "bootstrapped again changes nothing",
		seed:   held("db-0", 3),
		change: primarylease.MarkBootstrapped(),
	}, {
		name:   "bootstrapped on a vacant Lease, in any term",
		seed:   with(vacant("db-0", 4), dbv1.AnnotationBootstrapped, ""),
		change: primarylease.MarkBootstrapped(),
		want:   func(s *state) { s.Bootstrapped = true },
	}, {
		name:   "the old reports dropped, the leadership kept",
		seed:   held("db-0", 3),
		change: primarylease.DropLegacyReports(),
		want:   func(s *state) { s.Legacy = nil },
	}, {
		name:   "dropping reports that are not there changes nothing",
		seed:   with(with(with(held("db-0", 3), primarylease.LegacyDataGuard, ""), primarylease.LegacyLastFailover, ""), primarylease.LegacyDataVersion, ""),
		change: primarylease.DropLegacyReports(),
	}})
}

// New and Rebuild make the Lease the operator creates: a new cluster's, or one
// recreated after it was deleted with what Rebuild's documentation lists (holder, term,
// bootstrapped mark, handover, synchronous set, timeline reservation), renewed now.
func TestNewAndRebuild(t *testing.T) {
	sync := &primarylease.SyncSet{K: 1, Members: map[string]string{"db-0": "", "db-2": ""}}
	handover := &primarylease.Handover{From: "db-1", Term: 7, Reason: "the Lease was deleted", Recreated: true, At: metav1.NewTime(t0)}
	// recorded is a Record with every field set, as read before the Lease was deleted.
	recorded := func(holder string, term int32, h *primarylease.Handover) primarylease.Record {
		return primarylease.Record{Holder: holder, Term: term, RenewTime: t0, Bootstrapped: true, Handover: h, Sync: sync,
			Timeline: 9, Fenced: []string{"db-2"},
			Hibernation: &primarylease.Hibernation{Phase: primarylease.Stopped, Holder: holder, Term: term}}
	}
	rebuild := func(r primarylease.Record) *coordinationv1.Lease {
		l, err := primarylease.Rebuild(namespace, "", "db", r, writeTime)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	renewed := state{Acquired: writeTime, DurationSeconds: 4}
	renewed.RenewTime = writeTime
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  func(*state)
	}{{
		name:  "a new cluster's first primary, in term 0",
		lease: primarylease.New(namespace, "", "db", "db-0", writeTime),
		want:  func(s *state) { s.Holder = "db-0" },
	}, {
		name:  "rebuilt naming the holder the agents agree on",
		lease: rebuild(recorded("db-1", 7, nil)),
		want:  func(s *state) { s.Holder, s.Term, s.Bootstrapped, s.Sync, s.Timeline = "db-1", 7, true, sync, 9 },
	}, {
		name:  "rebuilt naming no holder, with the handover",
		lease: rebuild(recorded("", 8, handover)),
		want:  func(s *state) { s.Term, s.Bootstrapped, s.Handover, s.Sync, s.Timeline = 8, true, handover, sync, 9 },
	}, {
		name:  "rebuilt from a record of a holder and term only",
		lease: rebuild(primarylease.Record{Holder: "db-0", Term: 2}),
		want:  func(s *state) { s.Holder, s.Term = "db-0", 2 },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, created := create(t, tc.lease)
			want := renewed
			tc.want(&want)
			if diff := cmp.Diff(want, stateOf(created)); diff != "" {
				t.Errorf("the Lease created (-want +got):\n%s", diff)
			}
			if got := created.Labels[dbv1.LabelCluster]; got != "db" {
				t.Errorf("label %s=%q, want db", dbv1.LabelCluster, got)
			}
		})
	}
}
