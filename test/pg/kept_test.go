package pg

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The agents' side of hibernation and fencing on real PostgreSQL: the Lease keeps an
// instance down. A hibernating primary stops cleanly, its standby receives its final
// WAL, and it keeps the Lease, through a SIGTERM and an agent restart too; resumed, it
// is the same primary on the same timeline, with every row. A fenced standby stops
// and rejoins when unfenced.
func TestLeaseKeepsInstancesDown(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	c.startAll()
	primary, standby := c.instances[0], c.instances[1]
	primary.mustExec("CREATE TABLE t (id int PRIMARY KEY)")
	for i := range 100 {
		primary.mustExec("INSERT INTO t VALUES ($1)", i)
	}
	term := c.lease().Term

	c.setHibernation(primarylease.Stopping, primary.pod, term)
	var final uint64
	testutil.Eventually(t, time.Minute, func() error {
		st, err := primary.status()
		switch {
		case err != nil:
			return err
		case st.Running || st.Handover == nil || !st.Handover.Clean || st.Handover.Term != term:
			return fmt.Errorf("%s: running %v, handover %+v", primary.pod, st.Running, st.Handover)
		}
		final, err = agentapi.ParseLSN(st.Handover.FinalLSN)
		return err
	})
	c.checkHolder(primary.pod, term)
	testutil.Eventually(t, time.Minute, func() error {
		st, err := standby.status()
		if err != nil {
			return err
		}
		if got, _ := agentapi.ParseLSN(st.Position); got < final {
			return fmt.Errorf("%s at %s, the stopped primary's final WAL ends at %s", standby.pod, st.Position, agentapi.FormatLSN(final))
		}
		return nil
	})

	// The pod goes (SIGTERM): the primary keeps the Lease. Its agent started again keeps
	// postgres down.
	primary.stop()
	c.checkHolder(primary.pod, term)
	primary.start()
	primary.staysDown(3 * time.Second)

	c.setHibernation(primarylease.Resuming, primary.pod, term)
	st := primary.waitRole(agentapi.RolePrimary, 1, time.Minute)
	c.checkHolder(primary.pod, term)
	if n, err := primary.count("t"); err != nil || n != 100 {
		t.Fatalf("resumed primary has %d rows (%v), want 100", n, err)
	}
	primary.mustExec("INSERT INTO t VALUES (100)")
	standby.waitCount("t", 101, time.Minute)
	t.Logf("resumed %s on timeline %d", primary.pod, st.Timeline)

	// Fencing the standby stops it; unfenced, it streams again.
	c.setLeaseAnnotation(dbv1.AnnotationFenced, `["`+standby.pod+`"]`)
	testutil.Eventually(t, time.Minute, func() error {
		st, err := standby.status()
		if err != nil {
			return err
		}
		if st.Running {
			return fmt.Errorf("%s is fenced but runs as %s", standby.pod, st.Role)
		}
		return nil
	})
	standby.staysDown(2 * time.Second)
	primary.mustExec("INSERT INTO t VALUES (101)")
	c.setLeaseAnnotation(dbv1.AnnotationFenced, "")
	standby.waitRole(agentapi.RoleReplica, 1, time.Minute)
	standby.waitCount("t", 102, time.Minute)
}

// lease reads the cluster's primary Lease.
func (c *cluster) lease() primarylease.Record {
	c.t.Helper()
	store := primarylease.ClientsetStore{Client: kube, Namespace: c.namespace, Name: dbv1.NamesOf(c.name).PrimaryLease()}
	l, err := store.Get(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return primarylease.Parse(l)
}

// checkHolder fails the test unless the Lease names pod in term.
func (c *cluster) checkHolder(pod string, term int32) {
	c.t.Helper()
	if r := c.lease(); r.Holder != pod || r.Term != term {
		c.t.Fatalf("the Lease names %q in term %d, want %s in term %d", r.Holder, r.Term, pod, term)
	}
}

// setHibernation records a hibernation phase for holder in term, as the failover
// controller does.
func (c *cluster) setHibernation(phase, holder string, term int32) {
	c.t.Helper()
	b, err := json.Marshal(primarylease.Hibernation{Phase: phase, Holder: holder, Term: term})
	if err != nil {
		c.t.Fatal(err)
	}
	c.setLeaseAnnotation(dbv1.AnnotationHibernation, string(b))
}

// staysDown fails the test if the instance's postgres runs at any moment during d
// after its agent first answers (within a minute).
func (in *instance) staysDown(d time.Duration) {
	in.c.t.Helper()
	var until time.Time
	for giveUp := time.Now().Add(time.Minute); until.IsZero() || time.Now().Before(until); {
		st, err := in.status()
		switch {
		case err == nil && st.Running:
			in.c.t.Fatalf("%s runs postgres (%s) while the Lease keeps it down", in.pod, st.Role)
		case err == nil && until.IsZero():
			until = time.Now().Add(d)
		case err != nil && time.Now().After(giveUp):
			in.c.t.Fatalf("%s's agent does not answer: %v", in.pod, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A primary with nobody to hand over to stops cleanly at its SIGTERM, as fast as
// PostgreSQL's fast shutdown goes: its commit gate drains, so that the gate's walsender
// ends the shutdown. A gate that merely withheld kept the walsender waiting for three
// quarters of the shutdown timeout, then the agent escalated to an immediate shutdown,
// which leaves crash recovery to the next start.
func TestSingleInstanceStopsCleanly(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	c.startAll()
	p := c.instances[0]
	p.mustExec("CREATE TABLE t (id int)")
	start := time.Now()
	p.stop()
	took := time.Since(start)
	cd, err := (&postgres.Postgres{BinDir: PGBin, PGData: p.pgdata}).ControlData(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the only instance stopped in %s; its control file says %q", took.Round(time.Millisecond), cd.State)
	if !cd.ShutDown() {
		t.Errorf("the only instance's stop left its data directory %q, not shut down cleanly", cd.State)
	}
	if log := p.log.String(); strings.Contains(log, "escalated") {
		t.Errorf("the only instance's fast shutdown did not end by itself: the agent escalated it (%s)", lastLine(log, "escalated"))
	}
	c.checkHolder(p.pod, c.lease().Term)
}

// lastLine is the last line of log that contains s.
func lastLine(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}
