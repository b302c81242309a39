// Package testutil holds helpers the test suites share.
package testutil

import (
	"context"
	"crypto/x509"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Eventually polls check every 100 ms until it returns nil, or fails the test with
// check's last error once timeout has passed. Tests wait for conditions this way,
// never with a fixed sleep.
func Eventually(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReportDurations reports the median, 95th percentile and maximum of ds, in
// milliseconds, as the benchmark metrics <what>-p50-ms, <what>-p95-ms and <what>-max-ms.
func ReportDurations(b *testing.B, what string, ds []time.Duration) {
	b.Helper()
	if len(ds) == 0 {
		return
	}
	at := func(q float64) float64 { return float64(Percentile(ds, q).Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), what+"-p50-ms")
	b.ReportMetric(at(0.95), what+"-p95-ms")
	b.ReportMetric(at(1), what+"-max-ms")
}

// ReportRows prints a benchmark's acknowledged rows and how many of them were lost.
func ReportRows(b *testing.B, c RowCheck) {
	b.ReportMetric(float64(c.Acked), "rows-acked")
	b.ReportMetric(float64(len(c.Lost)), "acked-rows-lost")
}

// IDs returns the bigint id column of table, read through conn: the benchmarks compare
// it with the ids whose inserts were acknowledged.
func IDs(ctx context.Context, conn *pgx.Conn, table string) (map[int64]bool, error) {
	rows, err := conn.Query(ctx, "SELECT id FROM "+pgx.Identifier{table}.Sanitize())
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	out := make(map[int64]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// AgentHTTP is an HTTP client of the agent API of the pod named serverName (its name
// behind the headless Service), verified with the cluster's CA in caPEM, as the operator
// calls it.
func AgentHTTP(serverName string, caPEM []byte) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	// One connection per request: tests make a client per call, and idle connections of
	// clients dropped would pile up on the agents.
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   agentapi.ClientTLS(serverName, func() (*x509.CertPool, error) { return roots, nil }),
		DisableKeepAlives: true,
	}}
}
