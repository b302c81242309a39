package pg

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// With spec.postgresql.lossBudget, an asynchronous primary acknowledges no commit whose
// WAL lies more than the budget beyond the flush position of the most advanced standby
// streaming. Its only standby's WAL receiver frozen (SIGSTOP: still connected,
// "streaming", flushing nothing), the primary acknowledges at most the budget's worth of
// WAL, then holds commits; with the standby killed (none streams) it acknowledges
// nothing; once the standby is back, commits go through again. A failover at any moment
// loses at most the budget.
func TestAsynchronousLossBudget(t *testing.T) {
	t.Parallel()
	const budget = 256 << 10
	c := newCluster(t, 2)
	c.setConfig("lossBudget", budget)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	p.mustExec("CREATE TABLE t (id int, pad text)")
	// Every commit that had to be acknowledged so far is on the standby.
	var flushed pglogrepl.LSN
	testutil.Eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		write, err := pglogrepl.ParseLSN(st.WriteLSN)
		if err != nil {
			return err
		}
		for _, rs := range st.Replicas {
			if lsn, err := pglogrepl.ParseLSN(rs.FlushLSN); err == nil && lsn >= write {
				flushed = lsn
				return nil
			}
		}
		return fmt.Errorf("the standby has not flushed %s yet: %+v", st.WriteLSN, st.Replicas)
	})
	var pid int
	testutil.Eventually(t, 30*time.Second, func() (err error) {
		pid, err = r.walReceiverPid()
		return err
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()

	// About 8 kB of WAL a row: 40 rows are more than the budget.
	insert := func(i int) (pglogrepl.LSN, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := p.conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close(context.Background()) }()
		var end string
		err = conn.QueryRow(ctx, `INSERT INTO t SELECT $1, string_agg(md5(random()::text), '') FROM generate_series(1, 250)
			RETURNING pg_current_wal_insert_lsn()::text`, i).Scan(&end)
		if err != nil {
			return 0, err
		}
		return pglogrepl.ParseLSN(end)
	}
	var lastAcked pglogrepl.LSN
	acked, withheld := 0, false
	for i := range 40 {
		end, err := insert(i)
		if err != nil {
			withheld = true
			break
		}
		acked, lastAcked = acked+1, end
	}
	exposure := int64(lastAcked) - int64(flushed)
	t.Logf("the standby's receiver frozen: %d commits acknowledged, up to %d bytes of WAL beyond its flush position (budget %d)", acked, exposure, budget)
	if !withheld {
		t.Fatalf("every commit was acknowledged with the standby flushing nothing: no loss budget")
	}
	if acked == 0 {
		t.Errorf("no commit was acknowledged within the budget of a standby that streams")
	}
	// The commit record follows the insert's WAL: a few hundred bytes of slack.
	if exposure > budget+4096 {
		t.Errorf("acknowledged %d bytes of WAL beyond the standby's flush position, more than the budget %d", exposure, budget)
	}
	if st := p.mustStatus(); st.Role != agentapi.RolePrimary || st.LockedOut {
		t.Errorf("the primary while over budget: role %s, locked out %v; want a primary that only holds commits", st.Role, st.LockedOut)
	}

	// No standby streams: a standby that is gone bounds nothing, so not even a commit
	// well within the budget of what it had flushed is acknowledged.
	r.kill9()
	_ = syscall.Kill(pid, syscall.SIGCONT)
	testutil.Eventually(t, 30*time.Second, func() error {
		if st := p.mustStatus(); len(st.Replicas) > 0 {
			return fmt.Errorf("the primary still lists %+v", st.Replicas)
		}
		return nil
	})
	if _, err := insert(-2); err == nil {
		t.Errorf("a commit was acknowledged while no standby streamed")
	}

	r.start()
	testutil.Eventually(t, time.Minute, func() error {
		return p.tryWrite(5*time.Second, "INSERT INTO t VALUES (-1, 'back')")
	})
}
