package pg

import (
	"context"
	"sync"
	"testing"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/agentapi"
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
			var (
				mu    sync.Mutex
				acked []int64
			)
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for id := int64(1); ; id++ {
					select {
					case <-stop:
						return
					default:
					}
					if c.writeThroughRW("INSERT INTO acked VALUES ($1)", id) == nil {
						mu.Lock()
						acked = append(acked, id)
						mu.Unlock()
					} else {
						time.Sleep(5 * time.Millisecond)
					}
				}
			}()
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
			close(stop)
			<-done
			testutil.ReportDurations(b, "failover", failovers)
			rw := c.readWrite()
			for rw == nil {
				time.Sleep(10 * time.Millisecond)
				rw = c.readWrite()
			}
			present, err := rw.ids("acked")
			if err != nil {
				b.Fatal(err)
			}
			lost := 0
			for _, id := range acked {
				if !present[id] {
					lost++
				}
			}
			b.ReportMetric(float64(len(acked)), "rows-acked")
			b.ReportMetric(float64(lost), "acked-rows-lost")
		})
	}
}

// ids returns the id column of table.
func (in *instance) ids(table string) (map[int64]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := in.conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	return testutil.IDs(ctx, conn, table)
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
	var (
		mu     sync.Mutex
		acked  []int64
		lastOK = time.Now()
		gap    time.Duration
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for id := int64(1); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			if c.writeThroughRW("INSERT INTO acked VALUES ($1)", id) == nil {
				mu.Lock()
				acked = append(acked, id)
				gap = max(gap, time.Since(lastOK))
				lastOK = time.Now()
				mu.Unlock()
			} else {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	var gaps []time.Duration
	timeline := int64(1)
	primary := 0
	b.ResetTimer()
	for range b.N {
		target := c.instances[(primary+1)%3]
		time.Sleep(300 * time.Millisecond) // writes flow before
		mu.Lock()
		gap = 0
		mu.Unlock()
		c.annotate(dbv1.AnnotationSwitchoverTo, target.pod)
		for c.readWrite() != target {
			time.Sleep(5 * time.Millisecond)
		}
		timeline++
		c.instances[primary].waitRoleB(b, agentapi.RoleReplica, timeline)
		time.Sleep(300 * time.Millisecond) // and after
		mu.Lock()
		gaps = append(gaps, gap)
		mu.Unlock()
		primary = (primary + 1) % 3
	}
	b.StopTimer()
	close(stop)
	<-done
	testutil.ReportDurations(b, "unavailable", gaps)
	present, err := c.instances[primary].ids("acked")
	if err != nil {
		b.Fatal(err)
	}
	lost := 0
	for _, id := range acked {
		if !present[id] {
			lost++
		}
	}
	b.ReportMetric(float64(len(acked)), "rows-acked")
	b.ReportMetric(float64(lost), "acked-rows-lost")
}
