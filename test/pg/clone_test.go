package pg

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// A standby whose clone postgres refuses to start from, at every start, is set aside and
// cloned again, instead of being started again forever (make e2e: "backup_label
// contains data inconsistent with control file" every 30 s for 18 minutes). The clone
// here is what pg_basebackup makes of a server that leaves recovery while it copies it:
// a backup_label "from standby" with the control file of a primary in production.
func TestCloneThatCannotStartIsSetAsideAndClonedAgain(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	p, r := c.instances[0], c.instances[1]
	// A volume with room: the set-aside directory stays once superseded.
	r.onVolume(1 << 30)
	c.startAll()
	p.mustExec("CREATE TABLE t AS SELECT g AS id FROM generate_series(1, 100) g")
	r.waitCount("t", 100, 30*time.Second)
	r.stop()

	// The broken clone, in place of r's data directory.
	if err := os.RemoveAll(r.pgdata); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(PGBin, "pg_basebackup"),
		"-h", filepath.Join(p.dir, "run"), "-p", "5432", "-U", "postgres", "-D", r.pgdata,
		"-X", "stream", "-c", "fast", "--no-manifest").CombinedOutput()
	if err != nil {
		t.Fatalf("pg_basebackup: %v: %s", err, out)
	}
	labelPath := filepath.Join(r.pgdata, "backup_label")
	label, err := os.ReadFile(labelPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(label, []byte("BACKUP FROM: primary")) {
		t.Fatalf("backup_label:\n%s", label)
	}
	mustWrite(t, labelPath, bytes.Replace(label, []byte("BACKUP FROM: primary"), []byte("BACKUP FROM: standby"), 1))
	mustWrite(t, filepath.Join(r.pgdata, "standby.signal"), nil)
	chownR(t, r.pgdata)
	p.mustExec("INSERT INTO t SELECT g FROM generate_series(101, 150) g")

	r.start()
	r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	r.waitCount("t", 150, 30*time.Second)
	if !bytes.Contains(syncWriter(r.log).bytes(), []byte("backup_label contains data inconsistent with control file")) {
		t.Error("postgres never refused the broken clone: the test did not make one")
	}
	// The refused clone is kept aside, reported, and superseded once the new one streams.
	kept := r.waitSupersededAside()
	if !strings.Contains(kept.Reason, "backup_label contains data inconsistent with control file") {
		t.Errorf("the set-aside directory is reported as %+v; want the refusal as its reason", kept)
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(r.pgdata), kept.Name, "backup_label")); err != nil || !bytes.Contains(b, []byte("BACKUP FROM: standby")) {
		t.Errorf("the set-aside directory is not the refused clone: backup_label %q, %v", b, err)
	}
}
