package pg

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// setUpdateRevision does what the StatefulSet controller does when the instance
// template changes: a new update revision, which pods created from now on carry.
func (c *cluster) setUpdateRevision(rev string) {
	c.t.Helper()
	c.mu.Lock()
	c.revision = rev
	c.mu.Unlock()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sts appsv1.StatefulSet
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &sts); err != nil {
			return err
		}
		sts.Status.UpdateRevision, sts.Status.CurrentRevision = rev, rev
		sts.Status.Replicas = *sts.Spec.Replicas
		return k8s.Status().Update(context.Background(), &sts)
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

// A new instance template reaches every pod one at a time: the replicas first, then the
// primary, whose agent hands its role over as it stops to the most advanced standby (an
// updated one by then); no write is lost and writes work throughout but for the
// handover's moment.
func TestRollingUpdateReplicasFirstPrimaryLast(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 3)
	c.setUpdateRevision("rev-1")
	startOperated(t, c)
	if err := c.writeThroughRW("CREATE TABLE t (id bigserial PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if err := c.writeThroughRW("INSERT INTO t SELECT FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}

	c.setUpdateRevision("rev-2")
	testutil.Eventually(t, 3*time.Minute, func() error {
		c.mu.Lock()
		n := len(c.restarts)
		c.mu.Unlock()
		if n < 3 {
			return fmt.Errorf("%d of 3 pods restarted", n)
		}
		for _, in := range c.instances {
			if st, err := in.status(); err != nil || !st.Ready {
				return fmt.Errorf("%s is not ready: %v", in.pod, err)
			}
		}
		if c.holder() == "" {
			return fmt.Errorf("the primary Lease names no holder")
		}
		return nil
	})
	c.mu.Lock()
	restarts := append([]restart(nil), c.restarts...)
	c.mu.Unlock()
	want := []string{c.name + "-2", c.name + "-1", c.name + "-0"}
	if len(restarts) != 3 {
		t.Fatalf("restarts %+v, want each pod once", restarts)
	}
	for i, r := range restarts {
		if r.pod != want[i] {
			t.Errorf("restart %d was %s, want %s (replicas first, highest ordinal first, the primary last)", i, r.pod, want[i])
		}
		if last := i == len(restarts)-1; (r.pod == r.primary) != last {
			t.Errorf("%s was restarted while %s was the primary; want only the last restart to be the primary's own", r.pod, r.primary)
		}
	}
	if h := c.holder(); h != c.name+"-1" && h != c.name+"-2" {
		t.Errorf("the primary after the update is %q, want an updated replica", h)
	}
	c.instances[0].waitRole(agentapi.RoleReplica, 2, time.Minute)
	if err := c.writeThroughRW("INSERT INTO t DEFAULT VALUES"); err != nil {
		t.Fatal(err)
	}
	for _, in := range c.instances {
		in.waitCount("t", 101, 30*time.Second)
	}
}
