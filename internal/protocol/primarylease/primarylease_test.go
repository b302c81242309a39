package primarylease

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestMoveReservesATimelineAboveEveryOneKnown(t *testing.T) {
	for _, tc := range []struct {
		name         string
		recorded     string
		inUse        int64
		wantTimeline int64
	}{
		{name: "no reservation yet", inUse: 1, wantTimeline: 2},
		{name: "an instance is above the last reservation", recorded: "3", inUse: 7, wantTimeline: 8},
		{name: "the last reservation is above every instance", recorded: "9", inUse: 4, wantTimeline: 10},
		{name: "no instance answered", recorded: "5", wantTimeline: 6},
		{name: "an unreadable annotation counts as none", recorded: "x", inUse: 2, wantTimeline: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New("ns", "db-primary", "db", "db-0", time.Now())
			if tc.recorded != "" {
				l.Annotations = map[string]string{AnnotationTimeline: tc.recorded}
			}
			if err := Move(0, "db-1", nil, tc.inUse)(l, time.Now()); err != nil {
				t.Fatal(err)
			}
			if r := Parse(l); r.Timeline != tc.wantTimeline || r.Holder != "db-1" || r.Term != 1 {
				t.Errorf("after the move: holder %q term %d timeline %d; want db-1, 1, %d", r.Holder, r.Term, r.Timeline, tc.wantTimeline)
			}
		})
	}
}

