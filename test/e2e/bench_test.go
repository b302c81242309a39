//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// BenchmarkFailoverOnANode deletes the primary's pod of a 3-instance synchronous cluster
// on the local Kubernetes node b.N times, while a writer commits one row at a time
// through <name>-rw the whole time, and prints in milliseconds the time from the delete
// to the first write acknowledged through -rw after the writes began to fail (p50, p95,
// max), and the acknowledged rows lost. Each round waits until the cluster is Healthy
// again with every standby streaming. Nothing is asserted: make bench-e2e prints the
// figures.
func BenchmarkFailoverOnANode(b *testing.B) {
	d := newDB(b, 3, func(c *dbv1.PostgresCluster) { c.Spec.PostgreSQL.SynchronousReplicas = 1 })
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	if err := d.exec("rw", "CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	// attempt is one write of the writer: when it ended and whether it was acknowledged.
	type attempt struct {
		at time.Time
		ok bool
	}
	var (
		mu       sync.Mutex
		acked    []int64
		attempts []attempt
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
			err := d.exec("rw", "INSERT INTO acked VALUES ($1)", id)
			mu.Lock()
			attempts = append(attempts, attempt{time.Now(), err == nil})
			if err == nil {
				acked = append(acked, id)
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	// outage is, for a primary deleted at t, the time from t to the first write
	// acknowledged after the first one that failed: 0 when none failed.
	outage := func(t time.Time) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		failed := false
		for _, a := range attempts {
			switch {
			case a.at.Before(t):
			case !a.ok:
				failed = true
			case failed:
				return a.at.Sub(t), nil
			}
		}
		return 0, fmt.Errorf("no write acknowledged after the outage yet")
	}
	var failovers []time.Duration
	b.ResetTimer()
	for range b.N {
		old := d.cluster().Status.CurrentPrimary
		deleted := time.Now()
		if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: old}}); err != nil {
			b.Fatal(err)
		}
		d.waitHealthy(3, 5*time.Minute)
		d.waitStreaming(2, 2*time.Minute)
		var took time.Duration
		testutil.Eventually(b, time.Minute, func() (err error) {
			took, err = outage(deleted)
			return err
		})
		failovers = append(failovers, took)
		b.Logf("%s: deleted %s; writes back after %s; Healthy and streaming again after %s with %s primary",
			deleted.Format(time.TimeOnly), old, took.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond), d.cluster().Status.CurrentPrimary)
	}
	b.StopTimer()
	close(stop)
	<-done
	if os.Getenv("E2E_DUMP") != "" {
		d.dump()
	}
	testutil.ReportDurations(b, "failover", failovers)
	present, err := d.ids("acked")
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

// ids returns the id column of table, read through -rw.
func (d *db) ids(table string) (map[int64]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, "rw")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	return testutil.IDs(ctx, conn, table)
}
