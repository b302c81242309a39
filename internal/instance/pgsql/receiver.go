package pgsql

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// ReceiverSample is one look at the WAL receiver (pg_stat_wal_receiver and
// pg_stat_activity) and the standby's replay position.
type ReceiverSample struct {
	// PID is the receiver's process; 0 when none runs.
	PID int
	// Status is pg_stat_wal_receiver.status (streaming, waiting, ...), or "connecting"
	// for a receiver that pg_stat_activity shows and pg_stat_wal_receiver not yet.
	Status string
	// WaitEvent is what the receiver waits on (LibPQWalReceiverConnect while it
	// connects).
	WaitEvent string
	// MsgAge is how long ago the receiver last heard from the primary; negative when it
	// never did.
	MsgAge time.Duration
	// LatestEnd is the primary's end of WAL as the primary last reported it; Replayed is
	// this standby's replay position. 0 when unknown.
	LatestEnd, Replayed uint64
	// ReceiverTimeout is wal_receiver_timeout (0: off).
	ReceiverTimeout time.Duration
}

// Receiver looks at this standby's WAL receiver.
func (d *DB) Receiver(ctx context.Context) (ReceiverSample, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return ReceiverSample{}, err
	}
	defer conn.Release()
	var s ReceiverSample
	var age, timeout int64
	var end, replayed int64
	// pg_stat_wal_receiver shows a receiver only once it has connected (PostgreSQL 15:
	// ready_to_display), and then says "streaming" before the primary accepted
	// START_REPLICATION. A receiver still connecting is seen in pg_stat_activity only,
	// waiting on LibPQWalReceiverConnect: found on real PostgreSQL, where the watch first
	// took a receiver hung in connect for 63 s for no receiver at all.
	err = conn.QueryRow(ctx, `SELECT coalesce(a.pid, r.pid, 0),
		coalesce(r.status, CASE WHEN a.pid IS NOT NULL THEN 'connecting' END, ''), coalesce(a.wait_event, ''),
		coalesce((extract(epoch FROM clock_timestamp() - r.last_msg_receipt_time) * 1000)::bigint, -1),
		coalesce(pg_wal_lsn_diff(r.latest_end_lsn, '0/0'), 0)::bigint,
		coalesce(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0'), 0)::bigint,
		(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_receiver_timeout')
		FROM (SELECT 1) one
		LEFT JOIN (SELECT pid, wait_event FROM pg_stat_activity WHERE backend_type = 'walreceiver' ORDER BY backend_start DESC LIMIT 1) a ON true
		LEFT JOIN pg_stat_wal_receiver r ON true`).
		Scan(&s.PID, &s.Status, &s.WaitEvent, &age, &end, &replayed, &timeout)
	if err != nil {
		return s, err
	}
	s.MsgAge = time.Duration(age) * time.Millisecond
	if age < 0 {
		s.MsgAge = -1
	}
	s.LatestEnd, s.Replayed = uint64(max(end, 0)), uint64(max(replayed, 0))
	s.ReceiverTimeout = time.Duration(max(timeout, 0)) * time.Millisecond
	return s, nil
}

// EndReceiver ends the WAL receiver pid; the startup process starts another.
// pg_terminate_backend refuses it ("PID ... is not a PostgreSQL backend process": it is
// an auxiliary process in PostgreSQL 15, checked on real PostgreSQL), so the agent, the
// same OS user as postgres, sends it SIGTERM itself once it has checked that pid still
// is this postgres's receiver. It exits with "terminating walreceiver process due to
// administrator command", as pg_terminate_backend would have it.
func (d *DB) EndReceiver(ctx context.Context, pid int) (string, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Release()
	var still int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walreceiver' AND pid = $1`, pid).Scan(&still)
	if err != nil {
		return "", err
	}
	if still == 0 {
		return "gone already", nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return "", fmt.Errorf("sending SIGTERM to the WAL receiver %d: %w", pid, err)
	}
	return "SIGTERM", nil
}
