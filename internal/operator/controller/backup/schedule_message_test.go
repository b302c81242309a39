package backup

import (
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

func TestArchiveFailingMessage(t *testing.T) {
	failed := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	arch := &agentapi.ArchiverStatus{Enabled: true, FailedCount: 41, LastFailedWAL: "00000001000000000000002A",
		LastFailedAt: &failed, LastError: "AccessDenied", Pending: 37, PendingBytes: 37 << 24}
	tests := []struct {
		name string
		st   agentapi.Status
		want string
	}{
		{
			name: "filling",
			st:   agentapi.Status{Archiver: arch, VolumeBytes: 10 << 30, VolumeFreeBytes: 1288490189, VolumeFullInSeconds: 1530},
			want: "Archiving WAL 00000001000000000000002A failed 41 times (AccessDenied); 37 segments (592 MiB) wait on the primary's volume, " +
				"1.2 GiB of 10 GiB free; at the last 10 minutes' rate the volume is full in about 26 minutes. " +
				"PostgreSQL stops when it is: fix the store, or give the volume room (expand its PersistentVolumeClaim)",
		},
		{
			name: "not filling, days away",
			st:   agentapi.Status{Archiver: arch, VolumeBytes: 100 << 30, VolumeFreeBytes: 90 << 30, VolumeFullInSeconds: 3 * 86400},
			want: "Archiving WAL 00000001000000000000002A failed 41 times (AccessDenied); 37 segments (592 MiB) wait on the primary's volume, " +
				"90 GiB of 100 GiB free; at the last 10 minutes' rate the volume is full in about 72 hours. " +
				"PostgreSQL stops when it is: fix the store, or give the volume room (expand its PersistentVolumeClaim)",
		},
		{
			name: "no volume figures",
			st:   agentapi.Status{Archiver: &agentapi.ArchiverStatus{FailedCount: 1, LastFailedWAL: "000000010000000000000003", LastFailedAt: &failed, Pending: 1, PendingBytes: 16 << 20}},
			want: "Archiving WAL 000000010000000000000003 failed 1 times (see the primary's log); 1 segments (16 MiB) wait on the primary's volume. " +
				"PostgreSQL stops when it is: fix the store, or give the volume room (expand its PersistentVolumeClaim)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ArchiveFailingMessage(tt.st); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
