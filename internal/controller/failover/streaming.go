package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/agentapi"
	"github.com/pgpilot/pgpilot/internal/primarylease"
)

// StreamingGrace is how long a replica may not stream before it is recorded: a primary
// that restarts, a switchover, a receiver the agent restarts, all end within it. The
// replica's /readyz is stricter (the kubelet's failureThreshold smooths it); the
// cluster's phase is not made Degraded for every blip.
const StreamingGrace = 5 * time.Second

// StreamingProblem is why a replica does not serve reads, as its agent reported it
// when first recorded: kept as is while the problem lasts, so the Lease is written only
// when a problem starts or ends.
type StreamingProblem struct {
	// Upstream is the primary the replica should stream from.
	Upstream string `json:"upstream"`
	// State is the WAL receiver's (agentapi.Receiver*), or "lagging".
	State string `json:"state"`
	// Since is when the replica stopped streaming, or was first seen lagging.
	Since time.Time `json:"since"`
	// Reason is the agent's, at that first report.
	Reason string `json:"reason"`
}

// StreamingLagging is StreamingProblem.State for a replica that streams but replays
// beyond maxReadLag.
const StreamingLagging = "lagging"

// StreamingRecord is the problems by replica pod (dbv1.AnnotationStreaming).
type StreamingRecord map[string]StreamingProblem

// ParseStreaming reads the annotation's value; nil when empty or unreadable.
func ParseStreaming(value string) StreamingRecord {
	if value == "" {
		return nil
	}
	var r StreamingRecord
	if json.Unmarshal([]byte(value), &r) != nil {
		return nil
	}
	return r
}

// NextStreaming is the record after this observation at now. A replica that answers
// and is not healthy is recorded once it has not streamed for StreamingGrace, or as soon
// as it lags beyond the bound; one that answers healthy is removed; one that does not
// answer keeps its entry while its pod exists (its pod's readiness says the rest). While
// the Lease names no primary (a failover or handover) nothing changes: every standby is
// frozen on purpose.
func NextStreaming(prev StreamingRecord, holder string, instances []Instance, now time.Time) StreamingRecord {
	next := StreamingRecord{}
	if holder == "" {
		maps.Copy(next, prev)
		return next
	}
	for _, i := range instances {
		if i.Name == holder {
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
			p := StreamingProblem{Upstream: r.Upstream, State: r.State, Reason: r.Reason}
			if r.State == agentapi.ReceiverStreaming {
				p.State, p.Since = StreamingLagging, now
			} else if r.NotStreamingSince != nil {
				p.Since = *r.NotStreamingSince
			} else {
				p.Since = now
			}
			if p.State != StreamingLagging && now.Sub(p.Since) < StreamingGrace {
				continue
			}
			if had && old.sameAs(p) {
				p = old // as first recorded
			}
			next[i.Name] = p
		}
	}
	return next
}

// sameAs reports whether p and o are the same problem: the same upstream, and both
// lagging or both not streaming. The WAL receiver's state while it does not stream
// (stopped, starting, waiting, connecting) changes from one look to the next; the
// problem does not, and is not recorded or told again for it.
func (p StreamingProblem) sameAs(o StreamingProblem) bool {
	return p.Upstream == o.Upstream && (p.State == StreamingLagging) == (o.State == StreamingLagging)
}

// Describe is one problem for a person: who, since when, why.
func (p StreamingProblem) Describe(pod string) string {
	if p.State == StreamingLagging {
		return fmt.Sprintf("%s lags behind %s beyond maxReadLag since %s (%s)", pod, p.Upstream, p.Since.UTC().Format(time.RFC3339), p.Reason)
	}
	return fmt.Sprintf("%s has not streamed from %s since %s (%s)", pod, p.Upstream, p.Since.UTC().Format(time.RFC3339), p.Reason)
}

// StreamingEvents are the changes from prev to next worth an event: a replica that
// stopped streaming or lags (Warning), one that answered and streams again (Normal).
func StreamingEvents(prev, next StreamingRecord, answered []string) []DataGuardEvent {
	var out []DataGuardEvent
	for _, pod := range slices.Sorted(maps.Keys(next)) {
		if old, ok := prev[pod]; !ok || !old.sameAs(next[pod]) {
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

// recordStreaming records which replicas do not stream in the Lease for the status
// controller, with an event for each change.
func (c *cycle) recordStreaming(ctx context.Context) error {
	rec := primarylease.Parse(c.lease)
	prev := ParseStreaming(c.lease.Annotations[dbv1.AnnotationStreaming])
	next := NextStreaming(prev, rec.Holder, c.instances, time.Now())
	if maps.Equal(prev, next) {
		return nil
	}
	for _, e := range StreamingEvents(prev, next, answered(c.instances)) {
		c.log("Replication changed", "reason", e.Reason, "message", e.Message)
		c.r.recorder.Event(c.cluster, e.Type, e.Reason, e.Message)
	}
	if err := c.recordJSON(ctx, dbv1.AnnotationStreaming, next, len(next) == 0); err != nil {
		return fmt.Errorf("recording which replicas do not stream in the Lease: %w", err)
	}
	return nil
}
