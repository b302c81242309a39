package helmmanager

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
// No object is cached with its managed fields, release Secrets with their metadata
// only (releaseSecretMeta), and the rendered objects with their metadata and a digest of
// the rest (renderedDigest). Besides the memory, the managed fields would make every
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
		byObject[u] = cache.ByObject{Label: labels.Everything(), Transform: cache.TransformStripManagedFields()}
	}
	return cache.Options{
		DefaultLabelSelector: labels.NewSelector().Add(*labelled),
		ByObject:             byObject,
		DefaultTransform:     renderedDigest,
	}
}

// digestField is where renderedDigest keeps the digest of what it dropped; no kind has a
// top-level field of that name.
const digestField = "pgpilotContentDigest"

// renderedDigest keeps of a rendered object (the reconciler's dependent watches, which
// decode every object as unstructured: at 1,000 clusters 136 MB of maps, most of the
// manager's heap) its identity, its metadata less the managed fields, and a digest of
// the rest less its status. What reads these objects reads no more than that:
//   - the dependent watch's handler, the owner references (or the annotations);
//   - its predicate, which reconciles on an update unless only the status and the
//     resourceVersion changed: the digest changes whenever anything else does;
//   - nothing else in the manager: the reconciler reads the rendered objects through
//     Helm's own client, the translator through the API reader.
//
// Typed objects and the custom resources (wholeKinds) are not digested.
func renderedDigest(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return cache.TransformStripManagedFields()(obj)
	}
	content := make(map[string]any, len(u.Object))
	for k, v := range u.Object {
		switch k {
		case "apiVersion", "kind", "metadata", "status", digestField:
		default:
			content[k] = v
		}
	}
	sum, err := digest(content)
	if err != nil {
		return nil, err
	}
	u.SetManagedFields(nil)
	slim := map[string]any{"apiVersion": u.Object["apiVersion"], "kind": u.Object["kind"], "metadata": u.Object["metadata"]}
	if sum != "" {
		slim[digestField] = sum
	}
	u.Object = slim
	return u, nil
}

// digest is a SHA-256 of content's JSON (encoding/json writes map keys sorted), "" for
// no content.
func digest(content map[string]any) (string, error) {
	if len(content) == 0 {
		return "", nil
	}
	b, err := json.Marshal(content)
	if err != nil {
		return "", fmt.Errorf("digesting a cached object: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
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
