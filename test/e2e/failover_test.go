//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// One synchronous 3-instance cluster goes through what a primary lives through on a
// real node, in turn: its pod is deleted; its postgres keeps dying; a switchover; a
// rolling update. After each, a primary takes writes through -rw, every acknowledged
// row is still there, and the cluster is Healthy with the old primary back as a replica.
func TestPrimaryFailures(t *testing.T) {
	d := newDB(t, 3, func(c *dbv1.PostgresCluster) { c.Spec.PostgreSQL.SynchronousReplicas = 1 })
	d.waitHealthy(3, 10*time.Minute)
	d.waitStreaming(2, time.Minute)
	w := d.newTable()
	w.insert(100)

	// recovered waits for three Healthy instances with old among the replicas, and checks
	// the rows.
	recovered := func(old string) {
		t.Helper()
		d.waitReplica(old, 3, 5*time.Minute)
		d.waitStreaming(2, 2*time.Minute)
		w.insert(10)
		w.check()
	}

	t.Log("deleting the primary's pod")
	old := d.deletePrimaryPod(w)
	recovered(old)

	t.Log("killing the primary's postmaster every time it starts")
	old = d.cluster().Status.CurrentPrimary
	killed := time.Now()
	kills := d.killPostgresUntilFailover(old, 2*time.Minute)
	took := w.untilWritable(killed, 2*time.Minute)
	now := d.cluster().Status.CurrentPrimary
	t.Logf("postgres killed %d times: %s took writes through -rw %s after the first kill", kills, now, took.Round(10*time.Millisecond))
	recovered(old)

	old = d.cluster().Status.CurrentPrimary
	target := d.otherThan(old)
	t.Logf("switching over from %s to %s", old, target)
	asked := time.Now()
	d.update(func(c *dbv1.PostgresCluster) { c.Annotations = map[string]string{dbv1.AnnotationSwitchoverTo: target} })
	testutil.Eventually(t, 2*time.Minute, func() error {
		pgc := d.cluster()
		if _, pending := pgc.Annotations[dbv1.AnnotationSwitchoverTo]; pending || pgc.Status.CurrentPrimary != target {
			return fmt.Errorf("primary %s, annotations %v", pgc.Status.CurrentPrimary, pgc.Annotations)
		}
		return nil
	})
	took = w.untilWritable(asked, time.Minute)
	t.Logf("switchover: %s took writes through -rw %s after it was asked", target, took.Round(10*time.Millisecond))
	recovered(old)

	d.leaseLostWithAnEmptyInstanceZero(w)

	d.rollingUpdate(w)
}

// leaseLostWithAnEmptyInstanceZero deletes the primary Lease the moment instance 0, a
// replica, comes back with an empty volume (its pod and PersistentVolumeClaim deleted):
// a lost record at the worst time, when the instance a new cluster would start from
// holds nothing. The Lease is rebuilt naming the same primary in the same term,
// instance 0 is cloned from it (not made a database of its own), and every
// acknowledged row is there.
func (d *db) leaseLostWithAnEmptyInstanceZero(w *writes) {
	t := d.t
	t.Helper()
	ctx := context.Background()
	pgc := d.cluster()
	primary, zero := pgc.Status.CurrentPrimary, pgc.InstanceName(0)
	if primary == zero {
		t.Fatalf("the primary is %s; this step needs another", zero)
	}
	system := d.systemIdentifier(primary)
	oldZero := d.pod(zero)
	var oldClaim corev1.PersistentVolumeClaim
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: pgc.VolumeClaimName(0)}, &oldClaim); err != nil {
		t.Fatal(err)
	}
	t.Logf("emptying %s's volume and deleting the primary Lease; %s is the primary", zero, primary)
	if err := k8s.Delete(ctx, &oldClaim); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, &oldZero); err != nil {
		t.Fatal(err)
	}
	// The StatefulSet makes the pod again, and with it a new, empty claim. A pod made
	// while the old claim was still terminating would keep it: it is deleted again.
	testutil.Eventually(t, 3*time.Minute, func() error {
		var pod corev1.Pod
		var claim corev1.PersistentVolumeClaim
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: zero}, &pod); err != nil {
			return err
		}
		if pod.UID == oldZero.UID || pod.DeletionTimestamp != nil {
			return fmt.Errorf("%s is not made again yet", zero)
		}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: pgc.VolumeClaimName(0)}, &claim)
		switch {
		case err != nil:
			return err
		case claim.UID == oldClaim.UID && pod.CreationTimestamp.Time.Before(time.Now().Add(-10*time.Second)):
			if err := k8s.Delete(ctx, &pod); err != nil {
				return err
			}
			return fmt.Errorf("%s was made while its old claim was terminating: deleted again", zero)
		case claim.UID == oldClaim.UID:
			return fmt.Errorf("the claim of %s is still the old one", zero)
		}
		return nil
	})
	deleted := time.Now()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: pgc.PrimaryLeaseName()}}
	if err := k8s.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(lease), lease); err != nil {
			return err
		}
		if rec := primarylease.Parse(lease); rec.Holder != primary || lease.CreationTimestamp.Time.Before(deleted.Add(-time.Second)) {
			return fmt.Errorf("the Lease made %s names %q, want %s", lease.CreationTimestamp, rec.Holder, primary)
		}
		return nil
	})
	t.Logf("the Lease was rebuilt naming %s %s after it was deleted", primary, time.Since(deleted).Round(10*time.Millisecond))
	d.waitReplica(zero, 3, 5*time.Minute)
	if now := d.cluster().Status.CurrentPrimary; now != primary {
		t.Errorf("the primary moved from %s to %s", primary, now)
	}
	if now := d.systemIdentifier(zero); now != system {
		t.Errorf("%s holds database %q, want the cluster's %s", zero, now, system)
	}
	d.waitStreaming(2, 2*time.Minute)
	w.insert(10)
	w.check()
}

