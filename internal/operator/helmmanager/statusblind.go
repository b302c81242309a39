package helmmanager

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// statusBlind is mgr as a Helm reconciler of gvk sees it: an update of a custom
// resource of gvk that changed its status only (and so neither the chart's values
// nor anything the reconciler acts on) reaches none of its watches.
//
// helm-operator-plugins watches its custom resource with no predicate but a label
// selector, so every status write enqueued a whole reconcile: the chart rendered, a
// dry-run upgrade, and a Get of every object of the release. pgpilot's controllers
// write a cluster's status at every change of its instances; during a failover that
// was a reconcile every 400 ms, on the same CPUs as the promotion. A spec change
// still reconciles at once, a change of labels, annotations, finalizers, owners or
// the deletion timestamp too, and the reconcile period repairs drift as before.
//
// The same cache counts, in r, the changes its watches see to the objects the
// reconciler rendered (releases.changed), before the reconciler's handlers see them.
func statusBlind(mgr ctrl.Manager, gvk schema.GroupVersionKind, r *releases) ctrl.Manager {
	return statusBlindManager{Manager: mgr, cache: statusBlindCache{Cache: mgr.GetCache(), gvk: gvk, releases: r}}
}

type statusBlindManager struct {
	ctrl.Manager
	cache cache.Cache
}

func (m statusBlindManager) GetCache() cache.Cache { return m.cache }

type statusBlindCache struct {
	cache.Cache
	gvk      schema.GroupVersionKind
	releases *releases
}

func (c statusBlindCache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	i, err := c.Cache.GetInformer(ctx, obj, opts...)
	if err != nil {
		return i, err
	}
	// The reconciler watches its kind as unstructured, which carries its kind.
	if obj.GetObjectKind().GroupVersionKind() != c.gvk {
		return changeCountingInformer{Informer: i, releases: c.releases, kind: c.gvk.GroupKind()}, nil
	}
	return statusBlindInformer{Informer: i}, nil
}

type statusBlindInformer struct {
	cache.Informer
}

func (i statusBlindInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.Informer.AddEventHandler(statusBlindHandler{h})
}

func (i statusBlindInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, resync time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.Informer.AddEventHandlerWithResyncPeriod(statusBlindHandler{h}, resync)
}

type statusBlindHandler struct {
	toolscache.ResourceEventHandler
}

func (h statusBlindHandler) OnUpdate(oldObj, newObj any) {
	if (statusOnly(oldObj, newObj) || addsUninstallFinalizer(oldObj, newObj)) && !releasesScaleDown(oldObj, newObj) && !movesHibernation(oldObj, newObj) {
		return
	}
	h.ResourceEventHandler.OnUpdate(oldObj, newObj)
}

// uninstallFinalizer is the finalizer helm-operator-plugins v0.8.0's reconciler adds to
// every custom resource before its first install.
const uninstallFinalizer = "uninstall-helm-release"

// addsUninstallFinalizer reports whether an update only added the reconciler's own
// finalizer: the reconciler adds it at the start of a resource's first reconcile and
// goes on to install the release in that same reconcile, so the update's event only
// queued a second, full reconcile of every new cluster (a thousand of them behind a
// wave of a thousand clusters created at once, make bench-scale). A change made by
// anyone else between the reconciler's read and its update makes the update fail
// instead (its resourceVersion), and the retry reconciles.
func addsUninstallFinalizer(oldObj, newObj any) bool {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 || o.GetResourceVersion() == n.GetResourceVersion() || n.GetDeletionTimestamp() != nil {
		return false
	}
	was, is := o.GetFinalizers(), n.GetFinalizers()
	if len(is) != len(was)+1 || is[len(is)-1] != uninstallFinalizer || !equality.Semantic.DeepEqual(append(append([]string{}, was...), uninstallFinalizer), is) {
		return false
	}
	return o.GetGeneration() == n.GetGeneration() &&
		equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) &&
		equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) &&
		equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences())
}

