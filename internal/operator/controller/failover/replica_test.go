package failover

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

func TestNextReplica(t *testing.T) {
	now := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	const src = "src-rw.prod.svc"
	spec := func(enabled bool, token string) *dbv1.ReplicaSpec {
		return &dbv1.ReplicaSpec{Enabled: enabled, PromotionToken: token, Source: dbv1.ReplicaSource{Host: src}}
	}
	at := func(st agentapi.Status) []Instance {
		return []Instance{{Name: "db-0", Pod: &corev1.Pod{}, Reachable: true, Status: st}}
	}
	streaming := agentapi.Status{Role: agentapi.RoleReplica, Receiver: &agentapi.ReceiverStatus{State: agentapi.ReceiverStreaming,
		Upstream: src, Healthy: true, LagMillis: 2400}}
	stalled := agentapi.Status{Role: agentapi.RoleReplica, Receiver: &agentapi.ReceiverStatus{State: agentapi.ReceiverConnecting,
		Upstream: src, Reason: "not streaming for 3.2s"}}

	if got := NextReplica(&dbv1.ReplicaStatus{Source: src}, nil, "db-0", at(streaming), now); got != nil {
		t.Errorf("a cluster of its own: %+v", got)
	}
	got := NextReplica(nil, spec(true, ""), "db-0", at(streaming), now)
	if !got.Streaming || got.LagSeconds != 2 || got.DesignatedPrimary != "db-0" || got.Message != "" {
		t.Errorf("streaming: %+v", got)
	}
	// The receiver's own words count time: the record is said without them, so it
	// changes only when the state does.
	down := NextReplica(got, spec(true, ""), "db-0", at(stalled), now)
	if down.Streaming || strings.Contains(down.Message, "3.2s") || !strings.Contains(down.Message, "connecting") {
		t.Errorf("not streaming: %+v", down)
	}
	// While the Lease names no holder, what was recorded stays.
	if kept := NextReplica(got, spec(true, ""), "", nil, now); !kept.Streaming || kept.DesignatedPrimary != "db-0" {
		t.Errorf("no holder: %+v", kept)
	}
	// A demoted primary's token is kept once seen, even after the agent forgets it.
	demoted := NextReplica(nil, spec(true, ""), "db-0", at(agentapi.Status{Role: agentapi.RoleReplica, DemotionToken: "7:1:0/6000028"}), now)
	if demoted.DemotionToken != "7:1:0/6000028" {
		t.Errorf("demoted: %+v", demoted)
	}
	if kept := NextReplica(demoted, spec(true, ""), "db-0", at(streaming), now); kept.DemotionToken != "7:1:0/6000028" {
		t.Errorf("the token was forgotten: %+v", kept)
	}
	// Promotion: recorded once the holder is primary, with what may be lost, or with the token.
	promoting := NextReplica(got, spec(false, ""), "db-0", at(streaming), now)
	if promoting.PromotedAt != nil || !strings.Contains(promoting.Message, "promoting") {
		t.Errorf("promoting: %+v", promoting)
	}
	promoted := NextReplica(got, spec(false, ""), "db-0", at(agentapi.Status{Role: agentapi.RolePrimary}), now)
	if promoted.PromotedAt == nil || !strings.Contains(promoted.Message, "2 s behind") {
		t.Errorf("promoted: %+v", promoted)
	}
	planned := NextReplica(got, spec(false, "7:1:0/6000028"), "db-0", at(agentapi.Status{Role: agentapi.RolePrimary}), now)
	if planned.PromotedAt == nil || !strings.Contains(planned.Message, "nothing it acknowledged is missing") {
		t.Errorf("promoted with a token: %+v", planned)
	}
	// Demoted again after a promotion: the promotion no longer holds.
	if again := NextReplica(promoted, spec(true, ""), "db-0", at(streaming), now); again.PromotedAt != nil || !again.Streaming {
		t.Errorf("following again: %+v", again)
	}
}
