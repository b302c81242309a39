package postgres

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseControlData(t *testing.T) {
	out := []byte("pg_control version number:            1300\nDatabase cluster state:               in archive recovery\nLatest checkpoint's TimeLineID:       3\n")
	if diff := cmp.Diff(ControlData{State: "in archive recovery", Timeline: 3}, ParseControlData(out)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestComplaint(t *testing.T) {
	tail := &tailBuffer{max: 1 << 10}
	_, _ = tail.Write([]byte(`2026-11-21 12:00:00.000 GMT [1] LOG:  starting PostgreSQL 15.20
2026-11-21 12:00:00.000 GMT [1] LOG:  invalid value for parameter "shared_buffers": "banana"
2026-11-21 12:00:00.000 GMT [1] FATAL:  configuration file "/pgdata/postgresql.conf" contains errors
`))
	got := (&Process{tail: tail}).Complaint()
	want := `invalid value for parameter "shared_buffers": "banana"; configuration file "/pgdata/postgresql.conf" contains errors`
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	// The answers to clients while it starts do not push the reason out.
	tail = &tailBuffer{max: 1 << 10}
	_, _ = tail.Write([]byte(`2026-11-21 12:00:00.000 GMT [2] FATAL:  backup_label contains data inconsistent with control file
2026-11-21 12:00:00.000 GMT [2] HINT:  This means that the backup is corrupted and you will have to use another backup for recovery.
2026-11-21 12:00:00.010 GMT [3] FATAL:  the database system is starting up
2026-11-21 12:00:00.020 GMT [4] FATAL:  the database system is starting up
2026-11-21 12:00:00.030 GMT [5] FATAL:  the database system is starting up
2026-11-21 12:00:00.040 GMT [1] LOG:  startup process (PID 2) exited with exit code 1
`))
	if got := (&Process{tail: tail}).Complaint(); got != "backup_label contains data inconsistent with control file" {
		t.Errorf("got %q", got)
	}
	small := &tailBuffer{max: 4}
	_, _ = small.Write([]byte("abcdef"))
	if small.String() != "cdef" {
		t.Errorf("tail kept %q", small.String())
	}
}
