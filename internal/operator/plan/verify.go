package plan

import (
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Verify is what the chart renders of spec.backup.verify (docs/backup.md, "Restore
// verification"): a CronJob whose pods run `agent verify-backup` with the cluster's
// image, config.json and backup store, on a volume of the instances' size and class.
type Verify struct {
	CronJob  string `json:"cronJob"`
	Schedule string `json:"schedule"`
	Amcheck  bool   `json:"amcheck"`
	// DeadlineSeconds is spec.backup.verify.timeout: the Job's activeDeadlineSeconds.
	DeadlineSeconds int64 `json:"deadlineSeconds"`
}

// DefaultVerifyTimeout is spec.backup.verify.timeout's default.
const DefaultVerifyTimeout = 6 * time.Hour

// planVerify adds spec.backup.verify to p.
func planVerify(p *Plan, cluster string, b *dbv1.BackupSpec) {
	if b == nil || b.Verify == nil {
		return
	}
	v := b.Verify
	timeout := DefaultVerifyTimeout
	if v.Timeout != nil && v.Timeout.Duration > 0 {
		timeout = v.Timeout.Duration
	}
	p.Verify = &Verify{
		CronJob:         dbv1.NamesOf(cluster).VerifyCronJob(),
		Schedule:        v.Schedule,
		Amcheck:         v.Amcheck == nil || *v.Amcheck,
		DeadlineSeconds: int64(timeout.Seconds()),
	}
}
