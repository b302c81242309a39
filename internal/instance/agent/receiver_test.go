package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgsql"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// TestReceiverWatch runs the watch over sequences of looks, one a second (an injected
// clock), and checks what it ends, its state and whether the standby may serve reads.
func TestReceiverWatch(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	const timeout = 5 * time.Second // wal_receiver_timeout: stall bound 5.5 s
	streaming := func(pid int, msgAge time.Duration, end, replayed uint64) pgsql.ReceiverSample {
		return pgsql.ReceiverSample{PID: pid, Status: "streaming", MsgAge: msgAge, LatestEnd: end, Replayed: replayed, ReceiverTimeout: timeout}
	}
	connecting := func(pid int) pgsql.ReceiverSample {
		return pgsql.ReceiverSample{PID: pid, Status: "starting", WaitEvent: "LibPQWalReceiverConnect", MsgAge: -1, ReceiverTimeout: timeout}
	}
	absent := pgsql.ReceiverSample{MsgAge: -1, ReceiverTimeout: timeout}
	type look struct {
		s pgsql.ReceiverSample
		// wantEnd is the pid the watch ends at this look (0 none).
		wantEnd   int
		wantState string
		wantReady bool
	}
	cases := []struct {
		name     string
		upstream string
		looks    []look
	}{
		{"a receiver that streams and hears its primary is ready from the second look", "p", []look{
			{streaming(10, 100*time.Millisecond, 100, 100), 0, agentapi.ReceiverConnecting, false},
			{streaming(10, 2*time.Second, 100, 100), 0, agentapi.ReceiverStreaming, true},
			{streaming(10, 500*time.Millisecond, 200, 200), 0, agentapi.ReceiverStreaming, true},
		}},
		{"a receiver hung in connect is ended after 3 s, once, and the next one streams", "p", []look{
			{connecting(20), 0, agentapi.ReceiverConnecting, false},
			{connecting(20), 0, agentapi.ReceiverConnecting, false},
			{connecting(20), 0, agentapi.ReceiverConnecting, false},
			{connecting(20), 20, agentapi.ReceiverConnecting, false},
			{connecting(20), 0, agentapi.ReceiverConnecting, false}, // SIGTERM pending: not again
			{connecting(21), 0, agentapi.ReceiverConnecting, false},
			{streaming(21, 0, 300, 300), 0, agentapi.ReceiverConnecting, false},
			{streaming(21, 0, 300, 300), 0, agentapi.ReceiverStreaming, true},
		}},
		{"a new receiver every second (each attempt refused) is never ended, and not ready", "p", []look{
			{connecting(30), 0, agentapi.ReceiverConnecting, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{connecting(31), 0, agentapi.ReceiverConnecting, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{connecting(32), 0, agentapi.ReceiverConnecting, false},
		}},
		{"a streaming receiver that hears nothing for 5.5 s is stalled and ended", "p", []look{
			{streaming(40, 0, 100, 100), 0, agentapi.ReceiverConnecting, false},
			{streaming(40, 1*time.Second, 100, 100), 0, agentapi.ReceiverStreaming, true},
			{streaming(40, 4*time.Second, 100, 100), 0, agentapi.ReceiverStreaming, true},
			{streaming(40, 5*time.Second, 100, 100), 0, agentapi.ReceiverStreaming, true},
			{streaming(40, 6*time.Second, 100, 100), 40, agentapi.ReceiverStalled, false},
			{streaming(40, 7*time.Second, 100, 100), 0, agentapi.ReceiverStalled, false},
		}},
		{"with wal_receiver_timeout off, silence proves nothing", "p", []look{
			{pgsql.ReceiverSample{PID: 45, Status: "streaming", MsgAge: time.Minute, LatestEnd: 5, Replayed: 5}, 0, agentapi.ReceiverConnecting, false},
			{pgsql.ReceiverSample{PID: 45, Status: "streaming", MsgAge: time.Minute, LatestEnd: 5, Replayed: 5}, 0, agentapi.ReceiverStreaming, true},
		}},
		{"a streaming receiver that never heard from its primary counts from when it was seen", "p", []look{
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverConnecting, false},
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverStreaming, true},
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverStreaming, true},
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverStreaming, true},
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverStreaming, true},
			{streaming(50, -1, 0, 0), 0, agentapi.ReceiverStreaming, true},
			{streaming(50, -1, 0, 0), 50, agentapi.ReceiverStalled, false},
		}},
		{"a receiver refused at START_REPLICATION (its slot still held) every 100 ms never counts as streaming", "p", []look{
			{streaming(60, 0, 100, 100), 0, agentapi.ReceiverConnecting, false},
			{streaming(61, 0, 100, 100), 0, agentapi.ReceiverConnecting, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{streaming(62, 0, 100, 100), 0, agentapi.ReceiverConnecting, false},
		}},
		{"no receiver at all is absent, not ready, and nothing to end", "p", []look{
			{absent, 0, agentapi.ReceiverAbsent, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
			{absent, 0, agentapi.ReceiverAbsent, false},
		}},
		{"a frozen standby is ready until maxReadLag (3 s here), then not", "", []look{
			{absent, 0, agentapi.ReceiverFrozen, true},
			{absent, 0, agentapi.ReceiverFrozen, true},
			{absent, 0, agentapi.ReceiverFrozen, true},
			{absent, 0, agentapi.ReceiverFrozen, true},
			{absent, 0, agentapi.ReceiverFrozen, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &receiverWatch{}
			w.follow(t0, tc.upstream)
			for i, l := range tc.looks {
				now := t0.Add(time.Duration(i) * time.Second)
				lim := limitsFor(l.s, 3*time.Second)
				end, why := w.observe(now, l.s, lim)
				if end != 0 {
					w.endedReceiver(now, end, why)
				}
				ready, reason := w.health(now, lim.MaxLag)
				if end != l.wantEnd || w.state != l.wantState || ready != l.wantReady {
					t.Fatalf("look %d (%+v): ended %d (%s), state %s, ready %v (%s); want ended %d, state %s, ready %v",
						i, l.s, end, why, w.state, ready, reason, l.wantEnd, l.wantState, l.wantReady)
				}
				if !ready && reason == "" {
					t.Fatalf("look %d: not ready without a reason", i)
				}
			}
		})
	}
}

// TestReceiverLag: the lag is how long ago the primary had WAL the standby has not
// replayed; past maxReadLag the standby is not ready, and it is again once it caught up.
func TestReceiverLag(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	w := &receiverWatch{}
	w.follow(t0, "p")
	lim := receiverLimits{Connect: receiverConnectLimit, Stall: 5500 * time.Millisecond, MaxLag: 10 * time.Second}
	// The primary writes 100 bytes a second; the standby replays nothing for 15 s.
	w.observe(t0.Add(-time.Second), pgsql.ReceiverSample{PID: 1, Status: "streaming", MsgAge: 0, LatestEnd: 1000, Replayed: 1000}, lim)
	for i := 0; i <= 15; i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		w.observe(now, pgsql.ReceiverSample{PID: 1, Status: "streaming", MsgAge: 0, LatestEnd: uint64(1000 + 100*i), Replayed: 1000}, lim)
		ready, reason := w.health(now, lim.MaxLag)
		wantLag := time.Duration(max(i-1, 0)) * time.Second
		if i == 0 {
			wantLag = 0
		}
		if w.lag != wantLag {
			t.Fatalf("after %d s: lag %s, want %s", i, w.lag, wantLag)
		}
		if ready != (wantLag <= lim.MaxLag) {
			t.Fatalf("after %d s (lag %s): ready %v (%s)", i, w.lag, ready, reason)
		}
		if !ready && !strings.Contains(reason, "behind the primary") {
			t.Fatalf("reason %q", reason)
		}
	}
	// It replays up to what the primary had at 13 s: the oldest WAL it lacks, the
	// primary reported at 14 s: lag 2 s, ready again.
	now := t0.Add(16 * time.Second)
	w.observe(now, pgsql.ReceiverSample{PID: 1, Status: "streaming", MsgAge: 0, LatestEnd: 2600, Replayed: 2300}, lim)
	if w.lag != 2*time.Second {
		t.Fatalf("lag %s after catching up to 13 s, want 2s", w.lag)
	}
	if ok, why := w.health(now, lim.MaxLag); !ok {
		t.Fatalf("not ready at 2 s of lag: %s", why)
	}
	// All replayed: no lag.
	w.observe(now.Add(time.Second), pgsql.ReceiverSample{PID: 1, Status: "streaming", MsgAge: 0, LatestEnd: 2600, Replayed: 2600}, lim)
	if w.lag != 0 {
		t.Fatalf("lag %s once everything is replayed", w.lag)
	}
}

