package pg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

const upTimeout = 90 * time.Second

// A primary and two replicas come up from nothing and stream: rows written on the
// primary appear on both, and the primary keeps a slot per replica.
func TestPrimaryAndReplicasStream(t *testing.T) {
	c := newCluster(t, 3)
	for _, in := range c.instances {
		in.start()
	}
	p := c.instances[0]
	st := p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	if st.PostgresVersion < 150000 || st.PostgresVersion >= 160000 {
		t.Errorf("postgres version %d, want 15.x", st.PostgresVersion)
	}
	for _, r := range c.instances[1:] {
		r.waitRole(agentapi.RoleReplica, 1, upTimeout)
	}
	if err := p.exec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := p.exec("INSERT INTO t (v) VALUES ('x')"); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range c.instances[1:] {
		r.waitCount("t", 100, 30*time.Second)
	}
	eventually(t, 30*time.Second, func() error {
		st, err := p.status()
		if err != nil {
			return err
		}
		streaming := map[string]bool{}
		for _, r := range st.Replicas {
			streaming[r.Name] = r.State == "streaming"
		}
		if !streaming[c.instances[1].pod] || !streaming[c.instances[2].pod] {
			return errors.New("not both replicas streaming: " + st.Error)
		}
		return nil
	})
	// A replica refuses writes.
	if err := c.instances[1].exec("INSERT INTO t (v) VALUES ('no')"); err == nil {
		t.Error("a replica accepted a write")
	}
}

// kill -9 of the primary (agent and postmaster, like a pod that dies); a replica is
// promoted through the API once the Lease names it, accepts writes, the other replica
// follows the new timeline, and the old primary rejoins through pg_rewind and catches up.
func TestFailoverAndRejoin(t *testing.T) {
	c := newCluster(t, 3)
	for _, in := range c.instances {
		in.start()
	}
	old, next, other := c.instances[0], c.instances[1], c.instances[2]
	old.waitRole(agentapi.RolePrimary, 1, upTimeout)
	next.waitRole(agentapi.RoleReplica, 1, upTimeout)
	other.waitRole(agentapi.RoleReplica, 1, upTimeout)
	if err := old.exec("CREATE TABLE t (id bigserial PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if err := old.exec("INSERT INTO t (v) SELECT 'before' FROM generate_series(1, 50)"); err != nil {
		t.Fatal(err)
	}
	next.waitCount("t", 50, 30*time.Second)
	other.waitCount("t", 50, 30*time.Second)

	old.kill9()
	// Promoting before the Lease names the instance is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := next.api().Promote(ctx); !errors.Is(err, agentapi.ErrConflict) {
		t.Fatalf("promote while the Lease names the old primary: got %v, want a conflict", err)
	}
	c.setLease(next.pod, true)
	start := time.Now()
	if _, err := next.api().Promote(ctx); err != nil {
		t.Fatalf("promote: %v", err)
	}
	next.waitRole(agentapi.RolePrimary, 2, 30*time.Second)
	if err := next.exec("INSERT INTO t (v) SELECT 'after' FROM generate_series(1, 25)"); err != nil {
		t.Fatalf("write on the new primary: %v", err)
	}
	t.Logf("promoted and wrote %s after the promote call", time.Since(start).Round(time.Millisecond))
	other.waitRole(agentapi.RoleReplica, 2, 60*time.Second)
	other.waitCount("t", 75, 30*time.Second)

	// The old primary comes back, rewinds and follows.
	old.start()
	old.waitRole(agentapi.RoleReplica, 2, upTimeout)
	old.waitCount("t", 75, 30*time.Second)
	if err := next.exec("INSERT INTO t (v) VALUES ('later')"); err != nil {
		t.Fatal(err)
	}
	old.waitCount("t", 76, 30*time.Second)
	if err := old.exec("INSERT INTO t (v) VALUES ('no')"); err == nil {
		t.Error("the rejoined old primary accepted a write")
	}
}
