package primarylease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// A conflictCase is a write that by applies while the other writer changes the Lease
// between its read and its write: the API server answers 409, and Apply must read the
// Lease again and decide again, never write over the other writer's change.
type conflictCase struct {
	name   string
	seed   *coordinationv1.Lease
	by     writer
	change primarylease.Change
	// interloper is the other writer's change, applied before by's first write (before
	// every one with everyAttempt), at interloperTime (plus a microsecond an attempt).
	interloper   primarylease.Change
	everyAttempt bool
	// err is the error the write ends with; conflict: a conflict, after every attempt.
	err      error
	conflict bool
	// updates is how many writes by attempted.
	updates int
	// want makes what the write leaves of the Lease the interloper wrote last (nil: it
	// leaves it as it was).
	want func(*state)
}

func TestApplyAfterAConflict(t *testing.T) {
	nextSync := &primarylease.SyncSet{K: 1, Members: map[string]string{"db-1": "", "db-2": ""}}
	release := primarylease.Release("db-0", 3, primarylease.Handover{Reason: "stopping", Clean: true, FinalLSN: "0/6000000", Timeline: 4})
	revoke := primarylease.Revoke("db-0", 3, "db-0 failed")
	renew := primarylease.Renew("db-0", 3, nil)
	for _, tc := range []conflictCase{{
		name:       "a renewal after a revocation: refused, the revocation stands",
		seed:       held("db-0", 3),
		by:         agent,
		change:     primarylease.Renew("db-0", 3, nextSync),
		interloper: revoke,
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a renewal after a move back to the same pod in a new term: refused",
		seed:       held("db-0", 3),
		by:         agent,
		change:     renew,
		interloper: primarylease.Move(3, "db-0", nextSync, 4),
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a revocation after the holder's release: refused, the clean release stands",
		seed:       held("db-0", 3),
		by:         operator,
		change:     revoke,
		interloper: release,
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a release after a revocation: refused, the term grows once",
		seed:       held("db-0", 3),
		by:         agent,
		change:     release,
		interloper: revoke,
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a move after another operator's move: refused, the first move stands",
		seed:       vacant("db-0", 4),
		by:         operator,
		change:     primarylease.Move(4, "db-1", nextSync, 4),
		interloper: primarylease.Move(4, "db-2", nextSync, 4),
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a hibernation decided before a failover: refused",
		seed:       held("db-0", 3),
		by:         operator,
		change:     primarylease.SetHibernation("db-0", 3, &primarylease.Hibernation{Phase: primarylease.Stopping, Holder: "db-0", Term: 3}),
		interloper: revoke,
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a timeline reservation after a move: refused, the move's reservation stands",
		seed:       held("db-0", 3),
		by:         agent,
		change:     primarylease.ReserveTimeline("db-0", 3, 9),
		interloper: primarylease.Move(3, "db-1", nextSync, 5),
		err:        primarylease.ErrNotHolder,
		updates:    1,
	}, {
		name:       "a renewal after a fencing: renewed, the fencing kept",
		seed:       held("db-0", 3),
		by:         agent,
		change:     primarylease.Renew("db-0", 3, nextSync),
		interloper: primarylease.SetFenced("db-0", 3, []string{"db-1"}),
		updates:    2,
		want:       func(s *state) { s.RenewTime, s.Sync = writeTime, nextSync },
	}, {
		name:       "a fencing after a renewal: fenced, the renewal kept",
		seed:       held("db-0", 3),
		by:         operator,
		change:     primarylease.SetFenced("db-0", 3, []string{"db-1", "db-2"}),
		interloper: primarylease.Renew("db-0", 3, nextSync),
		updates:    2,
		want:       func(s *state) { s.Fenced = []string{"db-1", "db-2"} },
	}, {
		name:       "the old reports dropped after a release: from the vacant Lease, the release kept",
		seed:       held("db-0", 3),
		by:         operator,
		change:     primarylease.DropLegacyReports(),
		interloper: release,
		updates:    2,
		want:       func(s *state) { s.Legacy = nil },
	}, {
		name:         "the old reports dropped against renewals at every attempt: a conflict after five, nothing of it written",
		seed:         held("db-0", 3),
		by:           operator,
		change:       primarylease.DropLegacyReports(),
		interloper:   renew,
		everyAttempt: true,
		conflict:     true,
		updates:      5,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tl, _ := create(t, tc.seed)
			s := &countingStore{Store: tl.store(tc.by)}
			var last *coordinationv1.Lease
			s.beforeUpdate = func(attempt int) {
				if attempt > 1 && !tc.everyAttempt {
					return
				}
				var err error
				at := interloperTime.Add(time.Duration(attempt) * time.Microsecond)
				if last, err = tl.apply(tc.by.other(), nil, tc.interloper, at); err != nil {
					t.Fatalf("the %s's write between the read and the write: %v", tc.by.other(), err)
				}
			}
			written, err := tl.apply(tc.by, s, tc.change, writeTime)
			if tc.conflict {
				if !apierrors.IsConflict(err) || errors.Is(err, primarylease.ErrNotHolder) {
					t.Fatalf("error %v, want a conflict", err)
				}
			} else {
				wantErr(t, err, tc.err)
			}
			if s.updates != tc.updates {
				t.Errorf("%d writes, want %d", s.updates, tc.updates)
			}
			after := tl.get()
			if err == nil && written.ResourceVersion != after.ResourceVersion {
				t.Errorf("Apply returned the Lease at resourceVersion %s; the API server has %s", written.ResourceVersion, after.ResourceVersion)
			}
			wantState(t, after, last, tc.want)
		})
	}
}

