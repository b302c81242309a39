package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgsql"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// The watch of a standby's WAL receiver (docs/failover.md, I6 "Ready means
// streaming"). PostgreSQL 15's WAL receiver does not honour connect_timeout: when the
// primary's pod came back with a new address, standbys waited in connect to the old one
// for the kernel's SYN retries (2 min 14 s), behind, but ready and served by -ro. The
// agent looks at its receiver at every step and ends one that hangs; the startup
// process starts a new one at once (wal_retrieve_retry_interval), which resolves the
// primary's name again.

// receiverConnectLimit is how long a receiver may run without streaming (connecting, or
// waiting for the startup process) before the agent ends it. A connection and its TLS
// handshake take milliseconds on a pod network; a primary that is starting refuses at
// once. Three seconds is only ever a hang.
const receiverConnectLimit = 3 * time.Second

// receiverStallMargin is added to half of wal_receiver_timeout (when the receiver asks
// the primary for a reply) before a streaming receiver that heard nothing is ended.
const receiverStallMargin = 3 * time.Second

// receiverSampleMaxAge is how old the loop's last look may be for Ready to trust it.
const receiverSampleMaxAge = 5 * time.Second

// lagSamplesMax bounds the positions kept to measure lag (one a step).
const lagSamplesMax = 4096

// receiverLimits are the watch's bounds.
type receiverLimits struct {
	// Connect: a receiver not streaming for this long is ended.
	Connect time.Duration
	// Stall: a streaming receiver that heard nothing for this long is ended; 0: never.
	Stall time.Duration
	// MaxLag is spec.postgresql.maxReadLag.
	MaxLag time.Duration
}

// limitsFor are the limits for a sample: the stall bound follows wal_receiver_timeout,
// at half of which the receiver asks the primary for a reply (so a receiver that hears
// nothing for longer has lost its primary); with the timeout off, an idle primary sends
// nothing and silence proves nothing.
func limitsFor(s pgsql.ReceiverSample, maxLag time.Duration) receiverLimits {
	l := receiverLimits{Connect: receiverConnectLimit, MaxLag: maxLag}
	if s.ReceiverTimeout > 0 {
		l.Stall = s.ReceiverTimeout/2 + receiverStallMargin
	}
	return l
}

type lsnAt struct {
	lsn uint64
	at  time.Time
}

// receiverWatch is what the agent knows of its standby's receiver over time. Its
// methods are pure: time comes in as an argument (tested in receiver_test.go).
type receiverWatch struct {
	state    string
	since    time.Time
	upstream string
	// notStreaming is when the standby last stopped streaming from upstream; zero while
	// it streams.
	notStreaming time.Time
	// pid is the receiver last seen, pidSince when it was first seen; seenStreaming
	// whether that receiver was already streaming at the look before.
	pid           int
	pidSince      time.Time
	seenStreaming bool
	lastMsgAge    time.Duration
	// ends are the primary's reported ends of WAL not yet replayed here, oldest first.
	ends []lsnAt
	lag  time.Duration
	// sampled is when the last sample was taken.
	sampled time.Time
	// detail is what the last look said beyond the state (the receiver's last error).
	detail string

	restarts          int
	lastRestart       time.Time
	lastRestartReason string
	// ended is the last pid ended: never ended twice.
	ended int
}

// follow starts watching a standby of upstream ("" frozen) at now; a change of upstream
// starts over, keeping how long the standby has not streamed.
func (w *receiverWatch) follow(now time.Time, upstream string) {
	if w.state != "" && w.upstream == upstream {
		return
	}
	w.upstream = upstream
	w.pid, w.pidSince, w.lastMsgAge = 0, time.Time{}, -1
	w.ends, w.lag = nil, 0
	// Not streaming from this primary counts from when the standby was told to follow
	// it: a standby frozen through a failover stopped on purpose, and the cluster's record
	// must not count the failover against it.
	if w.notStreaming.IsZero() || upstream != "" {
		w.notStreaming = now
	}
	if upstream == "" {
		w.set(now, agentapi.ReceiverFrozen)
		return
	}
	w.set(now, agentapi.ReceiverConnecting)
}

func (w *receiverWatch) set(now time.Time, state string) {
	if w.state != state {
		w.state, w.since = state, now
	}
	if state == agentapi.ReceiverStreaming {
		w.notStreaming = time.Time{}
	} else if w.notStreaming.IsZero() {
		w.notStreaming = now
	}
}

