package pg

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// replicaOf makes rep a replica cluster of src, as spec.replica renders it: the
// source's -rw host in config.json, the source's replication certificate and CA
// mounted as source/, and (here, where no DNS answers) the host's address given
// with the peers. It returns the host.
func replicaOf(rep, src *cluster) string {
	host := rwHost(src)
	rep.setConfig("replica", map[string]any{"enabled": true, "host": host, "port": 5432})
	rep.writeTLS("source", src.issue(certificates.ReplicationRequest()), src.caPEM)
	reachable(rep, src)
	return host
}

// rwHost is c's read-write Service's name.
func rwHost(c *cluster) string { return fmt.Sprintf("%s-rw.%s.svc", c.name, c.namespace) }

// reachable gives c's agents (started after) src's -rw host, at src's first instance.
func reachable(c, src *cluster) {
	for _, in := range c.instances {
		in.peers = cmp.Or(in.peers, c.peers()) + rwHost(src) + "=" + src.instances[0].ip + ","
	}
}

// A replica cluster clones its source over TLS with the source's replication
// certificate, follows its WAL with a continuous writer on the source (its second
// instance cascading from the designated primary), serves reads and refuses writes;
// promoted, it has every row it had received, takes writes on a new timeline, and its
// passwords become its own.
func TestReplicaCluster(t *testing.T) {
	t.Parallel()
	src := newCluster(t, 1)
	src.startAll()
	sp := src.instances[0]
	sp.mustExec("CREATE TABLE items (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())")
	sp.mustExec("INSERT INTO items (id) SELECT g FROM generate_series(1, 1000) g")

	// A writer on the source all along: each row acknowledged is kept.
	var mu sync.Mutex
	var acked []int64
	stop, wrote := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(wrote)
		ctx := context.Background()
		conn, err := sp.conn(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		for id := int64(1_000_000); ; id++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := conn.Exec(ctx, "INSERT INTO items (id) VALUES ($1)", id); err != nil {
				t.Errorf("writing to the source: %v", err)
				return
			}
			mu.Lock()
			acked = append(acked, id)
			mu.Unlock()
		}
	}()

	rep := newCluster(t, 2)
	host := replicaOf(rep, src)
	for _, in := range rep.instances {
		in.start()
	}
	designated, cascaded := rep.instances[0], rep.instances[1]
	st := designated.waitStreaming(host)
	if st.SystemIdentifier != sp.mustStatus().SystemIdentifier {
		t.Errorf("the replica cluster holds database %s, the source %s", st.SystemIdentifier, sp.mustStatus().SystemIdentifier)
	}
	cascaded.waitStreaming(designated.pod)

	// Reads with the source's passwords: the data, roles included, is the source's.
	own := rep.creds.App.Password
	rep.creds.App.Password = src.creds.App.Password
	err := cascaded.exec("INSERT INTO items (id) VALUES (1)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write to the replica cluster: %v, want read_only_sql_transaction", err)
	}

	// Lag, as a client sees it: the newest acknowledged row on the source, found on the
	// cascaded instance.
	var lags []time.Duration
	for range 10 {
		time.Sleep(time.Second)
		mu.Lock()
		last := acked[len(acked)-1]
		mu.Unlock()
		from := time.Now()
		testutil.Eventually(t, 30*time.Second, func() error {
			if n := cascaded.countWhere("items", fmt.Sprintf("id = %d", last)); n != 1 {
				return fmt.Errorf("row %d not on %s yet", last, cascaded.pod)
			}
			return nil
		})
		lags = append(lags, time.Since(from))
	}
	slices.Sort(lags)
	t.Logf("an acknowledged row on the source was readable on the cascaded instance after %s (median) and %s (most) of 10", lags[5], lags[9])
	if lags[9] > 10*time.Second {
		t.Errorf("the replica cluster lags %s, want under 10 s", lags[9])
	}
	st, _ = designated.status()
	if st.Receiver == nil || !st.Receiver.Healthy || st.Receiver.LagMillis > 10_000 {
		t.Errorf("the designated primary's receiver: %+v", st.Receiver)
	}

	// Promotion: the writer stops (the source is lost, say); what was received is kept.
	close(stop)
	<-wrote
	mu.Lock()
	want := append([]int64(nil), acked...)
	mu.Unlock()
	t.Logf("%d rows acknowledged on the source while the replica cluster followed it", len(want))
	for _, in := range rep.instances {
		in.waitCount("items", int64(1000+len(want)), upTimeout)
	}
	rep.setConfig("replica", map[string]any{"enabled": false, "host": host, "port": 5432})
	pst := designated.waitRole(agentapi.RolePrimary, 0, upTimeout)
	if pst.Timeline <= st.Timeline {
		t.Errorf("promoted onto timeline %d, the source's is %d", pst.Timeline, st.Timeline)
	}
	cascaded.waitRole(agentapi.RoleReplica, pst.Timeline, upTimeout)

	// Its passwords are its own now, the source's no longer work.
	rep.creds.App.Password = own
	designated.mustExec("INSERT INTO items (id) VALUES (-1)")
	cascaded.waitCount("items", int64(1000+len(want)+1), upTimeout)
	if missing := designated.countMissing(t, want); missing > 0 {
		t.Errorf("%d of %d rows the source acknowledged are missing after the promotion", missing, len(want))
	}
	rep.creds.App.Password = src.creds.App.Password
	if err := designated.exec("SELECT 1"); err == nil {
		t.Error("the source's app password still logs in to the promoted cluster")
	}
	rep.creds.App.Password = own

	// The source is a cluster of its own still, and did not see any of it.
	if n := sp.countWhere("items", "id = -1"); n != 0 {
		t.Errorf("the source has the promoted cluster's row")
	}
	sp.mustExec("INSERT INTO items (id) VALUES (-2)")
}

