package pg

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/verification"
)

// agent verify-backup, as the verification Job's pod runs it (as the postgres OS user,
// with the cluster's config.json and store credentials): the newest backup restores
// into a throw-away PostgreSQL, opens, every database answers and pg_amcheck finds
// nothing; the result is written as JSON. A backup whose stored data was damaged fails,
// saying so, and leaves no scratch data behind.
func TestVerifyBackup(t *testing.T) {
	t.Parallel()
	s := newS3Store(t)
	c := backedUpCluster(t, s, 2)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	p.mustExec("CREATE TABLE t (id bigint PRIMARY KEY, pad text)")
	p.mustExec("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
	r.waitCount("t", 20000, 30*time.Second)
	if b := r.takeBackup("first"); b.Phase != agentapi.BackupCompleted {
		t.Fatalf("backup: %+v", b)
	}

	res, out := runVerify(t, c, "")
	if !res.Succeeded || res.Backup != "first" || !res.Amcheck || res.Databases < 3 || res.Relations == 0 {
		t.Fatalf("verify-backup: %+v\n%s", res, out)
	}
	t.Logf("verified: %s", res.Message)

	// Damage the stored data: one byte in the middle of the object.
	st := s.open(t, c.name)
	ctx := context.Background()
	key := "base/first/data.tar.zst"
	rc, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := st.Put(ctx, key, strings.NewReader(string(data))); err != nil {
		t.Fatal(err)
	}
	res, out = runVerify(t, c, "first")
	if res.Succeeded || !strings.Contains(res.Message, "is corrupt: its digest is") {
		t.Errorf("verify-backup of a damaged backup: %+v\n%s", res, out)
	}
	if _, err := os.Stat(filepath.Join(c.dir, "verify", "pgdata")); !os.IsNotExist(err) {
		t.Errorf("the scratch data directory is left behind: %v", err)
	}
}

// runVerify runs agent verify-backup for cluster c and returns its result and output.
func runVerify(t *testing.T, c *cluster, id string) (verification.Result, string) {
	t.Helper()
	dir := filepath.Join(c.dir, "verify")
	mustMkdir(t, dir, 0o700)
	chownR(t, dir)
	result := filepath.Join(dir, "result.json")
	_ = os.Remove(result)
	args := []string{"verify-backup", "--config", filepath.Join(c.dir, "config.json"), "--dir", dir,
		"--bin-dir", PGBin, "--result", result, "--timeout", "3m"}
	if id != "" {
		args = append(args, "--backup", id)
	}
	cmd := exec.Command(agentBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: pgUID, Gid: pgGID}}
	out, runErr := cmd.CombinedOutput()
	b, err := os.ReadFile(result)
	if err != nil {
		t.Fatalf("no result (%v): %v\n%s", runErr, err, out)
	}
	var res verification.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("result %s: %v", b, err)
	}
	if (runErr == nil) != res.Succeeded {
		t.Errorf("exit %v with a result that says succeeded=%v", runErr, res.Succeeded)
	}
	if len(b) > 4096 {
		t.Errorf("the result is %d bytes, more than a termination message holds", len(b))
	}
	return res, string(out)
}
