package failover

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// StreamingGrace is how long a replica may not stream before it is recorded: a primary
// that restarts, a switchover, a receiver the agent restarts, all end within it. The
// replica's /readyz is stricter (the kubelet's failureThreshold smooths it); the
// cluster's phase is not made Degraded for every blip.
const StreamingGrace = 5 * time.Second

// NextStreaming is the record after this observation at now. A replica that answers
// and is not healthy is recorded once it has not streamed for StreamingGrace, or as soon
// as it lags beyond the bound; one that answers healthy is removed; one that does not
// answer keeps its entry while its pod exists (its pod's readiness says the rest). While
// the Lease names no primary (a failover or handover) nothing changes: every standby is
// frozen on purpose.
//
// In a replica cluster (source set) the holder, its designated primary, is recorded
// like any replica: it should stream from the source.
func NextStreaming(prev report.Streaming, holder, source string, instances []Instance, now time.Time) report.Streaming {
	next := report.Streaming{}
	if holder == "" {
		maps.Copy(next, prev)
		return next
	}
	for _, i := range instances {
		if i.Name == holder && source == "" {
			continue
		}
		old, had := prev[i.Name]
		st := i.Status
		switch {
		case !i.Reachable:
			if had && i.Pod != nil {
				next[i.Name] = old
			}
		case st.Role != agentapi.RoleReplica || st.Receiver == nil || st.Receiver.Healthy:
		default:
			r := st.Receiver
			p := report.StreamingProblem{Upstream: r.Upstream, State: r.State, Reason: r.Reason}
			if r.State == agentapi.ReceiverStreaming {
				p.State, p.Since = report.StreamingLagging, now
			} else if r.NotStreamingSince != nil {
				p.Since = *r.NotStreamingSince
			} else {
				p.Since = now
			}
			if p.State != report.StreamingLagging && now.Sub(p.Since) < StreamingGrace {
				continue
			}
			if had && old.SameAs(p) {
				p = old // as first recorded
			}
			next[i.Name] = p
		}
	}
	return next
}

// StreamingEvents are the changes from prev to next worth an event: a replica that
// stopped streaming or lags (Warning), one that answered and streams again (Normal).
func StreamingEvents(prev, next report.Streaming, answered []string) []DataGuardEvent {
	var out []DataGuardEvent
	for _, pod := range slices.Sorted(maps.Keys(next)) {
		if old, ok := prev[pod]; !ok || !old.SameAs(next[pod]) {
			out = append(out, DataGuardEvent{corev1.EventTypeWarning, dbv1.ReasonReplicaNotStreaming, next[pod].Describe(pod) +
				": it is not ready and serves no reads until it streams within maxReadLag"})
		}
	}
	for _, pod := range slices.Sorted(maps.Keys(prev)) {
		if _, ok := next[pod]; !ok && slices.Contains(answered, pod) {
			out = append(out, DataGuardEvent{corev1.EventTypeNormal, dbv1.ReasonReplicaStreaming,
				fmt.Sprintf("%s streams from %s again within maxReadLag (it had not since %s)", pod, prev[pod].Upstream, prev[pod].Since.UTC().Format(time.RFC3339))})
		}
	}
	return out
}

// recordStreaming records which replicas do not stream in the report for the status
// controller, with an event for each change.
func (c *cycle) recordStreaming(ctx context.Context) error {
	prev := c.reported.Streaming
	next := NextStreaming(prev, primarylease.Parse(c.lease).Holder, c.cluster.FollowedSource(), c.instances, time.Now())
	if maps.Equal(prev, next) {
		return nil
	}
	c.tell("Replication changed", StreamingEvents(prev, next, answered(c.instances)))
	if err := c.record(ctx, report.KeyStreaming, next); err != nil {
		return fmt.Errorf("recording which replicas do not stream: %w", err)
	}
	c.reported.Streaming = next
	return nil
}