// TestReceiverWatchReportsAndCountsRestarts: /status says since when the standby does not
// stream, how many receivers were ended and why; a stale look is not trusted.
func TestReceiverWatchReportsAndCountsRestarts(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	w := &receiverWatch{}
	w.follow(t0, "p")
	s := pgsql.ReceiverSample{PID: 7, Status: "starting", WaitEvent: "LibPQWalReceiverConnect", MsgAge: -1, ReceiverTimeout: 5 * time.Second}
	var ended int
	for i := 0; i <= 4; i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		if end, why := w.observe(now, s, limitsFor(s, 30*time.Second)); end != 0 {
			if !strings.Contains(why, "LibPQWalReceiverConnect") {
				t.Errorf("why %q does not name the wait", why)
			}
			w.endedReceiver(now, end, why)
			ended++
		}
	}
	st := w.status(t0.Add(4*time.Second), 30*time.Second)
	if ended != 1 || st.Restarts != 1 || st.LastRestart == nil || st.LastRestartReason == "" {
		t.Fatalf("ended %d, status %+v", ended, st)
	}
	if st.Healthy || st.NotStreamingSince == nil || !st.NotStreamingSince.Equal(t0) || st.State != agentapi.ReceiverConnecting {
		t.Fatalf("status %+v: want not healthy, not streaming since %s", st, t0)
	}
	if !strings.Contains(st.Reason, "not streaming from p for 4s") {
		t.Fatalf("reason %q", st.Reason)
	}
	// Streaming again, then no look for 6 s: not trusted.
	w.observe(t0.Add(4500*time.Millisecond), pgsql.ReceiverSample{PID: 8, Status: "streaming", MsgAge: 0, ReceiverTimeout: 5 * time.Second}, limitsFor(s, 30*time.Second))
	w.observe(t0.Add(5*time.Second), pgsql.ReceiverSample{PID: 8, Status: "streaming", MsgAge: 0, ReceiverTimeout: 5 * time.Second}, limitsFor(s, 30*time.Second))
	if st := w.status(t0.Add(5*time.Second), 30*time.Second); !st.Healthy || st.NotStreamingSince != nil {
		t.Fatalf("streaming again: %+v", st)
	}
	if ok, why := w.health(t0.Add(11*time.Second), 30*time.Second); ok || !strings.Contains(why, "last looked at") {
		t.Fatalf("a look 6 s old: ready %v (%s)", ok, why)
	}
	// Following a new primary: not streaming from it yet.
	w.follow(t0.Add(12*time.Second), "q")
	if ok, why := w.health(t0.Add(12*time.Second), 30*time.Second); ok {
		t.Fatalf("ready right after following a new primary (%s)", why)
	}
	// Frozen through a failover for 20 s, then following the new primary: ready while
	// frozen (under maxReadLag), and not streaming counts from the follow, not the freeze.
	w.follow(t0.Add(13*time.Second), "")
	if ok, why := w.health(t0.Add(30*time.Second), 30*time.Second); !ok {
		t.Fatalf("frozen for 17 s with maxReadLag 30s: not ready (%s)", why)
	}
	w.follow(t0.Add(33*time.Second), "r")
	if st := w.status(t0.Add(34*time.Second), 30*time.Second); st.NotStreamingSince == nil || !st.NotStreamingSince.Equal(t0.Add(33*time.Second)) {
		t.Fatalf("after following r at 33 s: not streaming since %v", st.NotStreamingSince)
	}
}