// releasesScaleDown reports whether an update moved status.currentPrimary away from an
// instance a scale-down removes, or named a primary again while a scale-down waits
// (more instances than spec.replicas): the plan kept those pods (plan.Replicas) and may
// now let them go. The controller's scale-down switchover also clears an annotation, which
// reconciles anyway; a failover does not.
func releasesScaleDown(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*unstructured.Unstructured)
	n, ok2 := newObj.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return false
	}
	was, _, _ := unstructured.NestedString(o.Object, "status", "currentPrimary")
	now, _, _ := unstructured.NestedString(n.Object, "status", "currentPrimary")
	replicas, found, _ := unstructured.NestedInt64(n.Object, "spec", "replicas")
	if was == now || !found {
		return false
	}
	if ordinal, ok := dbv1.NamesOf(n.GetName()).Ordinal(was); ok {
		return int64(ordinal) >= replicas
	}
	instances, _, _ := unstructured.NestedSlice(n.Object, "status", "instances")
	return was == "" && int64(len(instances)) > replicas
}

// movesHibernation reports whether an update changed the Hibernated condition's status
// or reason: once a stopped cluster's primary has stopped (True, Stopped), the plan
// renders no pod (plan.Stopped), and it must not wait for the reconcile period.
func movesHibernation(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*unstructured.Unstructured)
	n, ok2 := newObj.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return false
	}
	was, is := hibernatedCondition(o), hibernatedCondition(n)
	return was != is
}

// hibernatedCondition is the Hibernated condition's status and reason, "" when absent.
func hibernatedCondition(u *unstructured.Unstructured) string {
	conditions, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conditions {
		m, ok := c.(map[string]any)
		if ok && m["type"] == dbv1.ConditionHibernated {
			return fmt.Sprint(m["status"], "/", m["reason"])
		}
	}
	return ""
}

// statusOnly reports whether an update changed nothing of the object but its status
// (and the metadata every write changes). A resync (same resourceVersion) is not an
// update of the status: it passes.
func statusOnly(oldObj, newObj any) bool {
	o, ok1 := oldObj.(client.Object)
	n, ok2 := newObj.(client.Object)
	if !ok1 || !ok2 || o.GetResourceVersion() == n.GetResourceVersion() {
		return false
	}
	return o.GetGeneration() == n.GetGeneration() &&
		equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) &&
		equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) &&
		equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) &&
		equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences()) &&
		equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp())
}

// changeCountingInformer is an informer of objects the reconciler renders, whose
// handlers first count each change to an object in releases.
type changeCountingInformer struct {
	cache.Informer
	releases *releases
	kind     schema.GroupKind
}

func (i changeCountingInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.Informer.AddEventHandler(changeCountingHandler{ResourceEventHandler: h, releases: i.releases, kind: i.kind})
}

func (i changeCountingInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, resync time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.Informer.AddEventHandlerWithResyncPeriod(changeCountingHandler{ResourceEventHandler: h, releases: i.releases, kind: i.kind}, resync)
}

type changeCountingHandler struct {
	toolscache.ResourceEventHandler
	releases *releases
	kind     schema.GroupKind
}

// OnUpdate counts an update of anything but the status, which the dependent watches'
// predicate reconciles on.
func (h changeCountingHandler) OnUpdate(oldObj, newObj any) {
	if key, ok := changeOf(h.kind, newObj); ok && !sameButStatus(oldObj, newObj) {
		h.releases.changed(key)
	}
	h.ResourceEventHandler.OnUpdate(oldObj, newObj)
}

// OnDelete counts a deletion (a tombstone's object too).
func (h changeCountingHandler) OnDelete(obj any) {
	o := obj
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		o = tombstone.Obj
	}
	if key, ok := changeOf(h.kind, o); ok {
		h.releases.changed(key)
	}
	h.ResourceEventHandler.OnDelete(obj)
}

// sameButStatus reports whether two versions of an object differ in their status and
// resourceVersion only: the test of helm-operator-plugins' dependent predicate. An object
// it cannot compare differs.
func sameButStatus(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*unstructured.Unstructured)
	n, ok2 := newObj.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return false
	}
	o, n = o.DeepCopy(), n.DeepCopy()
	delete(o.Object, "status")
	delete(n.Object, "status")
	o.SetResourceVersion("")
	n.SetResourceVersion("")
	return equality.Semantic.DeepEqual(o.Object, n.Object)
}
