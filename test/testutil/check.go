package testutil

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// RowCheck compares a table with the attempts that wrote into it.
type RowCheck struct {
	// Attempted counts attempts; Acked those acknowledged (SyncWarned included);
	// SyncWarned those acknowledged with the synchronous-replication WARNING.
	Attempted, Acked, SyncWarned int
	// Lost are the ids of acknowledged commits that are not in the table: the
	// guarantee broken. LostSyncWarned counts those acknowledged with the WARNING.
	Lost           []int64
	LostSyncWarned int
	// UnackedPresent counts attempts that failed whose row is there anyway: commits
	// whose answer the client never got, which is allowed.
	UnackedPresent int
}

// CheckRows reads the ids of table through conn (the current primary) and compares
// them with attempts.
func CheckRows(ctx context.Context, conn *pgx.Conn, table string, attempts []Attempt) (RowCheck, error) {
	present, err := IDs(ctx, conn, table)
	if err != nil {
		return RowCheck{}, err
	}
	return CompareRows(present, attempts), nil
}

// CompareRows compares the ids present in a table with the attempts that wrote it.
// Bulk attempts (Rows > 1), which write another table, are left to CompareBulk.
func CompareRows(present map[int64]bool, attempts []Attempt) RowCheck {
	var c RowCheck
	for _, a := range attempts {
		if a.Rows > 1 {
			continue
		}
		c.Attempted++
		switch {
		case !a.Acked():
			if present[a.ID] {
				c.UnackedPresent++
			}
			continue
		case a.SyncWarning != "":
			c.SyncWarned++
		}
		c.Acked++
		if !present[a.ID] {
			c.Lost = append(c.Lost, a.ID)
			if a.SyncWarning != "" {
				c.LostSyncWarned++
			}
		}
	}
	slices.Sort(c.Lost)
	return c
}

// BulkCheck compares a bulk table (WriterOptions.BulkTable) with the bulk attempts.
type BulkCheck struct {
	Attempted, Acked int
	// Lost are the IDs of acknowledged transactions not wholly in the table; LostRows
	// counts their missing rows.
	Lost     []int64
	LostRows int
	// Torn are the IDs of transactions only partly in the table, acknowledged or not:
	// a transaction is all or nothing, so any is a broken guarantee.
	Torn []int64
}

// CompareBulk compares the rows per transaction present in a bulk table (txn → count)
// with the attempts; attempts of one row are left to CompareRows.
func CompareBulk(counts map[int64]int, attempts []Attempt) BulkCheck {
	var c BulkCheck
	for _, a := range attempts {
		if a.Rows <= 1 {
			continue
		}
		c.Attempted++
		n := counts[a.ID]
		if n > 0 && n != a.Rows {
			c.Torn = append(c.Torn, a.ID)
		}
		if !a.Acked() {
			continue
		}
		c.Acked++
		if n < a.Rows {
			c.Lost = append(c.Lost, a.ID)
			c.LostRows += a.Rows - n
		}
	}
	slices.Sort(c.Lost)
	slices.Sort(c.Torn)
	return c
}

// Gap is an interval without any acknowledged write.
type Gap struct{ From, To time.Time }

// Duration is the gap's length.
func (g Gap) Duration() time.Duration { return g.To.Sub(g.From) }

// Unavailability is the write unavailability caused by a fault injected at from, when
// the cluster was back to health at to: the longest interval within [from, to] in which
// no write was acknowledged, by any writer. The points compared are from, the time each
// acknowledged attempt's answer arrived (Attempt.End) between them, and to.
//
// Why the longest gap, and not the time to the first acknowledged write after the first
// failure: some faults make writes hang rather than fail (a frozen primary), some
// produce several outages in a row (two faults back to back, a primary that comes back
// and goes again), and the longest gap measures all of them the same way. Its
// resolution is the writers' pace and, for an endpoint that swallows packets, the
// attempt timeout: a writer stuck in an attempt when writes come back sees it only
// when it gives up.
func Unavailability(attempts []Attempt, from, to time.Time) Gap {
	points := []time.Time{from, to}
	for _, a := range attempts {
		if a.Acked() && a.End.After(from) && a.End.Before(to) {
			points = append(points, a.End)
		}
	}
	slices.SortFunc(points, func(a, b time.Time) int { return a.Compare(b) })
	var longest Gap
	for i := 1; i < len(points); i++ {
		if g := (Gap{points[i-1], points[i]}); g.Duration() > longest.Duration() {
			longest = g
		}
	}
	return longest
}

// Percentile returns the q-th quantile (0 ≤ q ≤ 1) of ds by the nearest rank, or 0
// when ds is empty.
func Percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}