// deletePrimaryPod deletes the primary's pod, waits until another instance takes writes
// through -rw, logs how long that took, and returns the old primary.
func (d *db) deletePrimaryPod(w *writes) string {
	d.t.Helper()
	old := d.cluster().Status.CurrentPrimary
	deleted := time.Now()
	if err := k8s.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: old}}); err != nil {
		d.t.Fatal(err)
	}
	took := w.untilWritable(deleted, 2*time.Minute)
	now := d.waitNewPrimary(old, time.Minute)
	d.t.Logf("pod deleted: %s took writes through -rw %s after %s's pod was deleted", now, took.Round(10*time.Millisecond), old)
	return old
}

// waitReplica waits until the cluster is Healthy with n ready instances, name a replica.
func (d *db) waitReplica(name string, n int32, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		pgc := d.cluster()
		if pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != n {
			return fmt.Errorf("phase %s, %d ready", pgc.Status.Phase, pgc.Status.ReadyInstances)
		}
		p, err := d.getPod(name)
		if err != nil {
			return err
		}
		if role := p.Labels[dbv1.LabelRole]; role != dbv1.RoleReplica {
			return fmt.Errorf("%s is %q, not yet a replica", name, role)
		}
		return nil
	})
}

// waitNewPrimary waits until the cluster's primary is another pod than old, and returns it.
func (d *db) waitNewPrimary(old string, timeout time.Duration) string {
	d.t.Helper()
	var now string
	testutil.Eventually(d.t, timeout, func() error {
		now = d.cluster().Status.CurrentPrimary
		if now == old || now == "" {
			return fmt.Errorf("the primary is still %q", now)
		}
		return nil
	})
	return now
}