func TestReserveTimeline(t *testing.T) {
	l := New("ns", "db-primary", "db", "db-0", time.Now())
	if err := Move(0, "db-1", nil, 1)(l, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The holder's own history reaches the reservation (2): it takes the next one.
	if err := ReserveTimeline("db-1", 1, 2)(l, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := Parse(l).Timeline; got != 3 {
		t.Errorf("after reserving above 2: timeline %d, want 3", got)
	}
	// A reservation already above what the holder knows is kept.
	if err := ReserveTimeline("db-1", 1, 1)(l, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := Parse(l).Timeline; got != 3 {
		t.Errorf("after reserving above 1: timeline %d, want 3 kept", got)
	}
	// Only the holder in its term reserves.
	for _, tc := range []struct {
		holder string
		term   int32
	}{{"db-0", 1}, {"db-1", 0}} {
		if err := ReserveTimeline(tc.holder, tc.term, 5)(l, time.Now()); !errors.Is(err, ErrNotHolder) {
			t.Errorf("%s in term %d reserving: %v, want ErrNotHolder", tc.holder, tc.term, err)
		}
	}
	// The next move reserves above the holder's reservation.
	if err := Move(1, "db-2", nil, 2)(l, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := Parse(l).Timeline; got != 4 {
		t.Errorf("after the next move: timeline %d, want 4", got)
	}
}

func TestParse(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	holder, term, renewed := "db-1", int32(7), metav1.NewMicroTime(at)
	for _, tc := range []struct {
		name        string
		spec        coordinationv1.LeaseSpec
		annotations map[string]string
		want        Record
	}{{
		name: "an empty Lease: nothing is known",
	}, {
		name: "every field",
		spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseTransitions: &term, RenewTime: &renewed},
		annotations: map[string]string{
			dbv1.AnnotationBootstrapped: "true",
			AnnotationTimeline:          "12",
			AnnotationHandover:          `{"from":"db-0","term":6,"reason":"r","clean":true,"finalLSN":"0/5000028","timeline":11,"released":true,"at":"2026-03-01T12:00:00Z"}`,
			AnnotationSynchronous:       `{"k":1,"members":{"db-2":""}}`,
			dbv1.AnnotationHibernation:  `{"phase":"stopped","holder":"db-1","term":7,"since":"2026-03-01T12:00:00Z"}`,
			dbv1.AnnotationFenced:       `["db-2"]`,
		},
		want: Record{Holder: "db-1", Term: 7, RenewTime: at, Bootstrapped: true, Timeline: 12,
			Handover:    &Handover{From: "db-0", Term: 6, Reason: "r", Clean: true, FinalLSN: "0/5000028", Timeline: 11, Released: true, At: metav1.NewTime(at)},
			Sync:        &SyncSet{K: 1, Members: map[string]string{"db-2": ""}},
			Hibernation: &Hibernation{Phase: Stopped, Holder: "db-1", Term: 7, Since: metav1.NewTime(at)},
			Fenced:      []string{"db-2"}},
	}, {
		name: "unreadable records count as none: a person may have edited them",
		annotations: map[string]string{
			dbv1.AnnotationBootstrapped: "yes",
			AnnotationTimeline:          "twelve",
			AnnotationHandover:          "{",
			AnnotationSynchronous:       `{"k":"one"}`,
			dbv1.AnnotationHibernation:  "stopped",
			dbv1.AnnotationFenced:       `{"db-2":true}`,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42", Annotations: tc.annotations}, Spec: tc.spec}
			tc.want.ResourceVersion = "42"
			if diff := cmp.Diff(tc.want, Parse(l)); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeepsDown(t *testing.T) {
	hibernation := func(phase, holder string, term int32) *Hibernation {
		return &Hibernation{Phase: phase, Holder: holder, Term: term}
	}
	for _, tc := range []struct {
		name string
		rec  Record
		pod  string
		want bool
	}{
		{name: "a fenced standby", rec: Record{Holder: "db-0", Term: 3, Fenced: []string{"db-1"}}, pod: "db-1", want: true},
		{name: "a fenced holder", rec: Record{Holder: "db-0", Term: 3, Fenced: []string{"db-0", "db-1"}}, pod: "db-0", want: true},
		{name: "a standby not fenced", rec: Record{Holder: "db-0", Term: 3, Fenced: []string{"db-1"}}, pod: "db-2"},
		{name: "the holder while it hibernates, stopping", rec: Record{Holder: "db-0", Term: 3, Hibernation: hibernation(Stopping, "db-0", 3)}, pod: "db-0", want: true},
		{name: "the holder while it hibernates, stopped", rec: Record{Holder: "db-0", Term: 3, Hibernation: hibernation(Stopped, "db-0", 3)}, pod: "db-0", want: true},
		{name: "the holder resuming", rec: Record{Holder: "db-0", Term: 3, Hibernation: hibernation(Resuming, "db-0", 3)}, pod: "db-0"},
		{name: "a standby of a stopping holder: it receives the final WAL", rec: Record{Holder: "db-0", Term: 3, Hibernation: hibernation(Stopping, "db-0", 3)}, pod: "db-1"},
		{name: "the holder, a hibernation of a past term", rec: Record{Holder: "db-0", Term: 4, Hibernation: hibernation(Stopped, "db-0", 3)}, pod: "db-0"},
		{name: "the holder, a hibernation of another holder", rec: Record{Holder: "db-0", Term: 3, Hibernation: hibernation(Stopped, "db-1", 3)}, pod: "db-0"},
		{name: "the holder, no record", rec: Record{Holder: "db-0", Term: 3}, pod: "db-0"},
	} {
		if got := tc.rec.KeepsDown(tc.pod); got != tc.want {
			t.Errorf("%s: KeepsDown(%s) = %v, want %v", tc.name, tc.pod, got, tc.want)
		}
	}
}

func TestCleanRelease(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    *Handover
		want bool
	}{
		{name: "no record"},
		{name: "a revocation", h: &Handover{From: "db-0", Term: 3}},
		{name: "an unclean release", h: &Handover{From: "db-0", Term: 3, Released: true}},
		{name: "clean, not released (not written by this package, read conservatively)", h: &Handover{Clean: true}},
		{name: "a clean release", h: &Handover{From: "db-0", Term: 3, Clean: true, Released: true}, want: true},
	} {
		if got := tc.h.CleanRelease(); got != tc.want {
			t.Errorf("%s: CleanRelease = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestOnlyRenewed(t *testing.T) {
	before := New("ns", "db-primary", "db", "db-0", time.Unix(100, 0))
	before.ResourceVersion = "1"
	renewed := before.DeepCopy()
	at := metav1.NewMicroTime(time.Unix(101, 0))
	renewed.Spec.RenewTime, renewed.ResourceVersion = &at, "2"
	if !OnlyRenewed(before, renewed) {
		t.Error("a renewal is not seen as one")
	}
	renewed.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "agent"}}
	if !OnlyRenewed(before, renewed) {
		t.Error("a renewal with other managed fields is not seen as one")
	}
	if renewed.Spec.RenewTime == nil || renewed.ResourceVersion != "2" || before.ResourceVersion != "1" {
		t.Error("OnlyRenewed changed the Leases it compared")
	}
	moved := renewed.DeepCopy()
	moved.Spec.HolderIdentity = ptr.To("db-1")
	annotated := renewed.DeepCopy()
	annotated.Annotations = map[string]string{AnnotationSynchronous: `{"k":1}`}
	remade := renewed.DeepCopy()
	remade.UID = "another"
	relabelled := renewed.DeepCopy()
	relabelled.Labels = map[string]string{"k": "v"}
	longer := renewed.DeepCopy()
	longer.Spec.LeaseDurationSeconds = ptr.To[int32](99)
	for name, l := range map[string]*coordinationv1.Lease{"a new holder": moved, "a new annotation": annotated,
		"a Lease made again": remade, "a new label": relabelled, "a new duration": longer} {
		if OnlyRenewed(before, l) {
			t.Errorf("%s is seen as a renewal only", name)
		}
	}
}
