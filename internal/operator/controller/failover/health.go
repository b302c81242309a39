package failover

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// What threatens a cluster before anything fails is told as a condition with what to
// do, from what the agents report: the alert rules (docs/monitoring.md) say the same to
// whoever runs Prometheus, this says it to whoever reads the cluster. Each signal is
// recorded when it crosses its threshold and removed when it is back under a lower one,
// so that a figure hovering at the threshold is not told again and again.
const (
	// Connections: the primary's client sessions, in percent of those it admits.
	connectionsHigh, connectionsLow = 90, 80
	// Wraparound: the oldest unfrozen transaction ID's age. Autovacuum freezes at
	// 200 million by default; at 500 million it has been failing to for a long time,
	// and PostgreSQL stops assigning IDs before 2^31 (2147 million).
	wraparoundHigh, wraparoundLow = 500_000_000, 450_000_000
	// Volumes: percent used, or full within volumeFillsWithin at the current rate.
	volumeHigh, volumeLow = 90, 85
	volumeFillsWithin     = 24 * time.Hour
)

// NextHealth is the record after this observation at now. The primary's connections
// and transaction IDs are read from the Lease's holder, each instance's volume from
// itself; an instance that does not answer keeps what was recorded of it while its pod
// exists, and while the Lease names no primary (holder "") the primary's signals stay
// as they were. autoGrow says whether spec.storage.autoGrow grows the volumes (the advice
// differs).
func NextHealth(prev report.Health, holder string, instances []Instance, autoGrow bool, now time.Time) report.Health {
	next := report.Health{}
	keep := func(key string, high, low bool, msg func() string) {
		old, had := prev[key]
		switch {
		case had && low:
			next[key] = old
		case high:
			next[key] = report.HealthProblem{Message: msg(), Since: now.UTC().Round(0)}
		}
	}
	if holder == "" {
		// A failover or handover: no primary to read, the primary's signals stay.
		for _, k := range []string{report.HealthConnections, report.HealthWraparound} {
			if p, ok := prev[k]; ok {
				next[k] = p
			}
		}
	}
	for _, i := range instances {
		st := i.Status
		if !i.Reachable {
			for k, v := range prev {
				if i.Pod != nil && (k == report.HealthVolume+i.Name || i.Name == holder && !isVolume(k)) {
					next[k] = v
				}
			}
			continue
		}
		if i.Name == holder && st.Role == agentapi.RolePrimary {
			if limit := st.ConnectionLimit; limit > 0 {
				used := 100 * st.Connections / limit
				keep(report.HealthConnections, used >= connectionsHigh, used >= connectionsLow, func() string {
					return fmt.Sprintf("the primary %s has %d client sessions of the %d it admits (%d%%): new sessions are refused once all are taken. "+
						"Put a connection pooler in front, end idle sessions (pg_stat_activity), or raise max_connections (a restart)", i.Name, st.Connections, limit, used)
				})
			}
			age := st.OldestXIDAge
			keep(report.HealthWraparound, age >= wraparoundHigh, age >= wraparoundLow, func() string {
				return fmt.Sprintf("database %q on the primary %s is %d million transactions past its oldest unfrozen one (age(datfrozenxid)); "+
					"PostgreSQL stops accepting writes before 2147 million. VACUUM is not freezing it: end long transactions and prepared "+
					"transactions (pg_prepared_xacts), drop unused replication slots, then VACUUM FREEZE that database", st.OldestXIDDatabase, i.Name, age/1_000_000)
			})
		}
		if st.VolumeBytes > 0 {
			used := int(100 * (st.VolumeBytes - st.VolumeFreeBytes) / st.VolumeBytes)
			fillsIn := time.Duration(st.VolumeFullInSeconds) * time.Second
			soon := fillsIn > 0 && fillsIn < volumeFillsWithin
			keep(report.HealthVolume+i.Name, used >= volumeHigh || soon, used >= volumeLow || soon, func() string {
				msg := fmt.Sprintf("%s's volume is %d%% used (%s free)", i.Name, used, humanize.IBytes(uint64(st.VolumeFreeBytes)))
				if soon {
					msg += fmt.Sprintf(" and fills in about %s at the current rate", fillsIn.Round(time.Minute))
				}
				if autoGrow {
					return msg + ": spec.storage.autoGrow grows the volumes up to its maxSize (the StorageResized condition says how it goes)"
				}
				return msg + ": set spec.storage.autoGrow, raise spec.storage.size, or free space (the backups' retention, " +
					"status.instances[].setAside); a full volume stops postgres"
			})
		}
	}
	return next
}

func isVolume(key string) bool { return strings.HasPrefix(key, report.HealthVolume) }

// healthReasons are the Warning reason of each signal's problem and the Normal reason
// of its end.
func healthReasons(key string) (problem, resolved string) {
	switch key {
	case report.HealthConnections:
		return dbv1.ReasonConnectionsSaturated, dbv1.ReasonConnectionsAvailable
	case report.HealthWraparound:
		return dbv1.ReasonWraparoundRisk, dbv1.ReasonTransactionIDsFrozen
	default:
		return dbv1.ReasonVolumeFillingUp, dbv1.ReasonVolumeSpaceAvailable
	}
}

// HealthEvents are the changes from prev to next worth an event: a problem that began
// (Warning), one that ended (Normal).
func HealthEvents(prev, next report.Health) []DataGuardEvent {
	var out []DataGuardEvent
	for _, k := range slices.Sorted(maps.Keys(next)) {
		if _, had := prev[k]; !had {
			reason, _ := healthReasons(k)
			out = append(out, DataGuardEvent{corev1.EventTypeWarning, reason, next[k].Message})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(prev)) {
		if _, has := next[k]; !has {
			_, reason := healthReasons(k)
			out = append(out, DataGuardEvent{corev1.EventTypeNormal, reason, "No longer: " + prev[k].Message})
		}
	}
	return out
}

// recordHealth records what threatens the cluster in the report for the status
// controller, with an event for each change.
func (c *cycle) recordHealth(ctx context.Context) error {
	prev := c.reported.Health
	holder := primarylease.Parse(c.lease).Holder
	next := NextHealth(prev, holder, c.instances, c.cluster.Spec.Storage.AutoGrow != nil, time.Now())
	if maps.Equal(prev, next) {
		return nil
	}
	c.tell("Cluster health changed", HealthEvents(prev, next))
	if err := c.record(ctx, report.KeyHealth, next); err != nil {
		return fmt.Errorf("recording the cluster's health: %w", err)
	}
	c.reported.Health = next
	return nil
}
