package primarylease

import (
	"errors"
	"testing"
	"time"
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
			if err := Move(0, "db-1", nil, nil, tc.inUse)(l, time.Now()); err != nil {
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
	if err := Move(0, "db-1", nil, nil, 1)(l, time.Now()); err != nil {
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
	if err := Move(1, "db-2", nil, nil, 2)(l, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := Parse(l).Timeline; got != 4 {
		t.Errorf("after the next move: timeline %d, want 4", got)
	}
}
