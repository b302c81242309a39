package backup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/instance/backup/store"
)

func TestParseLabel(t *testing.T) {
	var ti tarInspector
	ti.parseLabel("START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\n" +
		"BACKUP METHOD: streamed\nBACKUP FROM: standby\nSTART TIME: 2026-11-21 14:04:00 UTC\nLABEL: pgpilot x\nSTART TIMELINE: 3\n")
	if ti.startLSN != "0/2000028" || ti.startWAL != "000000010000000000000002" || ti.timeline != 3 {
		t.Errorf("parsed %+v", ti)
	}
	if got := endLSN("pg_basebackup: checkpoint completed\npg_basebackup: write-ahead log end point: 0/2000100\n"); got != "0/2000100" {
		t.Errorf("endLSN = %q", got)
	}
}

func TestChoose(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 11, 21, h, 0, 0, 0, time.UTC) }
	infos := []Info{
		{ID: "a", StoppedAt: at(1), EndLSN: "0/1000000"},
		{ID: "b", StoppedAt: at(2), EndLSN: "0/5000000"},
		{ID: "c", StoppedAt: at(3), EndLSN: "1/0"},
	}
	tm := func(h int) *time.Time { v := at(h).Add(30 * time.Minute); return &v }
	for _, tc := range []struct {
		name   string
		id     string
		target Target
		want   string
	}{
		{"newest without a target", "", Target{}, "c"},
		{"newest before a time", "", Target{Time: tm(2)}, "b"},
		{"newest before an LSN", "", Target{LSN: "0/6000000"}, "b"},
		{"an LSN equal to the end", "", Target{LSN: "0/5000000"}, "b"},
		{"named", "a", Target{Time: tm(2)}, "a"},
		{"named but after the target", "c", Target{Time: tm(1)}, ""},
		{"target before every backup", "", Target{Time: tm(0)}, ""},
		{"unknown name", "z", Target{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Choose(infos, tc.id, tc.target)
			if tc.want == "" {
				if !errors.Is(err, ErrNoBackup) {
					t.Fatalf("Choose = %s, %v; want ErrNoBackup", got.ID, err)
				}
				return
			}
			if err != nil || got.ID != tc.want {
				t.Fatalf("Choose = %s, %v; want %s", got.ID, err, tc.want)
			}
		})
	}
	if _, err := Choose(nil, "", Target{}); !errors.Is(err, ErrNoBackup) {
		t.Errorf("an empty store: %v", err)
	}
}

func TestPrunableWAL(t *testing.T) {
	keys := []string{
		"wal/00000001.history.zst", // never pruned
		"wal/00000002.history.zst",
		"wal/000000010000000000000001.zst",
		"wal/000000010000000000000002.00000028.backup.zst",
		"wal/000000010000000000000002.zst",
		"wal/000000010000000000000003.partial.zst",
		"wal/000000020000000000000003.zst", // the oldest backup's segment, on a later timeline
		"wal/0000000200000000000000FF.zst",
		"wal/000000020000000100000000.zst",
		"wal/not-wal.zst",
	}
	got := PrunableWAL(keys, "000000020000000000000003")
	want := []string{
		"wal/000000010000000000000001.zst",
		"wal/000000010000000000000002.00000028.backup.zst",
		"wal/000000010000000000000002.zst",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PrunableWAL (-want +got):\n%s", diff)
	}
	if got := PrunableWAL(keys, ""); got != nil {
		t.Errorf("no oldest backup must prune nothing, got %v", got)
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"my-db-20261121t030000z", "b1", "x.y"} {
		if err := CheckID(id); err != nil {
			t.Errorf("CheckID(%q): %v", id, err)
		}
	}
	for _, id := range []string{"", "../x", "A", "a/b", "-a"} {
		if err := CheckID(id); err == nil {
			t.Errorf("CheckID(%q) accepted it", id)
		}
	}
}

func TestCheckSystem(t *testing.T) {
	st, err := store.New(store.Config{Directory: t.TempDir(), Prefix: "prod/db"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := CheckSystem(ctx, st, "7300000000000000001", "aaaa", nil); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000001", "aaaa", nil); err != nil {
		t.Errorf("the same cluster again: %v", err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000001", "", nil); err != nil {
		t.Errorf("an instance of it from before lineages: %v", err)
	}
	err = CheckSystem(ctx, st, "7300000000000000002", "aaaa", nil)
	if err == nil || !strings.Contains(err.Error(), "another PostgreSQL cluster") || !strings.Contains(err.Error(), "spec.backup.store.path") {
		t.Errorf("another cluster: %v", err)
	}
	err = CheckSystem(ctx, st, "7300000000000000001", "bbbb", nil)
	if err == nil || !strings.Contains(err.Error(), "restored from the same backup") || !strings.Contains(err.Error(), "spec.backup.store.path") {
		t.Errorf("a cluster restored from the same backup: %v", err)
	}
}

// A store written before lineages is taken by the first lineage that archives there.
func TestCheckSystemAdoptsALineage(t *testing.T) {
	st, err := store.New(store.Config{Directory: t.TempDir(), Prefix: "prod/db"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := CheckSystem(ctx, st, "7300000000000000001", "", nil); err != nil {
		t.Fatal(err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000001", "aaaa", nil); err != nil {
		t.Fatalf("the first lineage: %v", err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000001", "bbbb", nil); err == nil {
		t.Error("a second lineage was accepted after the first took the store")
	}
}

func TestLineage(t *testing.T) {
	dir := t.TempDir()
	if l, err := ReadLineage(dir); err != nil || l != "" {
		t.Fatalf("no lineage yet: %q, %v", l, err)
	}
	a, err := NewLineage(dir)
	if err != nil || len(a) != 32 {
		t.Fatalf("NewLineage: %q, %v", a, err)
	}
	if l, err := ReadLineage(dir); err != nil || l != a {
		t.Errorf("ReadLineage = %q, %v; want %q", l, err, a)
	}
	if b, _ := NewLineage(dir); b == a {
		t.Error("a new lineage repeats the old one")
	}
}

// A database pg_upgrade made from the recorded one succeeds it; nothing else does, and
// the old one cannot come back after.
func TestCheckSystemUpgradeSucceeds(t *testing.T) {
	st, err := store.New(store.Config{Directory: t.TempDir(), Prefix: "prod/db"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := CheckSystem(ctx, st, "7300000000000000001", "aaaa", nil); err != nil {
		t.Fatal(err)
	}
	other := &Predecessor{SystemIdentifier: "7300000000000000009", Lineage: "aaaa", Major: "15"}
	if err := CheckSystem(ctx, st, "7300000000000000002", "bbbb", other); err == nil {
		t.Error("an upgrade of another database took the store")
	}
	wrongLineage := &Predecessor{SystemIdentifier: "7300000000000000001", Lineage: "zzzz", Major: "15"}
	if err := CheckSystem(ctx, st, "7300000000000000002", "bbbb", wrongLineage); err == nil {
		t.Error("an upgrade of another lineage of the database took the store")
	}
	from := &Predecessor{SystemIdentifier: "7300000000000000001", Lineage: "aaaa", Major: "15"}
	if err := CheckSystem(ctx, st, "7300000000000000002", "bbbb", from); err != nil {
		t.Fatalf("the upgraded database: %v", err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000002", "bbbb", from); err != nil {
		t.Errorf("the upgraded database again: %v", err)
	}
	if err := CheckSystem(ctx, st, "7300000000000000001", "aaaa", nil); err == nil {
		t.Error("the database that was upgraded archived again after its successor")
	}
}
