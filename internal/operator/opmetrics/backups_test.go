package opmetrics

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestSummarizeBackups(t *testing.T) {
	created := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	at := func(h, m int) *metav1.Time {
		t := metav1.NewTime(created.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute))
		return &t
	}
	cluster := func(schedule string) *dbv1.PostgresCluster {
		c := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		if schedule != "" {
			c.Spec.Backup = &dbv1.BackupSpec{Schedule: schedule}
		}
		return c
	}
	backup := func(phase dbv1.BackupPhase, started, stopped *metav1.Time, size int64) dbv1.PostgresBackup {
		return dbv1.PostgresBackup{Status: dbv1.PostgresBackupStatus{Phase: phase, StartedAt: started, StoppedAt: stopped, SizeBytes: size}}
	}
	for _, tc := range []struct {
		name    string
		cluster *dbv1.PostgresCluster
		backups []dbv1.PostgresBackup
		want    BackupSummary
	}{
		{
			name:    "none, no schedule",
			cluster: cluster(""),
			want:    BackupSummary{ByPhase: map[dbv1.BackupPhase]int{}},
		},
		{
			name:    "none yet: due at the first tick after creation",
			cluster: cluster("0 3 * * *"),
			want:    BackupSummary{ByPhase: map[dbv1.BackupPhase]int{}, NextDue: time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)},
		},
		{
			name:    "the newest completed one counts; failed and running ones do not",
			cluster: cluster("0 */6 * * *"),
			backups: []dbv1.PostgresBackup{
				backup(dbv1.BackupCompleted, at(2, 0), at(2, 10), 100),
				backup(dbv1.BackupCompleted, at(8, 0), at(8, 5), 200),
				backup(dbv1.BackupFailed, at(14, 0), at(14, 1), 0),
				backup(dbv1.BackupRunning, at(20, 0), nil, 0),
			},
			want: BackupSummary{
				ByPhase:     map[dbv1.BackupPhase]int{dbv1.BackupCompleted: 2, dbv1.BackupFailed: 1, dbv1.BackupRunning: 1},
				LastSuccess: at(8, 5).Time, LastSizeBytes: 200, LastDuration: 5 * time.Minute,
				// 10:00 + 8h = 18:00 started; the next tick of every 6 hours is 00:00.
				NextDue: time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC),
			},
		},
		{
			name:    "an invalid schedule has no due time",
			cluster: cluster("every day"),
			backups: []dbv1.PostgresBackup{backup(dbv1.BackupCompleted, at(1, 0), at(1, 1), 1)},
			want: BackupSummary{ByPhase: map[dbv1.BackupPhase]int{dbv1.BackupCompleted: 1},
				LastSuccess: at(1, 1).Time, LastSizeBytes: 1, LastDuration: time.Minute},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SummarizeBackups(tc.cluster, tc.backups)); diff != "" {
				t.Errorf("SummarizeBackups (-want +got):\n%s", diff)
			}
		})
	}
}