// Apply starts from the Lease it is given (the operator's cached copy, the agent's
// last read) when there is one, and reads it only when not, or after a conflict.
func TestApplyFromTheLeaseGiven(t *testing.T) {
	for _, tc := range []struct {
		name string
		// interloper, when set, is the other writer's change after the Lease given was
		// read: the Lease given is stale.
		interloper primarylease.Change
		change     primarylease.Change
		err        error
		// gets and updates are the reads and writes Apply made.
		gets, updates int
		want          func(*state)
	}{{
		name:    "a fresh Lease: written without a read",
		change:  primarylease.Revoke("db-0", 3, "db-0 failed"),
		updates: 1,
		want: func(s *state) {
			s.Holder, s.Term = "", 4
			s.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "db-0 failed", At: metav1.NewTime(writeTime)}
		},
	}, {
		name:       "a Lease renewed since: read again after the conflict, then revoked",
		interloper: primarylease.Renew("db-0", 3, nil),
		change:     primarylease.Revoke("db-0", 3, "db-0 failed"),
		gets:       1,
		updates:    2,
		want: func(s *state) {
			s.Holder, s.Term = "", 4
			s.Handover = &primarylease.Handover{From: "db-0", Term: 3, Reason: "db-0 failed", At: metav1.NewTime(writeTime)}
		},
	}, {
		name:       "a Lease revoked since: read again after the conflict, the renewal refused",
		interloper: primarylease.Revoke("db-0", 3, "db-0 failed"),
		change:     primarylease.Renew("db-0", 3, nil),
		err:        primarylease.ErrNotHolder,
		gets:       1,
		updates:    1,
	}, {
		name:   "refused on the Lease given: no read, no write",
		change: primarylease.Renew("db-1", 3, nil),
		err:    primarylease.ErrNotHolder,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tl, given := create(t, held("db-0", 3))
			last := given
			if tc.interloper != nil {
				var err error
				if last, err = tl.apply(agent, nil, tc.interloper, interloperTime); err != nil {
					t.Fatal(err)
				}
			}
			s := &countingStore{Store: tl.store(operator)}
			_, err := primarylease.Apply(context.Background(), s, given, func() time.Time { return writeTime }, tc.change)
			wantErr(t, err, tc.err)
			if s.gets != tc.gets || s.updates != tc.updates {
				t.Errorf("%d reads and %d writes, want %d and %d", s.gets, s.updates, tc.gets, tc.updates)
			}
			wantState(t, tl.get(), last, tc.want)
		})
	}
}

// Apply returns every error but a conflict as it is, without retrying.
func TestApplyErrors(t *testing.T) {
	errOwn := errors.New("the change's own error")
	for _, tc := range []struct {
		name string
		// missing: the Lease is not created; deleted: it is deleted between the read
		// and the write.
		missing, deleted bool
		change           primarylease.Change
		is               func(error) bool
		updates          int
	}{{
		name:    "no Lease",
		missing: true,
		change:  primarylease.Renew("db-0", 3, nil),
		is:      apierrors.IsNotFound,
	}, {
		name:    "the Lease deleted between the read and the write",
		deleted: true,
		change:  primarylease.Renew("db-0", 3, nil),
		is:      apierrors.IsNotFound,
		updates: 1,
	}, {
		name:   "the change's own error",
		change: func(*coordinationv1.Lease, time.Time) error { return errOwn },
		is:     func(err error) bool { return errors.Is(err, errOwn) },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var tl testLease
			if tc.missing {
				apiServer(t)
				tl = testLease{t: t, name: "never-created"}
			} else {
				tl, _ = create(t, held("db-0", 3))
			}
			s := &countingStore{Store: tl.store(agent)}
			if tc.deleted {
				s.beforeUpdate = func(int) {
					kube, _ := apiServer(t)
					if err := kube.CoordinationV1().Leases(namespace).Delete(context.Background(), tl.name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			written, err := tl.apply(agent, s, tc.change, writeTime)
			if !tc.is(err) || written != nil {
				t.Errorf("Apply returned %v and error %v", written, err)
			}
			if s.updates != tc.updates {
				t.Errorf("%d writes, want %d", s.updates, tc.updates)
			}
		})
	}
}
