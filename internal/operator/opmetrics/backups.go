package opmetrics

import (
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/backup"
)

// BackupSummary is what the metrics say of one cluster's backups.
type BackupSummary struct {
	ByPhase map[dbv1.BackupPhase]int
	// LastSuccess is when the newest completed backup finished; zero when none did.
	LastSuccess   time.Time
	LastSizeBytes int64
	LastDuration  time.Duration
	// NextDue is the schedule's first tick after the newest completed backup started
	// (after the cluster was created when none completed): a newer backup should exist
	// soon after it. Zero without a (valid) schedule.
	NextDue time.Time
}

// SummarizeBackups summarizes a cluster's backups.
func SummarizeBackups(c *dbv1.PostgresCluster, backups []dbv1.PostgresBackup) BackupSummary {
	s := BackupSummary{ByPhase: map[dbv1.BackupPhase]int{}}
	var newest *dbv1.PostgresBackup
	for i := range backups {
		b := &backups[i]
		s.ByPhase[b.Status.Phase]++
		if b.Status.Phase != dbv1.BackupCompleted || b.Status.StoppedAt == nil {
			continue
		}
		if newest == nil || b.Status.StoppedAt.After(newest.Status.StoppedAt.Time) {
			newest = b
		}
	}
	since := c.CreationTimestamp.Time
	if newest != nil {
		s.LastSuccess = newest.Status.StoppedAt.Time
		s.LastSizeBytes = newest.Status.SizeBytes
		since = s.LastSuccess
		if st := newest.Status.StartedAt; st != nil {
			s.LastDuration = s.LastSuccess.Sub(st.Time)
			since = st.Time
		}
	}
	if c.Spec.Backup != nil && c.Spec.Backup.Schedule != "" {
		if sched, err := backup.ParseSchedule(c.Spec.Backup.Schedule); err == nil {
			s.NextDue = sched.Next(since.UTC())
		}
	}
	return s
}
