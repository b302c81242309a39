package agentapi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// States of a standby's WAL receiver (ReceiverStatus.State).
const (
	// ReceiverStreaming — it streams from the primary and hears from it.
	ReceiverStreaming = "streaming"
	// ReceiverConnecting — a receiver runs but does not stream yet (connecting, or
	// waiting for the startup process).
	ReceiverConnecting = "connecting"
	// ReceiverStalled — it says it streams, but has heard nothing from the primary
	// for longer than the primary's keepalives allow.
	ReceiverStalled = "stalled"
	// ReceiverAbsent — no WAL receiver runs (each attempt fails at once, say).
	ReceiverAbsent = "absent"
	// ReceiverFrozen — stopped on purpose: a failover or handover is under way.
	ReceiverFrozen = "frozen"
)

// ReceiverStatus is a standby's WAL receiver as the agent watches it (docs/failover.md,
// I6): whether it streams from the primary the Lease names, how far behind, and how
// often the agent had to restart it.
type ReceiverStatus struct {
	// State is one of the Receiver* constants.
	State string `json:"state"`
	// Since is when the receiver entered State.
	Since time.Time `json:"since"`
	// Upstream is the primary it should stream from ("" when frozen).
	Upstream string `json:"upstream,omitempty"`
	// NotStreamingSince is when it last stopped streaming; nil while it streams.
	NotStreamingSince *time.Time `json:"notStreamingSince,omitempty"`
	// LagMillis is how long ago the primary had WAL this standby has not replayed yet
	// (0 when it has replayed everything the primary last reported).
	LagMillis int64 `json:"lagMillis"`
	// LastMessageMillisAgo is how long ago the receiver last heard from the primary;
	// -1 when it never did.
	LastMessageMillisAgo int64 `json:"lastMessageMillisAgo"`
	// Restarts counts the receivers the agent ended because they hung (since the
	// agent started); LastRestart and LastRestartReason are the last of them.
	Restarts          int        `json:"restarts,omitempty"`
	LastRestart       *time.Time `json:"lastRestart,omitempty"`
	LastRestartReason string     `json:"lastRestartReason,omitempty"`
	// Healthy is whether the standby may serve reads: it streams from the current
	// primary within the lag bound (or is frozen for less than the bound).
	Healthy bool `json:"healthy"`
	// Reason says why it is not healthy; empty when it is.
	Reason string `json:"reason,omitempty"`
	// MaxLagMillis is the bound (spec.postgresql.maxReadLag).
	MaxLagMillis int64 `json:"maxLagMillis"`
}

var (
	receiverStreamingDesc = prometheus.NewDesc("pgpilot_wal_receiver_streaming",
		"1 when this standby's WAL receiver streams from the primary the Lease names, 0 otherwise (absent on a primary).", nil, nil)
	receiverHealthyDesc = prometheus.NewDesc("pgpilot_wal_receiver_healthy",
		"1 when this standby streams within spec.postgresql.maxReadLag and may serve reads.", nil, nil)
	receiverStateDesc = prometheus.NewDesc("pgpilot_wal_receiver_state",
		"The WAL receiver's state as the agent watches it: 1 for the current state.", []string{"state"}, nil)
	receiverNotStreamingDesc = prometheus.NewDesc("pgpilot_wal_receiver_not_streaming_seconds",
		"How long this standby's WAL receiver has not streamed; 0 while it streams.", nil, nil)
	receiverRestartsDesc = prometheus.NewDesc("pgpilot_wal_receiver_restarts_total",
		"WAL receivers the agent ended because they hung (connecting, stalled).", nil, nil)
	receiverLagDesc = prometheus.NewDesc("pgpilot_wal_receiver_lag_seconds",
		"How long ago the primary had WAL this standby has not replayed yet (the standby's own view; spec.postgresql.maxReadLag bounds it).", nil, nil)
)

var receiverDescs = []*prometheus.Desc{receiverStreamingDesc, receiverHealthyDesc, receiverStateDesc, receiverNotStreamingDesc, receiverRestartsDesc, receiverLagDesc}

// collectReceiver adds a standby's receiver metrics; none on a primary.
func collectReceiver(st Status, gauge func(*prometheus.Desc, float64, ...string), counter func(*prometheus.Desc, float64)) {
	r := st.Receiver
	if r == nil {
		return
	}
	gauge(receiverStreamingDesc, boolValue(r.State == ReceiverStreaming))
	gauge(receiverHealthyDesc, boolValue(r.Healthy))
	for _, s := range []string{ReceiverStreaming, ReceiverConnecting, ReceiverStalled, ReceiverAbsent, ReceiverFrozen} {
		gauge(receiverStateDesc, boolValue(r.State == s), s)
	}
	notStreaming := 0.0
	if r.NotStreamingSince != nil {
		notStreaming = time.Since(*r.NotStreamingSince).Seconds()
	}
	gauge(receiverNotStreamingDesc, notStreaming)
	counter(receiverRestartsDesc, float64(r.Restarts))
	gauge(receiverLagDesc, float64(r.LagMillis)/1000)
}
