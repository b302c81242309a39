package controller

import (
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestCachedPodKeepsWhatControllersRead(t *testing.T) {
	limits := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "db-0", Labels: map[string]string{"role": "primary"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: corev1.PodSpec{NodeName: "node-a",
			Containers: []corev1.Container{{Name: "postgres", Image: "postgres:16", Resources: corev1.ResourceRequirements{Limits: limits},
				Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}},
			Volumes: []corev1.Volume{{Name: "data"}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.1", Phase: corev1.PodRunning},
	}
	got, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := got.(*corev1.Pod)
	if s.Spec.NodeName != "node-a" || len(s.Spec.Containers) != 1 || s.Spec.Containers[0].Name != "postgres" ||
		!s.Spec.Containers[0].Resources.Limits.Memory().Equal(limits[corev1.ResourceMemory]) || s.Status.PodIP != "10.0.0.1" || s.Labels["role"] != "primary" {
		t.Errorf("the cached pod lost what a controller reads: %+v", s)
	}
	if len(s.Spec.Volumes) > 0 || len(s.Spec.Containers[0].Env) > 0 || len(s.ManagedFields) > 0 {
		t.Errorf("the cached pod keeps what no controller reads: %+v", s.Spec)
	}
}

func TestCachedStatefulSetKeepsReplicasAndStatus(t *testing.T) {
	sts := &appsv1.StatefulSet{
		Spec:   appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres"}}}}},
		Status: appsv1.StatefulSetStatus{UpdateRevision: "r2"},
	}
	got, err := slimStatefulSet(sts)
	if err != nil {
		t.Fatal(err)
	}
	s := got.(*appsv1.StatefulSet)
	if *s.Spec.Replicas != 3 || s.Status.UpdateRevision != "r2" || len(s.Spec.Template.Spec.Containers) > 0 {
		t.Errorf("cached StatefulSet: %+v", s)
	}
}

// Every kind the cache is told about is one a standby warms: a kind added to the cache
// options for a new watch and not to watched would be listed by a new leader only after
// it took over.
func TestStandbysWarmEveryCachedKind(t *testing.T) {
	warm := map[string]bool{}
	for _, o := range watched {
		warm[fmt.Sprintf("%T", o)] = true
	}
	for o := range CacheOptions().ByObject {
		if kind := fmt.Sprintf("%T", o); !warm[kind] {
			t.Errorf("%s is cached for the controllers but not warmed in standby replicas (watched)", kind)
		}
	}
}