// waitStreaming waits until in is a ready standby streaming healthily from upstream.
func (in *instance) waitStreaming(upstream string) agentapi.Status {
	in.c.t.Helper()
	st := in.waitRole(agentapi.RoleReplica, 0, upTimeout)
	testutil.Eventually(in.c.t, upTimeout, func() error {
		var err error
		if st, err = in.status(); err != nil {
			return err
		}
		if r := st.Receiver; r == nil || r.Upstream != upstream || !r.Healthy {
			return fmt.Errorf("%s's WAL receiver: %+v; want streaming from %s", in.pod, r, upstream)
		}
		return nil
	})
	return st
}

// The planned switch of roles between two clusters. A (synchronous, two instances)
// takes writes; B follows it. A is given spec.replica naming B: its primary stops
// cleanly and follows B, its demotion token says where it stopped. B, promoted with
// that token, waits until it has replayed past it. No row A acknowledged is missing
// from B, A acknowledged nothing after B's first write, and A then follows B, its
// second instance cascading, B's writes reaching both.
func TestReplicaClusterSwitchesRoles(t *testing.T) {
	t.Parallel()
	a := newCluster(t, 2)
	a.setConfig("synchronousReplicas", 1)
	b := newCluster(t, 1)
	reachable(a, b)
	a.startAll()
	ap := a.instances[0]
	ap.mustExec("CREATE TABLE items (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())")
	hostA := replicaOf(b, a)
	b.instances[0].start()
	bp := b.instances[0]
	bp.waitStreaming(hostA)

	// Writers on both, all along: each records when its writes were acknowledged.
	type acks struct {
		mu          sync.Mutex
		ids         []int64
		first, last time.Time
	}
	write := func(in *instance, creds *cluster, from int64, got *acks, stop <-chan struct{}, done chan<- struct{}) {
		defer close(done)
		cfg, err := in.connConfig()
		if err != nil {
			t.Error(err)
			return
		}
		cfg.Password = creds.creds.App.Password
		for id := from; ; id++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err == nil {
				_, err = conn.Exec(ctx, "INSERT INTO items (id) VALUES ($1)", id)
				conn.Close(context.Background())
			}
			cancel()
			if err != nil {
				continue
			}
			got.mu.Lock()
			got.ids = append(got.ids, id)
			if got.first.IsZero() {
				got.first = time.Now()
			}
			got.last = time.Now()
			got.mu.Unlock()
		}
	}
	var onA, onB acks
	stop := make(chan struct{})
	doneA, doneB := make(chan struct{}), make(chan struct{})
	go write(ap, a, 1, &onA, stop, doneA)
	go write(bp, b, 1_000_000, &onB, stop, doneB)
	testutil.Eventually(t, 30*time.Second, func() error {
		onA.mu.Lock()
		defer onA.mu.Unlock()
		if len(onA.ids) < 200 {
			return fmt.Errorf("%d rows acknowledged on A", len(onA.ids))
		}
		return nil
	})

	// A is demoted to follow B.
	hostB := rwHost(b)
	a.setConfig("replica", map[string]any{"enabled": true, "host": hostB, "port": 5432})
	a.writeTLS("source", b.issue(certificates.ReplicationRequest()), b.caPEM)
	token := ap.waitDemotionToken()
	t.Logf("A's demotion token: %s", token)
	if err := ap.exec("INSERT INTO items (id) VALUES (-1)"); err == nil {
		t.Error("the demoted A took a write")
	}

	// B, promoted with the token, waits for A's final WAL, then takes writes.
	b.setConfig("replica", map[string]any{"enabled": false, "host": hostA, "port": 5432, "promotionToken": token})
	pst := bp.waitRole(agentapi.RolePrimary, 0, upTimeout)
	testutil.Eventually(t, upTimeout, func() error {
		onB.mu.Lock()
		defer onB.mu.Unlock()
		if len(onB.ids) < 200 {
			return fmt.Errorf("%d rows acknowledged on B", len(onB.ids))
		}
		return nil
	})
	close(stop)
	<-doneA
	<-doneB

	onA.mu.Lock()
	onB.mu.Lock()
	defer onA.mu.Unlock()
	defer onB.mu.Unlock()
	t.Logf("A acknowledged %d rows, the last %s before B's first of %d", len(onA.ids), onB.first.Sub(onA.last).Round(time.Millisecond), len(onB.ids))
	if !onA.last.Before(onB.first) {
		t.Errorf("A acknowledged a write at %s, after B's first at %s: two writable clusters", onA.last, onB.first)
	}
	if missing := bp.countMissing(t, onA.ids); missing > 0 {
		t.Errorf("%d of the %d rows A acknowledged are missing from B", missing, len(onA.ids))
	}

	// A follows B now, on B's timeline, its second instance cascading.
	a.creds.App.Password = b.creds.App.Password
	st := ap.waitStreaming(hostB)
	if st.Timeline != pst.Timeline {
		t.Errorf("A's designated primary is on timeline %d, B's primary on %d", st.Timeline, pst.Timeline)
	}
	a.instances[1].waitStreaming(ap.pod)
	last := onB.ids[len(onB.ids)-1]
	for _, in := range a.instances {
		testutil.Eventually(t, upTimeout, func() error {
			if n := in.countWhere("items", fmt.Sprintf("id = %d", last)); n != 1 {
				return fmt.Errorf("B's row %d not on %s yet", last, in.pod)
			}
			return nil
		})
	}
	if tok, _ := ap.status(); tok.DemotionToken != "" {
		t.Errorf("A streams from B but still reports its demotion token %s", tok.DemotionToken)
	}
}

// waitDemotionToken waits until in's agent has logged its demotion and returns the
// token (the agent forgets it once it streams from the source, which can be at once
// here, where the source's -rw name reaches the source's instance whatever its role).
func (in *instance) waitDemotionToken() string {
	in.c.t.Helper()
	var token string
	testutil.Eventually(in.c.t, upTimeout, func() error {
		for _, line := range strings.Split(in.log.String(), "\n") {
			var entry struct {
				Msg   string `json:"msg"`
				Token string `json:"token"`
			}
			if json.Unmarshal([]byte(line), &entry) == nil && strings.HasPrefix(entry.Msg, "Demoted:") {
				token = entry.Token
				return nil
			}
		}
		return fmt.Errorf("%s has not logged its demotion", in.pod)
	})
	return token
}