// killPostgresUntilFailover sends SIGKILL to the postmaster of pod each time its agent
// starts one, as a postgres that crashes at every start would, until the cluster has
// another primary. A single crash is repaired in place (the agent restarts postgres at
// once, faster than a failover); a primary that cannot stay up is replaced. Returns how
// many postmasters it killed.
func (d *db) killPostgresUntilFailover(name string, timeout time.Duration) int {
	d.t.Helper()
	pod := d.pod(name)
	kills := 0
	deadline := time.Now().Add(timeout)
	for {
		pids, err := postmasters(pod)
		if err != nil {
			d.t.Fatal(err)
		}
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				kills++
			}
		}
		if now := d.cluster().Status.CurrentPrimary; now != name && now != "" {
			if kills == 0 {
				d.t.Fatalf("the primary moved from %s to %s before any postmaster was killed", name, now)
			}
			return kills
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("after %s and %d kills %s is still the primary", timeout, kills, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rolledOut is nil once every instance of uids (name to UID before the update) was
// restarted and is what updated accepts, and the cluster is Healthy with all of them
// ready. It appends the pods it sees restarted to order, in the order it sees them.
func (d *db) rolledOut(uids map[string]string, order *[]string, updated func(corev1.Pod) error) error {
	pods := d.pods()
	for _, p := range pods {
		if uids[p.Name] != string(p.UID) && !slices.Contains(*order, p.Name) {
			*order = append(*order, p.Name)
		}
	}
	for _, p := range pods {
		if err := updated(p); err != nil {
			return fmt.Errorf("%w; restarted so far: %v", err, *order)
		}
	}
	if len(*order) != len(uids) {
		return fmt.Errorf("restarted so far: %v", *order)
	}
	pgc := d.cluster()
	if pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != int32(len(uids)) {
		return fmt.Errorf("phase %s, %d ready", pgc.Status.Phase, pgc.Status.ReadyInstances)
	}
	return nil
}

// rollingUpdate changes the instances' resources and checks that pgpilot restarts the
// pods one at a time, the replicas first and the primary (handing its role over) last,
// that the settings tuned from the resources follow (docs/tuning.md) with no restart
// beyond the rolling update's, and that a writer running throughout loses nothing.
func (d *db) rollingUpdate(w *writes) {
	t := d.t
	t.Helper()
	primary := d.cluster().Status.CurrentPrimary
	uids := map[string]string{}
	for _, p := range d.pods() {
		uids[p.Name] = string(p.UID)
	}
	if err := d.exec("rw", "CREATE TABLE rolled (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	writer := testutil.StartWriter(d.rwTarget, testutil.WriterOptions{Table: "rolled", FirstID: 1,
		Interval: 5 * time.Millisecond, PerStatementInterval: 100 * time.Millisecond})
	t.Logf("changing the resources: a rolling update with %s as the primary", primary)
	changed := time.Now()
	d.update(func(c *dbv1.PostgresCluster) {
		c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("256Mi")}
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	})
	var order []string
	seen := map[string]map[string]bool{} // every UID each pod had
	start := time.Now()
	testutil.Eventually(t, 10*time.Minute, func() error {
		var sts appsv1.StatefulSet
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &sts); err != nil {
			return err
		}
		return d.rolledOut(uids, &order, func(p corev1.Pod) error {
			if seen[p.Name] == nil {
				seen[p.Name] = map[string]bool{uids[p.Name]: true}
			}
			seen[p.Name][string(p.UID)] = true
			if p.Labels[appsv1.ControllerRevisionHashLabelKey] != sts.Status.UpdateRevision {
				return fmt.Errorf("pod %s runs revision %s, not %s", p.Name, p.Labels[appsv1.ControllerRevisionHashLabelKey], sts.Status.UpdateRevision)
			}
			return nil
		})
	})
	t.Logf("rolling update: pods restarted in the order %v in %s", order, time.Since(start).Round(time.Second))
	if order[2] != primary {
		t.Errorf("restart order %v: the primary %s was not last", order, primary)
	}
	if now := d.cluster().Status.CurrentPrimary; now == primary {
		t.Errorf("%s is still the primary after the rolling update: it did not hand its role over", now)
	}
	for _, p := range d.pods() {
		var requested resource.Quantity
		for _, c := range p.Spec.Containers {
			if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
				requested = q
			}
		}
		if requested.Cmp(resource.MustParse("50m")) != 0 {
			t.Errorf("pod %s requests cpu %s after the rolling update, want 50m", p.Name, requested.String())
		}
	}
	d.waitStreaming(2, 2*time.Minute)

	// Retuned by the rolling update itself: a quarter of the 1Gi limit, every instance
	// started with it, and nothing left for the restart controller to do.
	for _, p := range d.pods() {
		st, err := d.agentStatus(p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.PendingRestart) > 0 {
			t.Errorf("%s: settings still wait for a restart after the rolling update: %+v", p.Name, st.PendingRestart)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	var sharedBuffers string
	err = conn.QueryRow(ctx, "SHOW shared_buffers").Scan(&sharedBuffers)
	conn.Close(context.Background())
	if err != nil || sharedBuffers != "256MB" {
		t.Errorf("the primary runs with shared_buffers %s (%v), want 256MB: a quarter of the 1Gi limit", sharedBuffers, err)
	}
	time.Sleep(time.Second)
	attempts := writer.Stop()
	for pod, all := range seen {
		if len(all) != 2 {
			t.Errorf("%s ran as %d pods during the update, want 2: restarted once", pod, len(all))
		}
	}
	// The rolling update's own restarts have the same reason; the restart controller's
	// say "in place to apply" the settings, and it moves a primary by its own reason.
	for _, e := range d.events(dbv1.ReasonRestartingInstance) {
		if strings.Contains(e.Message, "to apply") {
			t.Errorf("the restart controller restarted an instance (%q): the rolling update should have applied the retuned settings", e.Message)
		}
	}
	if d.hasEvent(dbv1.ReasonSwitchingOverForRestart) {
		t.Error("the restart controller switched over: the rolling update should have applied the retuned settings")
	}
	check := d.checkRows("rolled", attempts)
	gap := testutil.Unavailability(attempts, changed, time.Now())
	t.Logf("rolling update with a writer: %d of %d writes acknowledged, longest gap %s", check.Acked, check.Attempted, gap.Duration().Round(time.Millisecond))
	if len(check.Lost) > 0 {
		t.Errorf("%d of %d acknowledged writes lost during the rolling update: ids %v", len(check.Lost), check.Acked, check.Lost)
	}
	d.waitStreaming(2, 2*time.Minute)
	w.insert(10)
	w.check()
}
