package clusterpods

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestCheck(t *testing.T) {
	cluster := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "a"}}
	pod := func(ns string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a-0", Labels: labels}}
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		ok   bool
	}{
		{"the cluster's instance", pod("db", map[string]string{dbv1.LabelCluster: "a"}), true},
		{"another cluster's instance", pod("db", map[string]string{dbv1.LabelCluster: "b"}), false},
		{"no cluster label", pod("db", map[string]string{"app": "a"}), false},
		{"no labels", pod("db", nil), false},
		{"a cluster of the same name elsewhere", pod("other", map[string]string{dbv1.LabelCluster: "a"}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Check(cluster, tt.pod); (err == nil) != tt.ok {
				t.Errorf("Check = %v, want ok %t", err, tt.ok)
			}
		})
	}
}
