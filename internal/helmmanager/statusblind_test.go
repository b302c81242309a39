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
