package helmmanager

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestStatusOnly(t *testing.T) {
	base := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "db.example.com/v1", "kind": "PostgresCluster",
			"spec":   map[string]any{"replicas": int64(3)},
			"status": map[string]any{"phase": "Healthy"},
		}}
		u.SetName("db")
		u.SetGeneration(2)
		u.SetResourceVersion("10")
		u.SetLabels(map[string]string{"team": "a"})
		u.SetFinalizers([]string{"uninstall-helm-release"})
		return u
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		change func(u *unstructured.Unstructured)
		want   bool
	}{
		{"status written", func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"phase": "Degraded"} }, true},
		{"resync, nothing written", func(u *unstructured.Unstructured) { u.SetResourceVersion("10") }, false},
		{"spec changed", func(u *unstructured.Unstructured) { u.SetGeneration(3) }, false},
		{"label changed", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"team": "b"}) }, false},
		{"annotation added", func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{"x": "y"}) }, false},
		{"finalizer removed", func(u *unstructured.Unstructured) { u.SetFinalizers(nil) }, false},
		{"deleted", func(u *unstructured.Unstructured) { u.SetDeletionTimestamp(&now) }, false},
		{"owner added", func(u *unstructured.Unstructured) {
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "o", UID: "1"}})
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, next := base(), base()
			next.SetResourceVersion("11")
			tc.change(next)
			if got := statusOnly(old, next); got != tc.want {
				t.Errorf("statusOnly = %v, want %v", got, tc.want)
			}
		})
	}
}

// A status write reaches the Helm reconciler when the primary left an instance a
// scale-down removes: the plan kept its pod until then.
func TestReleasesScaleDown(t *testing.T) {
	cluster := func(replicas int64, primary string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"spec": map[string]any{"replicas": replicas},
			"status": map[string]any{"currentPrimary": primary, "instances": []any{
				map[string]any{"name": "db-0"}, map[string]any{"name": "db-1"}, map[string]any{"name": "db-2"},
			}},
		}}
		u.SetName("db")
		return u
	}
	for _, tc := range []struct {
		name     string
		old, new *unstructured.Unstructured
		want     bool
	}{
		{"the primary left a removed instance", cluster(1, "db-2"), cluster(1, "db-0"), true},
		{"the primary left a removed instance, failover under way", cluster(2, "db-2"), cluster(2, ""), true},
		{"a primary again while a scale-down waits", cluster(2, ""), cluster(2, "db-1"), true},
		{"a primary again, no scale-down", cluster(3, ""), cluster(3, "db-1"), false},
		{"the primary stays", cluster(3, "db-2"), cluster(3, "db-0"), false},
		{"no change of primary", cluster(1, "db-2"), cluster(1, "db-2"), false},
		{"another cluster's name", cluster(1, "other-2"), cluster(1, "db-0"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := releasesScaleDown(tc.old, tc.new); got != tc.want {
				t.Errorf("releasesScaleDown = %v, want %v", got, tc.want)
			}
		})
	}
}

// A status write reaches the Helm reconciler when the Hibernated condition moves: a
// stopped cluster's pods go once its primary stopped.
func TestMovesHibernation(t *testing.T) {
	cluster := func(conditions ...map[string]any) *unstructured.Unstructured {
		list := []any{map[string]any{"type": "Deployed", "status": "True"}}
		for _, c := range conditions {
			list = append(list, c)
		}
		return &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"conditions": list}}}
	}
	hibernated := func(status, reason string) map[string]any {
		return map[string]any{"type": "Hibernated", "status": status, "reason": reason, "message": "m"}
	}
	for _, tc := range []struct {
		name     string
		old, new *unstructured.Unstructured
		want     bool
	}{
		{"the primary stopped", cluster(hibernated("False", "Stopping")), cluster(hibernated("True", "Stopped")), true},
		{"asked to stop", cluster(), cluster(hibernated("False", "Stopping")), true},
		{"resuming", cluster(hibernated("True", "Stopped")), cluster(hibernated("False", "Resuming")), true},
		{"only the message changed", cluster(hibernated("False", "Stopping")), cluster(hibernated("False", "Stopping")), false},
		{"never stopped", cluster(), cluster(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := movesHibernation(tc.old, tc.new); got != tc.want {
				t.Errorf("movesHibernation = %v, want %v", got, tc.want)
			}
		})
	}
}

// The reconciler's own finalizer, added as it starts a first install, does not queue a
// second reconcile; any other change with it does.
func TestAddsUninstallFinalizer(t *testing.T) {
	base := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "db.example.com/v1", "kind": "PostgresCluster"}}
		u.SetName("db")
		u.SetGeneration(1)
		u.SetResourceVersion("10")
		u.SetFinalizers([]string{"other"})
		return u
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		change func(u *unstructured.Unstructured)
		want   bool
	}{
		{"finalizer added", func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"other", uninstallFinalizer}) }, true},
		{"another finalizer added", func(u *unstructured.Unstructured) { u.SetFinalizers([]string{"other", "x"}) }, false},
		{"finalizer added with a spec change", func(u *unstructured.Unstructured) {
			u.SetFinalizers([]string{"other", uninstallFinalizer})
			u.SetGeneration(2)
		}, false},
		{"finalizer added with a label", func(u *unstructured.Unstructured) {
			u.SetFinalizers([]string{"other", uninstallFinalizer})
			u.SetLabels(map[string]string{"a": "b"})
		}, false},
		{"finalizer added while deleted", func(u *unstructured.Unstructured) {
			u.SetFinalizers([]string{"other", uninstallFinalizer})
			u.SetDeletionTimestamp(&now)
		}, false},
		{"nothing but the status", func(*unstructured.Unstructured) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, next := base(), base()
			next.SetResourceVersion("11")
			tc.change(next)
			if got := addsUninstallFinalizer(old, next); got != tc.want {
				t.Errorf("addsUninstallFinalizer = %v, want %v", got, tc.want)
			}
		})
	}
}
