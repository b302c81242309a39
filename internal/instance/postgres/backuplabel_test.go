package postgres

import (
	"os"
	"path/filepath"
	"testing"
)

const streamedLabel = "START WAL LOCATION: 0/4000028 (file 000000010000000000000004)\n" +
	"CHECKPOINT LOCATION: 0/4000060\nBACKUP METHOD: streamed\nBACKUP FROM: standby\n" +
	"START TIME: 2026-11-24 10:00:00 UTC\nLABEL: pg_basebackup base backup\nSTART TIMELINE: 1\n"

func TestReadBackupLabel(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "backup_label"), []byte(streamedLabel), 0o600); err != nil {
		t.Fatal(err)
	}
	label, err := ReadBackupLabel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if label["BACKUP FROM"] != "standby" || label["BACKUP METHOD"] != "streamed" || label["START TIMELINE"] != "1" {
		t.Errorf("backup_label read as %v", label)
	}
	if _, err := ReadBackupLabel(t.TempDir()); err == nil {
		t.Error("a directory without backup_label read without an error")
	}
}
