package postgres

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPlaceholderHistoryFiles(t *testing.T) {
	pg := &Postgres{PGData: t.TempDir()}
	wal := filepath.Join(pg.PGData, "pg_wal")
	if err := os.Mkdir(wal, 0o700); err != nil {
		t.Fatal(err)
	}
	realHistory := func(id int64) {
		if err := os.WriteFile(HistoryPath(pg.PGData, id), []byte("1\t0/3000000\tno recovery target specified\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	list := func() (all, placeholders []int64) {
		ids, err := pg.HistoryFiles()
		if err != nil {
			t.Fatal(err)
		}
		for id, p := range ids {
			all = append(all, id)
			if p {
				placeholders = append(placeholders, id)
			}
		}
		slices.Sort(all)
		slices.Sort(placeholders)
		return all, placeholders
	}
	newest := func() int64 {
		h, err := pg.HistoryFiles()
		if err != nil {
			t.Fatal(err)
		}
		return h.NewestReal()
	}
	reserve := func(from, next int64) {
		h, err := pg.HistoryFiles()
		if err != nil {
			t.Fatal(err)
		}
		if err := pg.ReserveTimelines(h, from, next); err != nil {
			t.Fatal(err)
		}
	}

	if n := newest(); n != 1 {
		t.Errorf("no history file: newest %d, want 1", n)
	}
	realHistory(2)
	realHistory(4) // 3 is missing: a gap PostgreSQL's search would stop at
	reserve(1, 7)
	all, placeholders := list()
	if !slices.Equal(all, []int64{2, 3, 4, 5, 6}) || !slices.Equal(placeholders, []int64{3, 5, 6}) {
		t.Errorf("reserving 7 from 1: files %v, placeholders %v; want 2-6, placeholders 3 5 6", all, placeholders)
	}
	if n := newest(); n != 4 {
		t.Errorf("newest real: %d, want 4 (placeholders do not count)", n)
	}
	if !IsPlaceholderHistory(HistoryPath(pg.PGData, 5)) || IsPlaceholderHistory(HistoryPath(pg.PGData, 4)) {
		t.Error("IsPlaceholderHistory does not tell a placeholder from a real history file")
	}

	// The promotion did not happen: before the next start the placeholders above the
	// newest real file go, the one in the gap below it stays.
	if err := pg.RemoveUnusedPlaceholders(); err != nil {
		t.Fatal(err)
	}
	if all, _ := list(); !slices.Equal(all, []int64{2, 3, 4}) {
		t.Errorf("after removing the unused placeholders: %v, want 2 3 4", all)
	}
	// It did: the chosen timeline's real file keeps every placeholder below it.
	reserve(4, 7)
	realHistory(7)
	if err := pg.RemoveUnusedPlaceholders(); err != nil {
		t.Fatal(err)
	}
	if all, _ := list(); !slices.Equal(all, []int64{2, 3, 4, 5, 6, 7}) {
		t.Errorf("after a promotion onto 7: %v, want 2-7", all)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(wal, "*.pgpilot-tmp")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
