//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The README's example (with the local image's version) comes up: three ready pods,
// non-root under the restricted Pod Security Standard (the namespace enforces it, so a
// pod that broke it would not be admitted), a primary with two standbys streaming from
// it; a write through -rw is read through -ro, and -ro refuses writes. Then it scales
// 3 → 5 → 2: new instances stream, scale-down removes the highest ordinals and keeps
// their volumes.
func TestExample(t *testing.T) {
	d := newDB(t, 3)
	start := time.Now()
	pgc := d.waitHealthy(3, 10*time.Minute)
	t.Logf("Healthy %s after creation; primary %s", time.Since(start).Round(time.Second), pgc.Status.CurrentPrimary)

	roles := map[string]int{}
	for _, p := range d.pods() {
		roles[p.Labels[dbv1.LabelRole]]++
		sc := p.Spec.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("pod %s does not run as non-root", p.Name)
		}
		for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			csc := c.SecurityContext
			if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
				csc.Capabilities == nil || len(csc.Capabilities.Drop) != 1 || csc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("pod %s container %s: security context %+v, want no privilege escalation and all capabilities dropped", p.Name, c.Name, csc)
			}
		}
	}
	if roles[dbv1.RolePrimary] != 1 || roles[dbv1.RoleReplica] != 2 {
		t.Errorf("roles %v, want one primary and two replicas", roles)
	}
	d.waitStreaming(2, time.Minute)

	w := d.newTable()
	w.insert(100)
	d.waitCount("ro", "t", 100, time.Minute)
	// A standby refuses the write itself (read_only_sql_transaction), not the connection.
	var pgErr *pgconn.PgError
	if err := d.exec("ro", "INSERT INTO t DEFAULT VALUES"); !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Errorf("a write through -ro: %v, want SQLSTATE 25006", err)
	}

	for _, n := range []int32{5, 2} {
		d.update(func(c *dbv1.PostgresCluster) { c.Spec.Replicas = n })
		start := time.Now()
		d.waitHealthy(n, 10*time.Minute)
		d.waitStreaming(int(n)-1, 2*time.Minute)
		t.Logf("scaled to %d: Healthy and streaming %s after the change", n, time.Since(start).Round(time.Second))
		w.check()
	}
	var pvcs corev1.PersistentVolumeClaimList
	if err := k8s.List(context.Background(), &pvcs, client.InNamespace(d.ns)); err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != 5 {
		t.Errorf("%d volume claims after scaling 3 → 5 → 2, want 5 (scale-down keeps volumes)", len(pvcs.Items))
	}
}

// The seed's example as written, version "16", on the local node, which has images for
// Debian's majors only: the cluster says which image cannot be pulled and how to fix it,
// not only "0 of 3 instances are ready".
func TestExampleWithoutAnImageSaysSo(t *testing.T) {
	if version == "16" {
		t.Fatalf("E2E_PG_MAJOR is 16, which this test needs to have no image on the local node")
	}
	d := newDB(t, 3, func(c *dbv1.PostgresCluster) { c.Spec.Version = "16" })
	testutil.Eventually(t, 4*time.Minute, func() error {
		pgc := d.cluster()
		ready := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionReady)
		if ready == nil || ready.Reason != dbv1.ReasonImageUnavailable {
			return fmt.Errorf("phase %s, Ready %+v; want the reason %s", pgc.Status.Phase, ready, dbv1.ReasonImageUnavailable)
		}
		if !strings.Contains(ready.Message, "my-db-0 cannot pull the image") || !strings.Contains(ready.Message, `spec.version "16"`) {
			return fmt.Errorf("Ready says %q; want the pod, its image and spec.version named", ready.Message)
		}
		t.Logf("Ready: %s", ready.Message)
		return nil
	})
}

// Deleting a cluster removes its pods and keeps its volumes.
func TestDeletedClusterKeepsItsVolumes(t *testing.T) {
	d := newDB(t, 1)
	d.waitHealthy(1, 10*time.Minute)
	pgc := d.cluster()
	if err := k8s.Delete(context.Background(), &pgc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, func() error {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: d.name}, &pgc)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the cluster is still there: %v", err)
		}
		if pods := d.pods(); len(pods) > 0 {
			return fmt.Errorf("%d pods left", len(pods))
		}
		return nil
	})
	var pvcs corev1.PersistentVolumeClaimList
	if err := k8s.List(context.Background(), &pvcs, client.InNamespace(d.ns)); err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != 1 {
		t.Errorf("%d volume claims after deleting the cluster, want 1", len(pvcs.Items))
	}
}
