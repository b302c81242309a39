package helmmanager

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestCheckCached(t *testing.T) {
	tests := []struct {
		gvk schema.GroupVersionKind
		ok  bool
	}{
		{dbv1.GroupVersion.WithKind("PostgresCluster"), true},
		{dbv1.GroupVersion.WithKind("PostgresBackup"), true},
		{dbv1.GroupVersion.WithKind("PostgresPooler"), false},
		{schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "PostgresCluster"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.gvk.String(), func(t *testing.T) {
			if err := checkCached(tt.gvk); (err == nil) != tt.ok {
				t.Errorf("checkCached = %v, want ok %t", err, tt.ok)
			}
		})
	}
}

func TestCachedReleaseSecretKeepsNoRelease(t *testing.T) {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.db.v1", Labels: map[string]string{"owner": "helm"},
			OwnerReferences: []metav1.OwnerReference{{Name: "db"}}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}}},
		Data: map[string][]byte{"release": []byte("H4sI...")},
	}
	got, err := releaseSecretMeta(s)
	if err != nil {
		t.Fatal(err)
	}
	cached := got.(*corev1.Secret)
	if cached.Data != nil || cached.ManagedFields != nil {
		t.Errorf("cached release Secret keeps data %v, managed fields %v", cached.Data, cached.ManagedFields)
	}
	if len(cached.OwnerReferences) != 1 || cached.Labels["owner"] != "helm" {
		t.Errorf("cached release Secret lost what the watch reads: %+v", cached.ObjectMeta)
	}
}

func TestResyncSlotsSpreadThePeriod(t *testing.T) {
	s := newSlots(10 * time.Minute)
	for i := range 1000 {
		s.add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%10), Name: fmt.Sprintf("db-%d", i)}})
	}
	start := time.Unix(1_800_000_000, 0)
	seen, busiest := 0, 0
	for sec := range 600 {
		n := len(s.due(start.Add(time.Duration(sec) * time.Second)))
		seen += n
		busiest = max(busiest, n)
	}
	if seen != 1000 {
		t.Errorf("%d resources resynced in a period, want each of the 1000 once", seen)
	}
	// 1000 over 600 s is 1.7 a second; a hash puts a few more in some seconds.
	if busiest > 10 {
		t.Errorf("%d resources resynced in the same second", busiest)
	}
	s.remove(types.NamespacedName{Namespace: "ns-0", Name: "db-0"})
	seen = 0
	for sec := range 600 {
		seen += len(s.due(start.Add(time.Duration(sec) * time.Second)))
	}
	if seen != 999 {
		t.Errorf("%d resynced after a deletion, want 999", seen)
	}
}

func TestRenderedDigestKeepsWhatTheDependentWatchReads(t *testing.T) {
	statefulSet := func(replicas int64, ready int64, rv string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": "StatefulSet",
			"metadata": map[string]any{
				"name": "db", "namespace": "ns", "resourceVersion": rv,
				"labels":          map[string]any{dbv1.LabelCluster: "db"},
				"ownerReferences": []any{map[string]any{"apiVersion": "db.example.com/v1", "kind": "PostgresCluster", "name": "db", "uid": "u1", "controller": true}},
				"managedFields":   []any{map[string]any{"manager": "helm"}},
			},
			"spec":   map[string]any{"replicas": replicas, "template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "postgres"}}}}},
			"status": map[string]any{"readyReplicas": ready},
		}}
	}
	cached := func(u *unstructured.Unstructured) *unstructured.Unstructured {
		t.Helper()
		got, err := renderedDigest(u)
		if err != nil {
			t.Fatal(err)
		}
		return got.(*unstructured.Unstructured)
	}
	// What the dependent predicate compares: everything but status and resourceVersion.
	compared := func(u *unstructured.Unstructured) map[string]any {
		c := u.DeepCopy()
		delete(c.Object, "status")
		c.SetResourceVersion("")
		return c.Object
	}

	base := cached(statefulSet(3, 3, "1"))
	if _, ok := base.Object["spec"]; ok {
		t.Errorf("cached object keeps its spec: %v", base.Object)
	}
	if base.GetManagedFields() != nil {
		t.Error("cached object keeps its managed fields")
	}
	if refs := base.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != "db" || base.GetLabels()[dbv1.LabelCluster] != "db" {
		t.Errorf("cached object lost its owner or labels: %v", base.Object["metadata"])
	}
	if !reflect.DeepEqual(compared(base), compared(cached(statefulSet(3, 1, "2")))) {
		t.Error("a status-only update looks like a change")
	}
	if reflect.DeepEqual(compared(base), compared(cached(statefulSet(2, 3, "3")))) {
		t.Error("a spec change looks like no change")
	}
	if again := cached(statefulSet(3, 3, "4")); again.Object[digestField] != base.Object[digestField] {
		t.Error("the same content digests differently")
	}
}

func TestResyncGivesWayToABusyQueue(t *testing.T) {
	s := newSlots(time.Second) // one slot: every resource is due every second
	for i := range 3 {
		s.add(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("db-%d", i)}})
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	s.enqueue(q, time.Unix(1_800_000_000, 0))
	if q.Len() != 3 {
		t.Fatalf("idle queue: %d queued, want the 3 resources due", q.Len())
	}
	for i := range resyncYieldsAt {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "other", Name: fmt.Sprintf("new-%d", i)}})
	}
	before := q.Len()
	// The three are still queued (a queue holds a key once); take them out first.
	for range before {
		item, _ := q.Get()
		q.Done(item)
		if item.Namespace == "other" {
			q.Add(item)
		}
	}
	s.enqueue(q, time.Unix(1_800_000_001, 0))
	if q.Len() != resyncYieldsAt {
		t.Errorf("busy queue: %d queued, want the resync to give way (%d)", q.Len(), resyncYieldsAt)
	}
}
