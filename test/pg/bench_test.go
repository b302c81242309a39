package pg

import (
	"context"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// BenchmarkFailover kills the primary of a 3-instance cluster (agent and postmaster,
// kill -9) b.N times and prints, in milliseconds (p50, p95 and max):
//   - promote: from the promote call to the first write accepted by the new primary;
//   - follow: from then until the other replica streams the new timeline and has that write;
//   - rejoin: from restarting the old primary's agent until it is a replica on the new
//     timeline (pg_rewind included).
//
// The Lease is moved by the benchmark, as the failover controller would; detecting the
// failure is not measured here. It asserts nothing about the figures.
func BenchmarkFailover(b *testing.B) {
	c := newCluster(b, 3)
	c.startAll()
	timeline := int64(1)
	c.instances[0].mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())")
	var promote, follow, rejoin []time.Duration
	primary := 0
	b.ResetTimer()
	for range b.N {
		old, next, other := c.instances[primary], c.instances[(primary+1)%3], c.instances[(primary+2)%3]
		old.mustExec("INSERT INTO t DEFAULT VALUES")
		old.kill9()
		c.setLease(next.pod, true)
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := next.api().Promote(ctx); err != nil {
			cancel()
			b.Fatalf("promote %s: %v", next.pod, err)
		}
		cancel()
		for next.exec("INSERT INTO t DEFAULT VALUES") != nil {
			time.Sleep(5 * time.Millisecond)
		}
		promoted := time.Now()
		promote = append(promote, promoted.Sub(start))
		timeline++
		n, err := next.count("t")
		if err != nil {
			b.Fatal(err)
		}
		for {
			st, err := other.status()
			got, _ := other.count("t")
			if err == nil && st.Role == agentapi.RoleReplica && st.Timeline == timeline && got == n {
				break
			}
			if time.Since(promoted) > 2*time.Minute {
				b.Fatalf("%s did not follow timeline %d: %+v", other.pod, timeline, st)
			}
			time.Sleep(5 * time.Millisecond)
		}
		follow = append(follow, time.Since(promoted))
		restarted := time.Now()
		old.start()
		old.waitRoleB(b, agentapi.RoleReplica, timeline)
		rejoin = append(rejoin, time.Since(restarted))
		primary = (primary + 1) % 3
	}
	b.StopTimer()
	testutil.ReportDurations(b, "promote", promote)
	testutil.ReportDurations(b, "follow", follow)
	testutil.ReportDurations(b, "rejoin", rejoin)
}

// waitRoleB is waitRole for a benchmark: polls every 5 ms so the figures are not rounded
// up to the poll period.
func (in *instance) waitRoleB(b *testing.B, role string, tl int64) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := in.status()
		if err == nil && st.Role == role && st.Ready && st.Timeline == tl {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %+v %v; want %s on timeline %d", in.pod, st, err, role, tl)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
