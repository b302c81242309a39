package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A larger spec.storage.size expands every instance's claim, including one made later
// from the StatefulSet's template at the old size, where the StorageClass allows it
// (the API server's own admission decides); where it does not, the StorageResized
// condition and an event say so and nothing else changes. No CSI driver runs here: the
// claims' capacity is written as a resizer would.
func TestStorageGrows(t *testing.T) {
	ns := newNamespace(t)
	for name, expand := range map[string]bool{"expandable": true, "fixed": false} {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Provisioner: "example.com/disk",
			AllowVolumeExpansion: ptr.To(expand)}
		create(t, sc)
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), sc) })
	}
	for _, name := range []string{"expandable", "fixed"} {
		create(t, newCluster(ns, name, withStorage("1Gi", ns+"-"+name)))
	}
	claims := func(cluster string, from, to int) {
		t.Helper()
		var sts appsv1.StatefulSet
		testutil.Eventually(t, timeout, func() error { return get(ns, cluster, &sts) })
		for i := from; i < to; i++ {
			pvc := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("data-%s-%d", cluster, i), Namespace: ns, Labels: sts.Spec.VolumeClaimTemplates[0].Labels},
				Spec:       sts.Spec.VolumeClaimTemplates[0].Spec,
			}
			create(t, pvc)
			setCapacity(t, ns, pvc.Name, "1Gi")
		}
	}
	claims("expandable", 0, 3)
	claims("fixed", 0, 3)

	for _, name := range []string{"expandable", "fixed"} {
		if err := update(ns, name, func(c *dbv1.PostgresCluster) { withStorage("2Gi", ns+"-"+name)(c) }); err != nil {
			t.Fatal(err)
		}
	}
	requests := func(name string) string {
		var pvc corev1.PersistentVolumeClaim
		if err := get(ns, name, &pvc); err != nil {
			return err.Error()
		}
		q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		return q.String()
	}
	testutil.Eventually(t, timeout, func() error {
		for i := range 3 {
			if got := requests(fmt.Sprintf("data-expandable-%d", i)); got != "2Gi" {
				return fmt.Errorf("data-expandable-%d requests %s", i, got)
			}
		}
		return condition(ns, "expandable", metav1.ConditionFalse, dbv1.ReasonVolumeExpanding, "data-expandable-0 has 1Gi of 2Gi")
	})
	for i := range 3 {
		setCapacity(t, ns, fmt.Sprintf("data-expandable-%d", i), "2Gi")
	}
	testutil.Eventually(t, timeout, func() error {
		return condition(ns, "expandable", metav1.ConditionTrue, dbv1.ReasonVolumesAtSize, "every volume has 2Gi")
	})

	// The class that does not allow expansion: refused by the API server, said in the
	// condition and an event; the claims are as they were.
	testutil.Eventually(t, timeout, func() error {
		if err := condition(ns, "fixed", metav1.ConditionFalse, dbv1.ReasonVolumeExpansionRefused,
			"the volumes must have 2Gi, but data-fixed-0 requests 1Gi"); err != nil {
			return err
		}
		return event(ns, "fixed", dbv1.ReasonVolumeExpansionRefused, "Expanding data-fixed-0 from 1Gi to 2Gi was refused")
	})
	for i := range 3 {
		if got := requests(fmt.Sprintf("data-fixed-%d", i)); got != "1Gi" {
			t.Errorf("data-fixed-%d requests %s, want 1Gi", i, got)
		}
	}

	// An instance added later: its claim is made from the template (1Gi) and expanded.
	if err := update(ns, "expandable", func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 4 }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		var sts appsv1.StatefulSet
		if err := get(ns, "expandable", &sts); err != nil {
			return err
		}
		if *sts.Spec.Replicas != 4 {
			return fmt.Errorf("StatefulSet replicas %d", *sts.Spec.Replicas)
		}
		if got := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "1Gi" {
			t.Fatalf("the claim template changed to %s: a StatefulSet's template is immutable", got.String())
		}
		return nil
	})
	claims("expandable", 3, 4)
	testutil.Eventually(t, timeout, func() error {
		if got := requests("data-expandable-3"); got != "2Gi" {
			return fmt.Errorf("data-expandable-3 requests %s", got)
		}
		return nil
	})
}

// setCapacity binds claim name with capacity size, as the volume controller and a
// resizer would.
func setCapacity(t *testing.T, ns, name, size string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pvc corev1.PersistentVolumeClaim
		if err := get(ns, name, &pvc); err != nil {
			return err
		}
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
		return k8s.Status().Update(context.Background(), &pvc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// condition is nil when cluster's StorageResized condition has status, reason and a
// message containing msg.
func condition(ns, cluster string, status metav1.ConditionStatus, reason, msg string) error {
	var c dbv1.PostgresCluster
	if err := get(ns, cluster, &c); err != nil {
		return err
	}
	got := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionStorageResized)
	if got == nil || got.Status != status || got.Reason != reason || !strings.Contains(got.Message, msg) {
		return fmt.Errorf("%s: StorageResized %+v, want %s %s containing %q", cluster, got, status, reason, msg)
	}
	return nil
}

// event is nil when cluster has an event of reason whose message contains msg.
func event(ns, cluster, reason, msg string) error {
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		return err
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == cluster && e.Reason == reason && strings.Contains(e.Message, msg) {
			return nil
		}
	}
	return fmt.Errorf("no %s event on %s containing %q", reason, cluster, msg)
}
