package pg

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A standby is cloned only from a primary out of recovery. The Lease names a standby
// whose agent has not promoted it yet (its agent stopped, as on a loaded node; a
// cluster's first primary restoring from a backup is in recovery the same way) when a
// new instance would clone from it: the new instance waits, and once the holder is
// promoted it clones from it and streams on the new timeline. A clone taken from the
// server in recovery used to be accepted: one copied while that server left recovery
// never starts ("backup_label contains data inconsistent with control file"; make e2e,
// TestScheduledBackupRestores). Its backup_label (backup_label.old once started) says
// which it was.
func TestStandbyClonesOnlyFromAPrimaryOutOfRecovery(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	p, next, late := c.instances[0], c.instances[1], c.instances[2]
	p.start()
	next.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	next.waitRole(agentapi.RoleReplica, 1, upTimeout)
	p.mustExec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
	p.mustExec("INSERT INTO t (v) SELECT 'before' FROM generate_series(1, 50)")
	next.waitCount("t", 50, 30*time.Second)

	// next's agent stops before it sees the Lease name it: its postgres stays a standby.
	if err := syscall.Kill(next.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(next.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // before the cluster's cleanup stops it
	p.kill9()
	c.setLease(next.pod, true)
	late.start()
	// Until late would have cloned: it waits for next to leave recovery, or it cloned
	// next already and runs as a standby.
	var early agentapi.Status
	testutil.Eventually(t, 2*time.Minute, func() error {
		if bytes.Contains(syncWriter(late.log).bytes(), []byte("Waiting for the primary to leave recovery")) {
			return nil
		}
		st, err := late.status()
		if err != nil {
			return err
		}
		if st.Role == agentapi.RoleReplica {
			early = st
			return nil
		}
		return fmt.Errorf("%s is %s: neither waiting for %s to leave recovery nor cloned (%q)", late.pod, st.Role, next.pod, st.Error)
	})
	if early.Role != "" {
		t.Errorf("%s cloned %s while it was in recovery, and runs as a standby on timeline %d", late.pod, next.pod, early.Timeline)
	}

	resume()
	next.waitRole(agentapi.RolePrimary, 2, upTimeout)
	next.mustExec("INSERT INTO t (v) SELECT 'after' FROM generate_series(1, 5)")
	late.waitRole(agentapi.RoleReplica, 2, upTimeout)
	late.waitCount("t", 55, 30*time.Second)
	label, err := os.ReadFile(filepath.Join(late.pgdata, "backup_label.old"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(label, []byte("BACKUP FROM: primary")) {
		t.Errorf("%s's clone was not taken from a primary: its backup_label says\n%s", late.pod, label)
	}
}