// observe takes in a sample taken at now and returns the pid of a receiver to end (0
// for none) and why.
func (w *receiverWatch) observe(now time.Time, s pgsql.ReceiverSample, lim receiverLimits) (end int, why string) {
	w.sampled = now
	w.lastMsgAge = s.MsgAge
	if w.upstream == "" {
		w.set(now, agentapi.ReceiverFrozen)
		return 0, ""
	}
	if s.PID != w.pid {
		w.pid, w.pidSince, w.seenStreaming = s.PID, now, false
	}
	wasStreaming := w.seenStreaming
	w.seenStreaming = s.Status == "streaming"
	w.measureLag(now, s)
	switch {
	case s.PID == 0:
		w.set(now, agentapi.ReceiverAbsent)
		return 0, ""
	case s.Status != "streaming":
		w.set(now, agentapi.ReceiverConnecting)
		if waited := now.Sub(w.pidSince); waited >= lim.Connect && w.ended != s.PID {
			why = fmt.Sprintf("it has not streamed for %s (status %s", waited.Round(100*time.Millisecond), s.Status)
			if s.WaitEvent != "" {
				why += ", waiting on " + s.WaitEvent
			}
			return s.PID, why + ")"
		}
		return 0, ""
	case !wasStreaming:
		// A receiver says "streaming" once connected, before the primary accepted its
		// START_REPLICATION: one refused ("replication slot ... is active") showed as
		// streaming for an instant every 100 ms. It streams when seen twice.
		w.set(now, agentapi.ReceiverConnecting)
		return 0, ""
	}
	// Streaming. A receiver that never heard from the primary counts from when it was
	// first seen.
	silent := s.MsgAge
	if silent < 0 {
		silent = now.Sub(w.pidSince)
	}
	if lim.Stall > 0 && silent >= lim.Stall {
		w.set(now, agentapi.ReceiverStalled)
		if w.ended != s.PID {
			return s.PID, fmt.Sprintf("it streams but has heard nothing from the primary for %s (it asks for a reply after half of wal_receiver_timeout)", silent.Round(100*time.Millisecond))
		}
		return 0, ""
	}
	w.set(now, agentapi.ReceiverStreaming)
	return 0, ""
}

// measureLag keeps the primary's reported ends of WAL this standby has not replayed
// yet; the lag is how long ago the primary had the oldest of them.
func (w *receiverWatch) measureLag(now time.Time, s pgsql.ReceiverSample) {
	if s.LatestEnd > 0 && (len(w.ends) == 0 || s.LatestEnd > w.ends[len(w.ends)-1].lsn) {
		if len(w.ends) < lagSamplesMax {
			w.ends = append(w.ends, lsnAt{lsn: s.LatestEnd, at: now})
		} else {
			// Full: the newest keeps its older time, which overstates its lag, never
			// understates it.
			w.ends[len(w.ends)-1].lsn = s.LatestEnd
		}
	}
	i := 0
	for i < len(w.ends) && w.ends[i].lsn <= s.Replayed {
		i++
	}
	w.ends = w.ends[i:]
	w.lag = 0
	if len(w.ends) > 0 {
		w.lag = now.Sub(w.ends[0].at)
	}
}

// ended records that the agent ended pid at now, for why.
func (w *receiverWatch) endedReceiver(now time.Time, pid int, why string) {
	w.ended = pid
	w.restarts++
	w.lastRestart, w.lastRestartReason = now, why
}

// health says whether the standby may serve reads at now: it streams from the primary
// the Lease names and replays within maxLag of it. A frozen standby (a failover or
// handover under way) stopped on purpose and holds what every other standby holds: it
// may serve for maxLag after it stopped, no longer. A look older than
// receiverSampleMaxAge proves nothing.
func (w *receiverWatch) health(now time.Time, maxLag time.Duration) (bool, string) {
	switch {
	case w.state == "":
		return false, "the WAL receiver has not been looked at yet"
	case w.state == agentapi.ReceiverFrozen:
		if d := now.Sub(w.notStreaming); d > maxLag {
			return false, fmt.Sprintf("frozen for %s (a failover or handover is under way), longer than maxReadLag %s", d.Round(time.Second), maxLag)
		}
		return true, ""
	case now.Sub(w.sampled) > receiverSampleMaxAge:
		return false, fmt.Sprintf("the WAL receiver was last looked at %s ago", now.Sub(w.sampled).Round(time.Second))
	case w.state != agentapi.ReceiverStreaming:
		msg := fmt.Sprintf("not streaming from %s for %s: the WAL receiver is %s", w.upstream, now.Sub(w.notStreaming).Round(100*time.Millisecond), w.state)
		if w.detail != "" {
			msg += " (" + w.detail + ")"
		}
		return false, msg
	case w.lag > maxLag:
		return false, fmt.Sprintf("replays %s behind the primary, more than maxReadLag %s", w.lag.Round(time.Second), maxLag)
	}
	return true, ""
}

