package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

var namespaceSeq atomic.Int32

// newNamespace creates a namespace of its own for one test. It enforces the restricted
// Pod Security Standard, so the instance pods that startPods creates from the chart's
// StatefulSet template must pass it.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", namespaceSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	if len(name) > 60 {
		name = strings.TrimRight(name[:60], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return name
}

type clusterOption func(*dbv1.PostgresCluster)

func newCluster(ns, name string, opts ...clusterOption) *dbv1.PostgresCluster {
	c := &dbv1.PostgresCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       dbv1.PostgresClusterSpec{Replicas: 3, Version: "16"},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

func withStorage(size, class string) clusterOption {
	return func(c *dbv1.PostgresCluster) {
		q := resource.MustParse(size)
		c.Spec.Storage.Size = &q
		if class != "" {
			c.Spec.Storage.StorageClassName = &class
		}
	}
}

func withMonitoring() clusterOption {
	return func(c *dbv1.PostgresCluster) { c.Spec.Monitoring.Enabled = true }
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// applyYAML creates the object a YAML document describes, as kubectl create would.
func applyYAML(t *testing.T, ns string, doc []byte) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatal(err)
	}
	u.SetNamespace(ns)
	if err := k8s.Create(context.Background(), u); err != nil {
		t.Fatalf("creating %s: %v", u.GetName(), err)
	}
	return u
}

// update re-reads the cluster, changes it and writes it, retrying when the operator
// wrote in between (it adds a finalizer and writes status concurrently).
// busyObject is how update retries a write that conflicts: a cluster just created is
// written by the Helm manager and every controller within its first second, and
// retry.DefaultRetry's five tries in about 50 ms all conflicted then (a flaky
// TestScheduledBackupsFireAtTheirTick).
var busyObject = wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Cap: time.Second}

func update(ns, name string, change func(*dbv1.PostgresCluster)) error {
	return retry.RetryOnConflict(busyObject, func() error {
		var c dbv1.PostgresCluster
		if err := get(ns, name, &c); err != nil {
			return err
		}
		change(&c)
		return k8s.Update(context.Background(), &c)
	})
}

// waitReplicas waits until the StatefulSet ns/name, read into sts, asks for want replicas.
func waitReplicas(t *testing.T, ns, name string, sts *appsv1.StatefulSet, want int32) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, name, sts); err != nil {
			return err
		}
		if *sts.Spec.Replicas != want {
			return fmt.Errorf("StatefulSet replicas %d, want %d", *sts.Spec.Replicas, want)
		}
		return nil
	})
}

func get(ns, name string, obj client.Object) error {
	return k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj)
}

// startPods does what the StatefulSet controller and kubelet would: it creates the
// StatefulSet's pods from its template and reports them Ready (envtest runs neither).
func startPods(t *testing.T, sts *appsv1.StatefulSet) {
	t.Helper()
	for i := range int(*sts.Spec.Replicas) {
		name := fmt.Sprintf("%s-%d", sts.Name, i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: sts.Namespace,
				Labels: sts.Spec.Template.Labels,
			},
			Spec: *sts.Spec.Template.Spec.DeepCopy(),
		}
		for _, claim := range sts.Spec.VolumeClaimTemplates {
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
				Name: claim.Name,
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
					ClaimName: claim.Name + "-" + name,
				}},
			})
		}
		pod.Spec.NodeName = "node-a"
		create(t, pod)
		setReady(t, sts.Namespace, name, true)
	}
}

// setReady sets a pod's Ready condition as the kubelet would from its readiness probe.
func setReady(t *testing.T, ns, name string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	// The controller labels pods concurrently: retry on conflict, as a kubelet would.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pod corev1.Pod
		if err := get(ns, name, &pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		return k8s.Status().Update(context.Background(), &pod)
	})
	if err != nil {
		t.Fatal(err)
	}
}
