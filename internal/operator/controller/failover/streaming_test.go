package failover

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

func TestNextStreaming(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 30, 0, 0, time.UTC)
	replica := func(name string, r *agentapi.ReceiverStatus) Instance {
		return Instance{Name: name, Pod: &corev1.Pod{}, Reachable: true, Status: agentapi.Status{Role: agentapi.RoleReplica, Receiver: r}}
	}
	notStreaming := func(state string, ago time.Duration) *agentapi.ReceiverStatus {
		since := now.Add(-ago)
		return &agentapi.ReceiverStatus{State: state, Upstream: "db-0", NotStreamingSince: &since, Reason: "not streaming from db-0: " + state}
	}
	primary := Instance{Name: "db-0", Pod: &corev1.Pod{}, Reachable: true, Status: agentapi.Status{Role: agentapi.RolePrimary}}
	earlier := report.StreamingProblem{Upstream: "db-0", State: agentapi.ReceiverConnecting, Since: now.Add(-time.Minute), Reason: "as first seen"}
	cases := []struct {
		name      string
		prev      report.Streaming
		holder    string
		instances []Instance
		want      []string // pods recorded, with their state
	}{
		{"every replica healthy", nil, "db-0", []Instance{primary,
			replica("db-1", &agentapi.ReceiverStatus{State: agentapi.ReceiverStreaming, Healthy: true})}, nil},
		{"a blip shorter than the grace is not recorded", nil, "db-0", []Instance{primary,
			replica("db-1", notStreaming(agentapi.ReceiverAbsent, 2*time.Second))}, nil},
		{"not streaming for longer than the grace is", nil, "db-0", []Instance{primary,
			replica("db-1", notStreaming(agentapi.ReceiverConnecting, 6*time.Second))}, []string{"db-1=connecting"}},
		{"lagging is recorded at once", nil, "db-0", []Instance{primary,
			replica("db-1", &agentapi.ReceiverStatus{State: agentapi.ReceiverStreaming, Upstream: "db-0", Reason: "replays 45s behind"})}, []string{"db-1=lagging"}},
		{"an entry is kept as first recorded while the problem lasts", report.Streaming{"db-1": earlier}, "db-0", []Instance{primary,
			replica("db-1", notStreaming(agentapi.ReceiverConnecting, 10*time.Second))}, []string{"db-1=connecting@-1m0s"}},
		{"a receiver that moves between states that are not streaming is the same problem", report.Streaming{"db-1": earlier}, "db-0", []Instance{primary,
			replica("db-1", notStreaming(agentapi.ReceiverAbsent, 10*time.Second))}, []string{"db-1=connecting@-1m0s"}},
		{"a lagging replica that stops streaming is a new problem", report.Streaming{"db-1": {Upstream: "db-0", State: report.StreamingLagging, Since: now.Add(-time.Minute)}}, "db-0", []Instance{primary,
			replica("db-1", notStreaming(agentapi.ReceiverAbsent, 10*time.Second))}, []string{"db-1=" + agentapi.ReceiverAbsent}},
		{"one that does not answer keeps its entry while its pod exists", report.Streaming{"db-1": earlier, "db-2": earlier}, "db-0", []Instance{primary,
			{Name: "db-1", Pod: &corev1.Pod{}}, {Name: "db-2"}}, []string{"db-1=connecting@-1m0s"}},
		{"nothing changes while the Lease names no primary", report.Streaming{"db-1": earlier}, "", []Instance{primary,
			replica("db-1", &agentapi.ReceiverStatus{State: agentapi.ReceiverFrozen})}, []string{"db-1=connecting@-1m0s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next := NextStreaming(tc.prev, tc.holder, "", tc.instances, now)
			var got []string
			for _, pod := range []string{"db-1", "db-2"} {
				p, ok := next[pod]
				if !ok {
					continue
				}
				s := pod + "=" + p.State
				if p.Since.Equal(now.Add(-time.Minute)) {
					s += "@-1m0s"
				}
				got = append(got, s)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("recorded %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStreamingEvents(t *testing.T) {
	since := time.Date(2026, 11, 27, 5, 12, 1, 0, time.UTC)
	p := report.StreamingProblem{Upstream: "db-0", State: agentapi.ReceiverConnecting, Since: since, Reason: "the WAL receiver is connecting"}
	ev := StreamingEvents(nil, report.Streaming{"db-1": p}, nil)
	if len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning || ev[0].Reason != dbv1.ReasonReplicaNotStreaming ||
		!strings.Contains(ev[0].Message, "db-1 has not streamed from db-0 since 2026-11-27T05:12:01Z") {
		t.Errorf("events %+v", ev)
	}
	if ev := StreamingEvents(report.Streaming{"db-1": p}, report.Streaming{"db-1": p}, []string{"db-1"}); len(ev) != 0 {
		t.Errorf("no change, events %+v", ev)
	}
	if ev := StreamingEvents(report.Streaming{"db-1": p}, report.Streaming{}, nil); len(ev) != 0 {
		t.Errorf("an entry gone for a replica that did not answer: events %+v", ev)
	}
	ev = StreamingEvents(report.Streaming{"db-1": p}, report.Streaming{}, []string{"db-1"})
	if len(ev) != 1 || ev[0].Type != corev1.EventTypeNormal || ev[0].Reason != dbv1.ReasonReplicaStreaming {
		t.Errorf("streaming again: events %+v", ev)
	}
}
