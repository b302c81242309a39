package pg

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgpilot/pgpilot/internal/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// With spec.postgresql.lossBudget, an asynchronous primary acknowledges no commit whose
// WAL lies more than the budget beyond the most advanced standby's flush position: with
// its only standby gone it acknowledges at most the budget's worth of WAL, then holds
// commits until the standby is back. A failover at any moment loses at most the budget.
func TestAsynchronousLossBudget(t *testing.T) {
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
	r.kill9()

	// About 8 kB of WAL a row: 40 rows are more than the budget.
	var lastAcked pglogrepl.LSN
	acked, withheld := 0, false
	for i := range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		conn, err := p.conn(ctx)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var end string
		err = conn.QueryRow(ctx, `INSERT INTO t SELECT $1, string_agg(md5(random()::text), '') FROM generate_series(1, 250)
			RETURNING pg_current_wal_insert_lsn()::text`, i).Scan(&end)
		_ = conn.Close(context.Background())
		cancel()
		if err != nil {
			withheld = true
			break
		}
		acked++
		if lastAcked, err = pglogrepl.ParseLSN(end); err != nil {
			t.Fatal(err)
		}
	}
	exposure := int64(lastAcked) - int64(flushed)
	t.Logf("with the standby gone: %d commits acknowledged, up to %d bytes of WAL beyond its flush position (budget %d)", acked, exposure, budget)
	if !withheld {
		t.Fatalf("every commit was acknowledged with the standby gone: no loss budget")
	}
	// The commit record follows the insert's WAL: a few hundred bytes of slack.
	if exposure > budget+4096 {
		t.Errorf("acknowledged %d bytes of WAL beyond the standby's flush position, more than the budget %d", exposure, budget)
	}
	if st := p.mustStatus(); st.Role != agentapi.RolePrimary || st.LockedOut {
		t.Errorf("the primary while over budget: role %s, locked out %v; want a primary that only holds commits", st.Role, st.LockedOut)
	}

	r.start()
	testutil.Eventually(t, time.Minute, func() error {
		return p.tryWrite(5*time.Second, "INSERT INTO t VALUES (-1, 'back')")
	})
}
