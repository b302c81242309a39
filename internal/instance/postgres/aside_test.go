package postgres

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeDataDir(t *testing.T, pgdata, content string) {
	t.Helper()
	if err := os.MkdirAll(pgdata, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pgdata, "PG_VERSION"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A set-aside directory keeps its content and reason; put back, it is the data
// directory again, without the reason.
func TestSetAsideAndPutBack(t *testing.T) {
	p := &Postgres{PGData: filepath.Join(t.TempDir(), "pgdata")}
	writeDataDir(t, p.PGData, "15")
	at := time.Date(2026, 11, 24, 14, 30, 5, 0, time.UTC)
	path, err := p.SetAside("pg_rewind failed: different systems", at)
	if err != nil {
		t.Fatal(err)
	}
	if want := p.PGData + ".set-aside-20261124T143005Z"; path != want {
		t.Errorf("set aside as %s, want %s", path, want)
	}
	if _, err := os.Stat(p.PGData); !os.IsNotExist(err) {
		t.Errorf("the data directory is still there: %v", err)
	}
	list, err := p.Asides()
	if err != nil || len(list) != 1 {
		t.Fatalf("asides: %+v, %v; want one", list, err)
	}
	if a := list[0]; a.Reason != "pg_rewind failed: different systems" || !a.At.Equal(at) || a.Superseded {
		t.Errorf("aside %+v", a)
	}
	if err := p.PutBack(path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(p.PGData, "PG_VERSION")); err != nil || string(b) != "15" {
		t.Errorf("put back: PG_VERSION %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(p.PGData, asideReason)); !os.IsNotExist(err) {
		t.Errorf("the reason file stayed in the data directory put back: %v", err)
	}
}

// Only superseded directories are ever removed, oldest first, and only while the
// volume has less free space than wanted; a pending one stays whatever the space.
func TestReclaimRemovesOnlySupersededOldestFirst(t *testing.T) {
	p := &Postgres{PGData: filepath.Join(t.TempDir(), "pgdata")}
	base := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	for i := range 3 {
		writeDataDir(t, p.PGData, "15")
		if _, err := p.SetAside("test", base.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := p.Asides()
	if err != nil || len(list) != 3 {
		t.Fatalf("asides: %d, %v", len(list), err)
	}
	// The first two were superseded by a verified clone; the third is pending.
	marked, err := p.Supersede(list[:2], base)
	if err != nil || len(marked) != 2 {
		t.Fatalf("supersede: %v, %v", marked, err)
	}
	// Enough free space: nothing goes.
	if removed, err := p.Reclaim(list, 0); err != nil || len(removed) != 0 {
		t.Errorf("reclaim with room: removed %v, %v", removed, err)
	}
	// No amount of space is enough: every superseded one goes, the pending one stays.
	removed, err := p.Reclaim(list, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 || removed[0] != "pgdata.set-aside-20261124T100000Z" || removed[1] != "pgdata.set-aside-20261124T110000Z" {
		t.Errorf("removed %v, want the two superseded ones, oldest first", removed)
	}
	left, _ := p.Asides()
	if len(left) != 1 || left[0].Superseded || filepath.Base(left[0].Path) != "pgdata.set-aside-20261124T120000Z" {
		t.Errorf("left %+v, want only the pending one", left)
	}
}
