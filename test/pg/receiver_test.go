package pg

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// TestHungWALReceiverStreamsAgainWithinSeconds is the pod sandbox kill of issue 32 on
// real PostgreSQL 15 (docs/failover.md, I6). The standby reaches its primary through an
// address of its own, as a pod reaches another by its DNS name; then that address goes
// silent: the stream in progress hears nothing more, and every new connection is
// accepted and never answered, so the WAL receiver waits in LibPQWalReceiverConnect as
// it did for 2 min 14 s on the node (PostgreSQL 15 ignores connect_timeout there; the
// kernel's TCP_USER_TIMEOUT cannot help either, the SYN is answered). A few seconds
// later the primary answers again at that address (its new pod IP published); the
// connections already made stay dead. The standby must say it is not ready while it
// does not stream, and stream again within 10 s.
func TestHungWALReceiverStreamsAgainWithinSeconds(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	p, s := c.instances[0], c.instances[1]
	front := strings.TrimSuffix(p.ip, ".2") + ".200" // 127.0.<k>.200
	pgHole := newHoleProxy(t, front+":5432", p.ip+":5432")
	newHoleProxy(t, front+":8008", p.ip+":8008") // the agent API: never cut
	s.peers = strings.Replace(c.peers(), p.pod+"="+p.ip, p.pod+"="+front, 1)
	c.startAll()
	p.mustExec("CREATE TABLE ticks (i bigint, at timestamptz DEFAULT clock_timestamp())")
	streamingFrom := func(st agentapi.Status) bool {
		return st.Receiver != nil && st.Receiver.State == agentapi.ReceiverStreaming && st.Receiver.Upstream == p.pod
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := s.status()
		if err != nil {
			return err
		}
		if !streamingFrom(st) {
			return fmt.Errorf("%s does not stream from %s yet: %+v", s.pod, p.pod, st.Receiver)
		}
		return nil
	})

	// A writer on the primary: its WAL advances all along.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var written atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int64(1); ctx.Err() == nil; i++ {
			if p.exec("INSERT INTO ticks (i) VALUES ($1)", i) == nil {
				written.Store(i)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	testutil.Eventually(t, 30*time.Second, func() error {
		if n, err := s.count("ticks"); err != nil || n < 5 {
			return fmt.Errorf("%s has %d rows of ticks (%v), want 5 at least", s.pod, n, err)
		}
		return nil
	})

	// Watch the standby's readiness probe and status every 100 ms.
	type seen struct {
		at      time.Time
		ready   bool
		state   string
		restart int
		lag     int64
	}
	var mu sync.Mutex
	var seens []seen
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			ready, answered := s.readyz(ctx)
			if !answered {
				continue
			}
			x := seen{at: time.Now(), ready: ready}
			if st, err := s.status(); err == nil && st.Receiver != nil {
				x.state, x.restart, x.lag = st.Receiver.State, st.Receiver.Restarts, st.Receiver.LagMillis
			}
			mu.Lock()
			seens = append(seens, x)
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The primary's restart with a new address: longer than the stream takes to end
	// (wal_receiver_timeout, 5 s), so that the next receiver connects into the silence.
	const hold = 8 * time.Second
	cut := time.Now()
	pgHole.setHole(true)
	time.Sleep(hold)
	back := time.Now()
	pgHole.setHole(false)
	after := written.Load() + 1 // the first row written once the address answers again
	t.Logf("the primary's address was silent for %s; connections made meanwhile stay silent", hold)

	var streamedAt time.Time
	deadline := back.Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := s.status(); err == nil && streamingFrom(st) {
			// Streaming, and a row written after the address came back is replayed.
			if n, err := s.countRows("ticks", fmt.Sprintf("i >= %d", after)); err == nil && n > 0 {
				streamedAt = time.Now()
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if streamedAt.IsZero() {
		st, _ := s.status()
		t.Fatalf("%s does not stream again 60 s after its primary answers again: %+v\n%s", s.pod, st.Receiver, lastBytes(s.log.Bytes(), 3000))
	}

	mu.Lock()
	defer mu.Unlock()
	var firstUnready, readyAgain time.Time
	states := map[string]bool{}
	restarts := 0
	var maxLag int64
	for _, x := range seens {
		if x.at.Before(cut) {
			continue
		}
		if x.state != "" {
			states[x.state] = true
		}
		restarts = max(restarts, x.restart)
		maxLag = max(maxLag, x.lag)
		if !x.ready && firstUnready.IsZero() {
			firstUnready = x.at
		}
		if x.ready && !firstUnready.IsZero() && readyAgain.IsZero() {
			readyAgain = x.at
		}
	}
	t.Logf("cut → first /readyz not ready: %s", since(cut, firstUnready))
	t.Logf("address back → streaming again with a new row replayed: %s (cut → streaming: %s)", streamedAt.Sub(back).Round(10*time.Millisecond), streamedAt.Sub(cut).Round(10*time.Millisecond))
	t.Logf("address back → /readyz ready again: %s", since(back, readyAgain))
	t.Logf("receiver states seen: %v; receivers the agent ended: %d; largest lag reported: %d ms", states, restarts, maxLag)
	for _, line := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(line, "hung WAL receiver") {
			t.Logf("agent: %s", line)
		}
	}
	if firstUnready.IsZero() {
		t.Errorf("%s's /readyz never said not ready while it did not stream", s.pod)
	}
	if d := streamedAt.Sub(back); d > 10*time.Second {
		t.Errorf("%s streamed again %s after its primary answered again, want within 10 s", s.pod, d.Round(10*time.Millisecond))
	}
	if restarts == 0 {
		t.Errorf("the agent ended no WAL receiver")
	}
}

// TestStalledReplicaMakesTheClusterDegraded: on an operated cluster, a replica whose WAL
// receiver is frozen (SIGSTOP: it says "streaming" and hears nothing, and cannot even
// take the agent's SIGTERM) is not ready, and the cluster is Degraded with the replica
// named in ReplicasStreaming and a ReplicaNotStreaming event; once the receiver runs
// again (it takes the pending SIGTERM, a new one connects) the cluster is Healthy again,
// with a ReplicaStreaming event.
func TestStalledReplicaMakesTheClusterDegraded(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 2)
	startOperated(t, c)
	r := c.instances[1]
	getPGC := func() (dbv1.PostgresCluster, error) {
		var pgc dbv1.PostgresCluster
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc)
		return pgc, err
	}
	testutil.Eventually(t, time.Minute, func() error {
		pgc, err := getPGC()
		if err != nil {
			return err
		}
		if pgc.Status.Phase != dbv1.PhaseHealthy {
			return fmt.Errorf("phase %s", pgc.Status.Phase)
		}
		return nil
	})
	var pid int
	testutil.Eventually(t, 30*time.Second, func() (err error) {
		pid, err = r.walReceiverPid()
		return err
	})
	stopped := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	// A writer, so that the primary has WAL the stalled replica lacks.
	if err := c.writeThroughRW("CREATE TABLE w (i int)"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		_ = c.writeThroughRW("INSERT INTO w VALUES (1)")
		pgc, err := getPGC()
		if err != nil {
			return err
		}
		cond := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionReplicasStreaming)
		if pgc.Status.Phase != dbv1.PhaseDegraded || cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, r.pod+" has not streamed from "+c.instances[0].pod) {
			return fmt.Errorf("phase %s, ReplicasStreaming %+v", pgc.Status.Phase, cond)
		}
		return nil
	})
	degraded := time.Since(stopped)
	pgc, _ := getPGC()
	t.Logf("receiver stopped → phase Degraded: %s; %s", degraded.Round(10*time.Millisecond), dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionReplicasStreaming).Message)
	if ready, _ := r.readyz(context.Background()); ready {
		t.Errorf("%s's /readyz says ready while its receiver is stopped", r.pod)
	}
	if !c.hasEvent(dbv1.ReasonReplicaNotStreaming) {
		t.Error("no ReplicaNotStreaming event")
	}
	resumedAt := time.Now()
	resume()
	testutil.Eventually(t, time.Minute, func() error {
		pgc, err := getPGC()
		if err != nil {
			return err
		}
		cond := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionReplicasStreaming)
		if pgc.Status.Phase != dbv1.PhaseHealthy || cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("phase %s, ReplicasStreaming %+v", pgc.Status.Phase, cond)
		}
		return nil
	})
	t.Logf("receiver resumed → phase Healthy: %s", time.Since(resumedAt).Round(10*time.Millisecond))
	if !c.hasEvent(dbv1.ReasonReplicaStreaming) {
		t.Error("no ReplicaStreaming event")
	}
	st := r.mustStatus()
	if st.Receiver == nil || st.Receiver.Restarts < 1 {
		t.Errorf("the agent did not end the stalled receiver: %+v", st.Receiver)
	} else {
		t.Logf("the agent ended %d receiver(s); the last: %s", st.Receiver.Restarts, st.Receiver.LastRestartReason)
	}
}

