package backup

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func at(day, hour int) time.Time { return time.Date(2026, 11, day, hour, 0, 0, 0, time.UTC) }

func TestDue(t *testing.T) {
	daily, err := ParseSchedule("0 3 * * *")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		after    time.Time
		now      time.Time
		wantTick time.Time
		wantDue  bool
		wantNext time.Time
	}{
		{"before the first tick", at(20, 10), at(21, 2), time.Time{}, false, at(21, 3)},
		{"at the tick", at(20, 10), at(21, 3), at(21, 3), true, at(22, 3)},
		{"after the tick", at(20, 10), at(21, 4), at(21, 3), true, at(22, 3)},
		{"that tick was taken", at(21, 3), at(21, 4), time.Time{}, false, at(22, 3)},
		{"missed ticks collapse into the latest", at(10, 0), at(21, 4), at(21, 3), true, at(22, 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tick, due, next := Due(daily, tc.after, tc.now)
			if !tick.Equal(tc.wantTick) || due != tc.wantDue || !next.Equal(tc.wantNext) {
				t.Errorf("Due = %s %v %s; want %s %v %s", tick, due, next, tc.wantTick, tc.wantDue, tc.wantNext)
			}
		})
	}
	if _, err := ParseSchedule("every day"); err == nil {
		t.Error("a bad schedule was accepted")
	}
	if _, err := ParseSchedule("CRON_TZ=Europe/Paris 0 3 * * *"); err == nil {
		t.Error("a time zone was accepted")
	}
	if got := ScheduledName("my-db", at(21, 3)); got != "my-db-20261121t030000z" {
		t.Errorf("ScheduledName = %q", got)
	}
}

func TestPrune(t *testing.T) {
	now := at(21, 12)
	b := func(name string, phase dbv1.BackupPhase, stopped time.Time) dbv1.PostgresBackup {
		return dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: dbv1.PostgresBackupStatus{Phase: phase, StoppedAt: &metav1.Time{Time: stopped}}}
	}
	backups := []dbv1.PostgresBackup{
		b("d14", dbv1.BackupCompleted, at(14, 3)),
		b("d15-failed", dbv1.BackupFailed, at(15, 3)),
		b("d18", dbv1.BackupCompleted, at(18, 3)),
		b("d19", dbv1.BackupCompleted, at(19, 3)),
		b("d20-failed", dbv1.BackupFailed, at(20, 3)),
		b("d20", dbv1.BackupCompleted, at(20, 4)),
		b("d21", dbv1.BackupCompleted, at(21, 3)),
		b("d21-running", dbv1.BackupRunning, at(21, 11)),
	}
	day := func(n int) *metav1.Duration { return &metav1.Duration{Duration: time.Duration(n) * 24 * time.Hour} }
	for _, tc := range []struct {
		name string
		r    dbv1.RetentionSpec
		want []string
	}{
		{"count", dbv1.RetentionSpec{Count: ptr.To[int32](2)}, []string{"d19", "d18", "d14", "d15-failed", "d20-failed"}},
		{"max age", dbv1.RetentionSpec{MaxAge: day(3)}, []string{"d18", "d14", "d15-failed"}},
		{"both are minimums", dbv1.RetentionSpec{Count: ptr.To[int32](4), MaxAge: day(1)}, []string{"d14", "d15-failed"}},
		{"the newest is kept even when too old", dbv1.RetentionSpec{MaxAge: &metav1.Duration{Duration: time.Hour}}, []string{"d20", "d19", "d18", "d14", "d15-failed", "d20-failed"}},
		{"count larger than the backups", dbv1.RetentionSpec{Count: ptr.To[int32](50)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range Prune(backups, tc.r, now) {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Prune (-want +got):\n%s", diff)
			}
		})
	}
	if got := Prune([]dbv1.PostgresBackup{b("f", dbv1.BackupFailed, at(1, 1))}, dbv1.RetentionSpec{Count: ptr.To[int32](1)}, now); got != nil {
		t.Errorf("with no completed backup nothing is pruned, got %v", got)
	}
}
