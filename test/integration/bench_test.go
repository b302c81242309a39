package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// BenchmarkCreateToTopology measures, from creating the README's example, how long
// until the StatefulSet is rendered and until everything a pod needs to start exists
// (StatefulSet, the three credentials Secrets and the primary Lease). It prints
// p50/p95/max in milliseconds and asserts nothing about them.
func BenchmarkCreateToTopology(b *testing.B) {
	ns := fmt.Sprintf("bench-%d", namespaceSeq.Add(1))
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	var rendered, startable []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		if err := k8s.Create(context.Background(), newCluster(ns, name)); err != nil {
			b.Fatal(err)
		}
		rendered = append(rendered, waitFor(b, func() error { return get(ns, name, &appsv1.StatefulSet{}) }).Sub(start))
		startable = append(startable, waitFor(b, func() error {
			n := dbv1.NamesOf(name)
			for _, s := range []string{n.SuperuserSecret(), n.ReplicationSecret(), n.AppSecret()} {
				if err := get(ns, s, &corev1.Secret{}); err != nil {
					return err
				}
			}
			return get(ns, dbv1.NamesOf(name).PrimaryLease(), &coordinationv1.Lease{})
		}).Sub(start))
	}
	b.StopTimer()
	report(b, "rendered", rendered)
	report(b, "startable", startable)
}

// waitFor polls check every 5 ms and returns when it first succeeded.
func waitFor(b *testing.B, check func() error) time.Time {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func report(b *testing.B, what string, ds []time.Duration) {
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p := func(q float64) time.Duration { return ds[int(q*float64(len(ds)-1))] }
	b.ReportMetric(ms(p(0.5)), what+"-p50-ms")
	b.ReportMetric(ms(p(0.95)), what+"-p95-ms")
	b.ReportMetric(ms(ds[len(ds)-1]), what+"-max-ms")
}
