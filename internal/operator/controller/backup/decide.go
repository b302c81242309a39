// Package backup holds the controller's backup controllers: one runs each PostgresBackup
// on an instance's agent, the other creates them on the cluster's schedule and applies
// its retention.
package backup

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// ParseSchedule parses spec.backup.schedule: five cron fields or a descriptor such as
// @daily, in UTC.
func ParseSchedule(spec string) (cron.Schedule, error) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("spec.backup.schedule %q is not a cron schedule (five fields such as \"0 3 * * *\", or @daily): %w", spec, err)
	}
	if strings.HasPrefix(strings.TrimSpace(spec), "TZ=") || strings.HasPrefix(strings.TrimSpace(spec), "CRON_TZ=") {
		return nil, fmt.Errorf("spec.backup.schedule %q: time zones are not supported; schedules are in UTC", spec)
	}
	return s, nil
}

// maxMissedTicks bounds the walk over missed ticks (a schedule of every minute, an
// operator down for a long time).
const maxMissedTicks = 100000

// Due returns the schedule's latest tick in (after, now] and whether there is one; and
// the first tick after now. Ticks missed while the operator was down collapse into the
// latest one: one backup, not a burst.
func Due(s cron.Schedule, after, now time.Time) (tick time.Time, due bool, next time.Time) {
	after, now = after.UTC(), now.UTC()
	for t, i := s.Next(after), 0; !t.After(now) && i < maxMissedTicks; t, i = s.Next(t), i+1 {
		tick, due = t, true
	}
	return tick, due, s.Next(now)
}

// ScheduledName is the PostgresBackup made for cluster's tick: the same name for the
// same tick, so a restarted operator cannot create a second one.
func ScheduledName(cluster string, tick time.Time) string {
	return cluster + "-" + strings.ToLower(tick.UTC().Format("20060102t150405z"))
}

// Prune returns the backups retention deletes, from every backup of one cluster:
// completed backups beyond the newest count (if set) and older than maxAge (if set),
// never the newest completed one; and failed backups older than the oldest completed
// backup kept. Pending and running backups are never returned.
func Prune(backups []dbv1.PostgresBackup, r dbv1.RetentionSpec, now time.Time) []dbv1.PostgresBackup {
	var completed, failed []dbv1.PostgresBackup
	for _, b := range backups {
		switch b.Status.Phase {
		case dbv1.BackupCompleted:
			completed = append(completed, b)
		case dbv1.BackupFailed:
			failed = append(failed, b)
		}
	}
	if len(completed) == 0 {
		return nil
	}
	sort.SliceStable(completed, func(i, j int) bool { return stoppedAt(completed[i]).After(stoppedAt(completed[j])) })
	var prune []dbv1.PostgresBackup
	oldestKept := stoppedAt(completed[0])
	for i, b := range completed {
		keep := i == 0
		if r.Count != nil && i < int(*r.Count) {
			keep = true
		}
		if r.MaxAge != nil && now.Sub(stoppedAt(b)) <= r.MaxAge.Duration {
			keep = true
		}
		if r.Count == nil && r.MaxAge == nil {
			keep = true
		}
		if keep {
			oldestKept = stoppedAt(b)
		} else {
			prune = append(prune, b)
		}
	}
	for _, b := range failed {
		if stoppedAt(b).Before(oldestKept) {
			prune = append(prune, b)
		}
	}
	return prune
}

func stoppedAt(b dbv1.PostgresBackup) time.Time {
	if b.Status.StoppedAt != nil {
		return b.Status.StoppedAt.Time
	}
	return b.CreationTimestamp.Time
}
