//go:build e2e

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// BenchmarkFailoverOnANode deletes the primary's pod of a 3-instance synchronous cluster
// on the local Kubernetes node b.N times, while testutil's writer (a persistent and a
// per-statement client) commits one row at a time through <name>-rw the whole time, and
// prints in milliseconds the longest time without an acknowledged write from the delete
// until the cluster is Healthy again (p50, p95, max; the chaos suite's measure), and the
// acknowledged rows lost. Each round waits until the cluster is Healthy
// again with every standby streaming. Nothing is asserted: make bench-e2e prints the
// figures.
func BenchmarkFailoverOnANode(b *testing.B) {
	d := newDB(b, 3, func(c *dbv1.PostgresCluster) { c.Spec.PostgreSQL.SynchronousReplicas = 1 })
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	if err := d.exec("rw", "CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	w := testutil.StartWriter(d.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1,
		Interval: 5 * time.Millisecond, PerStatementInterval: 100 * time.Millisecond})
	var failovers []time.Duration
	b.ResetTimer()
	for range b.N {
		old := d.cluster().Status.CurrentPrimary
		deleted := time.Now()
		if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: old}}); err != nil {
			b.Fatal(err)
		}
		// The deleted pod stays ready until its SIGTERM, so a Healthy status read now
		// may be the one from before: wait for the handover, then for the old pod's
		// return as a replica.
		d.waitNewPrimary(old, 2*time.Minute)
		d.waitReplica(old, 3, 5*time.Minute)
		d.waitStreaming(2, 2*time.Minute)
		took := testutil.Unavailability(w.Attempts(), deleted, time.Now()).Duration()
		failovers = append(failovers, took)
		b.Logf("%s: deleted %s; writes back after %s; Healthy and streaming again after %s with %s primary",
			deleted.Format(time.TimeOnly), old, took.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond), d.cluster().Status.CurrentPrimary)
	}
	b.StopTimer()
	attempts := w.Stop()
	if os.Getenv("E2E_DUMP") != "" {
		d.dump()
	}
	testutil.ReportDurations(b, "failover", failovers)
	testutil.ReportRows(b, d.checkRows("acked", attempts))
}
