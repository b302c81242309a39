package pg

import (
	"testing"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// BenchmarkOperatorFailover kills the primary of a 3-instance cluster run by the real
// operator (kill -9 of agent and postmaster) b.N times and prints, in milliseconds, the
// time from the kill to the first write accepted through the read-write Service (p50,
// p95, max), and the acknowledged rows lost, counted by a writer that commits one row at
// a time through the Service the whole time. With the default settings (failover delay
// 3s, asynchronous) and in synchronous mode (synchronousReplicas 1). Nothing is asserted.
func BenchmarkOperatorFailover(b *testing.B) {
	for _, mode := range []struct {
		name string
		sync int32
	}{{"defaults", 0}, {"synchronous", 1}} {
		b.Run(mode.name, func(b *testing.B) {
			c := newOperatedCluster(b, 3, func(p *dbv1.PostgresCluster) { p.Spec.PostgreSQL.SynchronousReplicas = mode.sync })
			c.startAll()
			for c.writeThroughRW("CREATE TABLE IF NOT EXISTS acked (id bigint PRIMARY KEY)") != nil {
				time.Sleep(50 * time.Millisecond)
			}
			w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1,
				Interval: 2 * time.Millisecond, PerStatementInterval: 100 * time.Millisecond})
			var failovers []time.Duration
			timeline := int64(1)
			b.ResetTimer()
			for range b.N {
				old := c.readWrite()
				for old == nil {
					time.Sleep(10 * time.Millisecond)
					old = c.readWrite()
				}
				killed := time.Now()
				old.kill9()
				for {
					if rw := c.readWrite(); rw != nil && rw != old && rw.exec("SELECT 1") == nil && c.writeThroughRW("INSERT INTO acked VALUES (-1) ON CONFLICT DO NOTHING") == nil {
						break
					}
					if time.Since(killed) > 2*time.Minute {
						b.Fatal("no new primary within 2 minutes")
					}
					time.Sleep(5 * time.Millisecond)
				}
				failovers = append(failovers, time.Since(killed))
				timeline++
				old.start()
				old.waitRoleB(b, agentapi.RoleReplica, timeline)
			}
			b.StopTimer()
			attempts := w.Stop()
			testutil.ReportDurations(b, "failover", failovers)
			rw := c.readWrite()
			for rw == nil {
				time.Sleep(10 * time.Millisecond)
				rw = c.readWrite()
			}
			testutil.ReportRows(b, rw.checkAcked(attempts))
		})
	}
}

// BenchmarkSwitchover switches the primary of a 3-instance cluster run by the real
// operator b.N times (to the next instance each time) while a writer commits one row at
// a time through the read-write Service, and prints the longest gap between two
// acknowledged writes per switchover (p50, p95, max, in milliseconds) and the
// acknowledged rows lost. Nothing is asserted.
func BenchmarkSwitchover(b *testing.B) {
	c := newOperatedCluster(b, 3)
	c.startAll()
	for c.writeThroughRW("CREATE TABLE IF NOT EXISTS acked (id bigint PRIMARY KEY)") != nil {
		time.Sleep(50 * time.Millisecond)
	}
	w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1,
		Interval: 2 * time.Millisecond, PerStatementInterval: 100 * time.Millisecond})
	var gaps []time.Duration
	timeline := int64(1)
	primary := 0
	b.ResetTimer()
	for range b.N {
		target := c.instances[(primary+1)%3]
		time.Sleep(300 * time.Millisecond) // writes flow before
		asked := time.Now()
		c.annotate(dbv1.AnnotationSwitchoverTo, target.pod)
		for c.readWrite() != target {
			time.Sleep(5 * time.Millisecond)
		}
		timeline++
		c.instances[primary].waitRoleB(b, agentapi.RoleReplica, timeline)
		time.Sleep(300 * time.Millisecond) // and after
		gaps = append(gaps, testutil.Unavailability(w.Attempts(), asked, time.Now()).Duration())
		primary = (primary + 1) % 3
	}
	b.StopTimer()
	attempts := w.Stop()
	testutil.ReportDurations(b, "unavailable", gaps)
	testutil.ReportRows(b, c.instances[primary].checkAcked(attempts))
}