// status is the watch for /status.
func (w *receiverWatch) status(now time.Time, maxLag time.Duration) *agentapi.ReceiverStatus {
	st := &agentapi.ReceiverStatus{State: w.state, Since: w.since, Upstream: w.upstream, LagMillis: w.lag.Milliseconds(),
		LastMessageMillisAgo: -1, Restarts: w.restarts, LastRestartReason: w.lastRestartReason, MaxLagMillis: maxLag.Milliseconds()}
	if w.lastMsgAge >= 0 {
		st.LastMessageMillisAgo = w.lastMsgAge.Milliseconds()
	}
	if !w.notStreaming.IsZero() {
		t := w.notStreaming
		st.NotStreamingSince = &t
	}
	if !w.lastRestart.IsZero() {
		t := w.lastRestart
		st.LastRestart = &t
	}
	st.Healthy, st.Reason = w.health(now, maxLag)
	return st
}

// receiverWatcher is the agent's watch, under a lock of its own: the loop writes it,
// /status and /readyz read it.
type receiverWatcher struct {
	mu sync.Mutex
	w  *receiverWatch
}

func (r *receiverWatcher) reset() {
	r.mu.Lock()
	r.w = nil
	r.mu.Unlock()
}

// watchReceiver looks at a running standby's WAL receiver (upstream "" when frozen),
// ends one that hangs, and keeps what it saw for /status and /readyz.
func (a *Agent) watchReceiver(ctx context.Context, proc *postgres.Process, upstream string) {
	now := time.Now()
	a.recv.mu.Lock()
	if a.recv.w == nil {
		a.recv.w = &receiverWatch{}
	}
	a.recv.w.follow(now, upstream)
	a.recv.mu.Unlock()
	if upstream == "" {
		return
	}
	s, err := a.db.Receiver(ctx)
	if err != nil {
		a.log.Info("Could not look at the WAL receiver", "error", err.Error())
		return
	}
	now = time.Now()
	maxLag := a.cluster.ReadLagBound()
	a.recv.mu.Lock()
	w := a.recv.w
	before := w.state
	end, why := w.observe(now, s, limitsFor(s, maxLag))
	w.detail = ""
	if w.state == agentapi.ReceiverAbsent || w.state == agentapi.ReceiverConnecting {
		if proc != nil {
			w.detail = lastReceiverFatal(proc.Tail())
		}
	}
	after, notStreaming := w.state, w.notStreaming
	a.recv.mu.Unlock()
	if before != after {
		a.log.Info("WAL receiver", "state", after, "was", before, "primary", upstream, "notStreamingFor", sinceOrZero(now, notStreaming).String())
	}
	if end == 0 {
		return
	}
	how, err := a.db.EndReceiver(ctx, end)
	if err != nil {
		a.log.Error(err, "Could not end a hung WAL receiver", "pid", end, "why", why)
		return
	}
	a.recv.mu.Lock()
	a.recv.w.endedReceiver(now, end, why)
	a.recv.mu.Unlock()
	a.log.Info("Ended a hung WAL receiver; the startup process starts a new one, which looks the primary up again",
		"pid", end, "primary", upstream, "why", why, "how", how)
}

func sinceOrZero(now, t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return now.Sub(t).Round(100 * time.Millisecond)
}

// receiverStatus is the watch for /status; nil when this is not a running standby.
func (a *Agent) receiverStatus(now time.Time) *agentapi.ReceiverStatus {
	maxLag := a.readLagBound() // before recv.mu: setState takes mu, then recv.mu
	a.recv.mu.Lock()
	defer a.recv.mu.Unlock()
	if a.recv.w == nil {
		return nil
	}
	return a.recv.w.status(now, maxLag)
}

// receiverReady is nil when the standby may serve reads (Ready).
func (a *Agent) receiverReady(now time.Time) error {
	maxLag := a.readLagBound()
	holder := a.lease.View().Holder
	if source := a.following(); source != "" && holder == a.cfg.PodName {
		holder = source // the designated primary of a replica cluster
	}
	a.recv.mu.Lock()
	defer a.recv.mu.Unlock()
	if a.recv.w == nil {
		return errors.New("the WAL receiver has not been looked at yet")
	}
	if w := a.recv.w; holder != "" && w.upstream != "" && w.upstream != holder {
		return fmt.Errorf("streams from %s, but the primary Lease names %s", w.upstream, holder)
	}
	if ok, why := a.recv.w.health(now, maxLag); !ok {
		return errors.New(why)
	}
	return nil
}

// following is the source this replica cluster follows, "" for none
// (clusterconfig.Config.Following).
func (a *Agent) following() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cluster.Following()
}

func (a *Agent) readLagBound() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cluster.ReadLagBound()
}
