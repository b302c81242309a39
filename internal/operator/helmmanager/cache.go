package helmmanager

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// helmReleaseLabel is the label Helm's Secrets storage driver puts on every release
// Secret it writes: owner=helm.
var helmReleaseLabel = labels.SelectorFromSet(labels.Set{"owner": "helm"})

// wholeKinds are the kinds the Helm manager caches whole: the custom resources it
// reconciles (watches.yaml), and the PostgresBackups the plan watches for restores.
var wholeKinds = []schema.GroupVersionKind{
	dbv1.GroupVersion.WithKind("PostgresCluster"),
	dbv1.GroupVersion.WithKind("PostgresBackup"),
}

// CacheOptions limit the Helm manager's informers to what it acts on. The reconciler
// watches every Secret (for its release storage) and every kind of a release (to revert
// drift), and controller-runtime caches each watched kind whole: every Secret,
// ConfigMap, Service, Role... of the cluster would be held in memory and readable by
// the process. With these options it holds the custom resources it reconciles and the
// PostgresBackups whole, of Secrets only Helm's release Secrets (label owner=helm), and of
// every other kind only the objects labelled with a cluster (dbv1.LabelCluster), which
// every object the chart renders is (internal/tools/chart's TestLabels).
//
// No object is cached with its managed fields, and release Secrets with their metadata
// only (releaseSecretMeta). Besides the memory, the managed fields would make every
// status write of a rendered object (the StatefulSet controller's, at every pod
// change) a change the reconciler's dependent watch acts on: its predicate ignores
// status and resourceVersion, not the timestamp of the status writer's managed fields,
// so each one cost a full reconcile (a render, a dry-run upgrade, a read of every object
// of the release).
func CacheOptions() cache.Options {
	labelled, err := labels.NewRequirement(dbv1.LabelCluster, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant label key cannot be invalid
	}
	byObject := map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: helmReleaseLabel, Transform: releaseSecretMeta},
	}
	for _, gvk := range wholeKinds {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		byObject[u] = cache.ByObject{Label: labels.Everything()}
	}
	return cache.Options{
		DefaultLabelSelector: labels.NewSelector().Add(*labelled),
		ByObject:             byObject,
		DefaultTransform:     cache.TransformStripManagedFields(),
	}
}

// releaseSecretMeta keeps of a release Secret what the reconciler's watch of it reads:
// its metadata, without the managed fields. Helm's storage driver reads and writes the
// release itself through a client of its own, never the cache, so the cache holds none
// of the release (about 85 KB a revision, three revisions a cluster: 255 MB at 1,000
// clusters).
func releaseSecretMeta(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	s.Data, s.StringData, s.ManagedFields = nil, nil, nil
	return s, nil
}

// checkCached returns an error when the cache of CacheOptions would hide the custom
// resources of gvk that carry no cluster label: a kind a watches.yaml entry reconciles
// must be one of wholeKinds.
func checkCached(gvk schema.GroupVersionKind) error {
	for _, k := range wholeKinds {
		if k == gvk {
			return nil
		}
	}
	return fmt.Errorf("watches.yaml reconciles %s, which helmmanager.CacheOptions does not cache whole: add it to wholeKinds", gvk)
}