// walReceiverPid is the process of in's postmaster whose title says walreceiver.
func (in *instance) walReceiverPid() (int, error) {
	pm := in.postmasterPid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pm) {
			continue
		}
		if cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); strings.Contains(string(cmd), "walreceiver") {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("%s's postmaster %d has no walreceiver", in.pod, pm)
}

func since(from, to time.Time) string {
	if to.IsZero() {
		return "never"
	}
	return to.Sub(from).Round(10 * time.Millisecond).String()
}

// holeProxy forwards a TCP address to another until it is told to be a hole: then
// every connection it has forwarded goes silent for good (nothing more is passed either
// way, nothing is closed), and new ones are accepted and never answered, as an address
// whose host vanished behind a stateful path. Told to forward again, it forwards new
// connections; the silent ones stay silent.
type holeProxy struct {
	target string
	hole   atomic.Bool
	// dead is closed at the end of the test: the held connections close.
	dead chan struct{}
	mu   sync.Mutex
	gen  int // a connection forwarded in an earlier generation is silent
}

func newHoleProxy(t *testing.T, addr, target string) *holeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &holeProxy{target: target, dead: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); close(h.dead) })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go h.serve(conn)
		}
	}()
	return h
}

func (h *holeProxy) setHole(hole bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hole && !h.hole.Load() {
		h.gen++
	}
	h.hole.Store(hole)
}

// live reports whether a connection forwarded in generation gen may still pass data.
func (h *holeProxy) live(gen int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return gen == h.gen && !h.hole.Load()
}

func (h *holeProxy) serve(conn net.Conn) {
	defer conn.Close()
	h.mu.Lock()
	gen, hole := h.gen, h.hole.Load()
	h.mu.Unlock()
	if hole {
		<-h.dead
		return
	}
	up, err := net.DialTimeout("tcp", h.target, 2*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pass := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !h.live(gen) {
					<-h.dead // silent from now on
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pass(up, conn)
	go pass(conn, up)
	select {
	case <-done:
	case <-h.dead:
	}
}
