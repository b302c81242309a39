package postgres

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestReadyAncestorSegments(t *testing.T) {
	pgdata := t.TempDir()
	wal := filepath.Join(pgdata, "pg_wal")
	if err := os.MkdirAll(filepath.Join(wal, "archive_status"), 0o700); err != nil {
		t.Fatal(err)
	}
	const segSize = 1 << 20 // initdb --wal-segsize=1: 4096 segments per "log"
	segment := func(name string) {
		f, err := os.Create(filepath.Join(wal, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(segSize); err != nil {
			t.Fatal(err)
		}
	}
	status := func(name, suffix string) {
		if err := os.WriteFile(filepath.Join(wal, "archive_status", name+suffix), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(wal, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Timeline 1 ended where segment 4096+5 starts (1/500000), timeline 2 in the middle
	// of segment 4096+8; this primary runs on timeline 3.
	write("00000002.history", "1\t1/500000\tno recovery target specified\n")
	write("00000003.history", "1\t1/500000\tno recovery target specified\n\n2\t1/880000\tbefore 2026-11-25 12:00:00+00\n")
	write("00000004.history", placeholderMark+" for another promotion\n")
	segment("000000010000000100000002") // archived
	status("000000010000000100000002", ".done")
	segment("000000010000000100000003") // waiting for the archiver
	status("000000010000000100000003", ".ready")
	segment("000000010000000100000004") // replayed whole, its end never received
	segment("000000010000000100000005") // past timeline 1's end: never archived
	segment("000000010000000000000FFF") // the last segment of the first "log"
	segment("000000020000000100000007") // whole, before timeline 2's end
	segment("000000020000000100000008") // across it: PostgreSQL archives it as .partial
	write("000000020000000100000008.partial", "")
	segment("000000030000000100000008") // the current timeline's: PostgreSQL's own
	segment("000000050000000100000009") // a timeline not in this history

	p := &Postgres{PGData: pgdata}
	got, err := p.ReadyAncestorSegments(3)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{"000000010000000000000FFF", "000000010000000100000004", "000000020000000100000007"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readied (-want +got):\n%s", diff)
	}
	entries, err := os.ReadDir(filepath.Join(wal, "archive_status"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	wantFiles := []string{
		"000000010000000000000FFF.ready", "000000010000000100000002.done", "000000010000000100000003.ready",
		"000000010000000100000004.ready", "000000020000000100000007.ready",
	}
	if diff := cmp.Diff(wantFiles, files); diff != "" {
		t.Errorf("archive_status (-want +got):\n%s", diff)
	}
	if again, err := p.ReadyAncestorSegments(3); err != nil || len(again) != 0 {
		t.Errorf("a second pass readied %v (%v)", again, err)
	}
	if none, err := p.ReadyAncestorSegments(1); err != nil || len(none) != 0 {
		t.Errorf("timeline 1 readied %v (%v)", none, err)
	}
}
