package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// replicaOf makes rep a replica cluster of src, as spec.replica renders it: the
// source's -rw host in config.json, the source's replication certificate and CA
// mounted as source/, and (here, where no DNS answers) the host's address given
// with the peers.
func replicaOf(rep, src *cluster) string {
	host := fmt.Sprintf("%s-rw.%s.svc", src.name, src.namespace)
	rep.setConfig("replica", map[string]any{"enabled": true, "host": host, "port": 5432})
	rep.writeTLS("source", src.issue(certificates.ReplicationRequest()), src.caPEM)
	for _, in := range rep.instances {
		in.peers = rep.peers() + host + "=" + src.instances[0].ip
	}
	return host
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
