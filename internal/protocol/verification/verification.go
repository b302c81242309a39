// Package verification is what a restore verification (`agent verify-backup`, in the
// verification Job's pod) tells the operator: its Result, written as JSON to the pod's
// termination message.
package verification

import "time"

// Result is what a verification found. It is written as JSON to the pod's termination
// message, where the operator reads it: keep it well under 4 KiB.
type Result struct {
	// Succeeded is true when the backup restored, PostgreSQL opened it and every check
	// passed.
	Succeeded bool `json:"succeeded"`
	// Backup is the backup verified; BackupStoppedAt when it was taken.
	Backup          string     `json:"backup,omitempty"`
	BackupStoppedAt *time.Time `json:"backupStoppedAt,omitempty"`
	StartedAt       time.Time  `json:"startedAt"`
	FinishedAt      time.Time  `json:"finishedAt"`
	// DataBytes is the restored data directory's size (the backup's tar).
	DataBytes int64 `json:"dataBytes,omitempty"`
	// RestoreSeconds is the restore (download, digest, pg_verifybackup); RecoverySeconds
	// PostgreSQL's start and replay to a consistent point; CheckSeconds the checks.
	RestoreSeconds  float64 `json:"restoreSeconds,omitempty"`
	RecoverySeconds float64 `json:"recoverySeconds,omitempty"`
	CheckSeconds    float64 `json:"checkSeconds,omitempty"`
	// Databases is how many databases accepted a connection; Relations how many
	// relations they hold.
	Databases int   `json:"databases,omitempty"`
	Relations int64 `json:"relations,omitempty"`
	// Amcheck says whether pg_amcheck ran (and passed, when Succeeded).
	Amcheck bool `json:"amcheck,omitempty"`
	// Message says what failed, or sums up what passed.
	Message string `json:"message"`
}

// MaxMessage is the most a termination message holds (the kubelet cuts the rest).
const MaxMessage = 4096
