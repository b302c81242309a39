package helmmanager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	sdkhandler "github.com/operator-framework/operator-lib/handler"
	"github.com/prometheus/client_golang/prometheus"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// trustFor is how long a release is taken to be what its values render, and its objects
// to be as rendered, without asking the API server again. Within it a reconcile of a
// release whose values have not changed and whose objects no watch saw change costs the
// read of its release; past it the reconcile renders and reads back every object as it
// always did. The bound is for what no value and no watch shows: a template that
// renders by the API server's capabilities (the PodMonitor and PrometheusRule, once
// their CRDs are installed).
const trustFor = time.Hour

// The manager's own metrics of what reconciles cost: renders (dry-run upgrades) and
// read-backs of a release's objects, done or skipped because nothing changed.
var (
	renders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_manager_release_renders_total",
		Help: "Dry-run upgrades a reconcile asked for, by result: rendered (sent to the API server) or skipped (the values that rendered the deployed revision again, within an hour).",
	}, []string{"result"})
	readBacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgpilot_manager_release_readbacks_total",
		Help: "Read-backs of every object of a release a reconcile asked for, by result: read (each object read and patched back) or skipped (no change to any of them seen since the last, within an hour).",
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(renders, readBacks)
}

// releases remembers, for each custom resource of one kind, the values its release was
// last rendered from and when its objects were last read back and found as rendered,
// so that a reconcile that would change nothing does nothing.
//
// helm-operator-plugins v0.8.0 reconciles an unchanged release in full: a dry-run
// upgrade (the chart rendered and every object sent to the API server as a dry run) to
// learn that the manifest is the same, then a GET of every object of the release to
// patch back drift. At 1,000 clusters on a loaded API server that averaged 6.4 s a
// reconcile, so the periodic resync alone (1,000 clusters every 10 minutes) was more
// work than the manager's 8 workers could do, and a new cluster waited behind it.
// What made the work necessary is known without it:
//   - the manifest depends on the values, which the reconciler computes before the dry
//     run (the translator reads what the plan observes), and on the chart, which does
//     not change while the process runs; a dry run of the values that rendered the
//     deployed revision renders that revision again;
//   - the objects change only through writes the manager's watches of them see (an
//     update of anything but the status, or a deletion); each such event marks its
//     cluster's objects unread (changed) before the reconciler's own handler queues
//     the reconcile that repairs it.
//
// Nothing is remembered across restarts: the first reconcile of every resource after a
// start is a full one.
type releases struct {
	mu sync.Mutex
	// byKey are the resources' memories.
	byKey map[types.NamespacedName]*memory
	// changes counts the changes seen to rendered objects of each resource.
	changes map[types.NamespacedName]uint64
	// ours is, for each resource this process ran a Helm operation on, the number of
	// the latest revision before the first: the revisions above it are this process's
	// (orphans.go).
	ours map[types.NamespacedName]int
	now  func() time.Time
}

// memory is what one resource's release was last seen to be.
type memory struct {
	// values is the digest of the values and chart the release's revision was rendered
	// from, rendered at renderedAt.
	values     string
	revision   int
	manifest   string
	renderedAt time.Time
	// readAt is when the release's objects were last read back in full (or written
	// by an install or upgrade) with changes at seen; zero when never.
	readAt time.Time
	seen   uint64
}

func newReleases() *releases {
	return &releases{byKey: map[types.NamespacedName]*memory{}, changes: map[types.NamespacedName]uint64{},
		ours: map[types.NamespacedName]int{}, now: time.Now}
}

// changed records a change to a rendered object of key's release.
func (r *releases) changed(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes[key]++
}

// forget drops key: its resource is gone, or its last write failed.
func (r *releases) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byKey, key)
	delete(r.changes, key)
}

// gone forgets everything of key: its resource was deleted.
func (r *releases) gone(key types.NamespacedName) {
	r.forget(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.ours, key)
}

// rendered reports whether values would render rel again: rel is the deployed revision
// the same values rendered, within trustFor.
func (r *releases) rendered(key types.NamespacedName, values string, rel *release.Release) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byKey[key]
	return m != nil && deployed(rel) && m.values == values && m.revision == rel.Version && m.manifest == manifestDigest(rel) &&
		r.now().Sub(m.renderedAt) < trustFor
}

// remember records that values render rel, and, when written is true, that rel's
// objects were written as rendered by an install or upgrade that began with changes
// at seen.
func (r *releases) remember(key types.NamespacedName, values string, rel *release.Release, written bool, seen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &memory{values: values, revision: rel.Version, manifest: manifestDigest(rel), renderedAt: r.now()}
	if old := r.byKey[key]; old != nil && old.revision == m.revision && old.manifest == m.manifest {
		m.readAt, m.seen = old.readAt, old.seen
	}
	if written {
		m.readAt, m.seen = m.renderedAt, seen
	}
	r.byKey[key] = m
}

// begin is the count of changes a read of key's objects starting now accounts for.
func (r *releases) begin(key types.NamespacedName) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changes[key]
}

// read records that rel's objects were read back and repaired in a read that began with
// changes at seen.
func (r *releases) read(key types.NamespacedName, rel *release.Release, seen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.byKey[key]; m != nil && m.revision == rel.Version && m.manifest == manifestDigest(rel) {
		m.readAt, m.seen = r.now(), seen
	}
}

// asRendered reports whether rel's objects are known to be as rendered: read back since
// the last change any watch saw, within trustFor.
func (r *releases) asRendered(key types.NamespacedName, rel *release.Release) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byKey[key]
	return m != nil && deployed(rel) && !m.readAt.IsZero() && m.revision == rel.Version && m.manifest == manifestDigest(rel) &&
		m.seen == r.changes[key] && r.now().Sub(m.readAt) < trustFor
}

// deployed reports whether rel is a revision Helm deployed (not failed, pending or
// superseded).
func deployed(rel *release.Release) bool {
	return rel != nil && rel.Info != nil && rel.Info.Status == release.StatusDeployed
}

func manifestDigest(rel *release.Release) string {
	sum := sha256.Sum256([]byte(rel.Manifest))
	return hex.EncodeToString(sum[:])
}

// valuesDigest is a SHA-256 of the chart's name and version and of vals.
func valuesDigest(ch *chart.Chart, vals map[string]any) (string, error) {
	b, err := json.Marshal(vals)
	if err != nil {
		return "", fmt.Errorf("digesting the values: %w", err)
	}
	h := sha256.New()
	if ch != nil && ch.Metadata != nil {
		_, _ = fmt.Fprintf(h, "%s\x00%s\x00", ch.Metadata.Name, ch.Metadata.Version)
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// remembering is getter with each action client it returns keeping r.
// A revision left pending is marked failed through configs when its reconcile begins
// (orphans.go).
func remembering(getter helmclient.ActionClientGetter, configs helmclient.ActionConfigGetter, r *releases) helmclient.ActionClientGetter {
	return helmclient.ActionClientGetterFunc(func(ctx context.Context, obj client.Object) (helmclient.ActionInterface, error) {
		c, err := getter.ActionClientFor(ctx, obj)
		if err != nil {
			return nil, err
		}
		return &rememberingClient{ActionInterface: c, releases: r, key: client.ObjectKeyFromObject(obj),
			markFailed: failMarker(ctx, configs, obj)}, nil
	})
}

// rememberingClient is the action client of one reconcile of the resource key.
type rememberingClient struct {
	helmclient.ActionInterface
	releases *releases
	key      types.NamespacedName
	// last is the release the reconcile read; the reconciler reads it twice, once for
	// the status and once for its comparison, and one read is enough.
	last *release.Release
	// markFailed marks an orphaned pending revision failed.
	markFailed markFailed
}

func (c *rememberingClient) Get(name string, opts ...helmclient.GetOption) (*release.Release, error) {
	if len(opts) > 0 {
		return c.ActionInterface.Get(name, opts...)
	}
	if c.last != nil {
		return c.last, nil
	}
	rel, err := c.ActionInterface.Get(name)
	if err != nil {
		return rel, err
	}
	if c.releases.orphaned(c.key, rel, c.releases.now()) {
		if err := c.markFailed(rel); err != nil {
			return nil, err
		}
	}
	c.last = rel
	return rel, nil
}

// Install remembers what it installed.
func (c *rememberingClient) Install(name, namespace string, ch *chart.Chart, vals map[string]any, opts ...helmclient.InstallOption) (*release.Release, error) {
	c.operating()
	return c.write(ch, vals, func() (*release.Release, error) {
		return c.ActionInterface.Install(name, namespace, ch, vals, opts...)
	})
}

// Upgrade answers a dry run with the deployed revision when the same values rendered
// it, and remembers what a real upgrade wrote.
func (c *rememberingClient) Upgrade(name, namespace string, ch *chart.Chart, vals map[string]any, opts ...helmclient.UpgradeOption) (*release.Release, error) {
	var u action.Upgrade
	for _, o := range opts {
		if err := o(&u); err != nil {
			return nil, err
		}
	}
	if !u.DryRun {
		c.operating()
		return c.write(ch, vals, func() (*release.Release, error) {
			return c.ActionInterface.Upgrade(name, namespace, ch, vals, opts...)
		})
	}
	values, err := valuesDigest(ch, vals)
	if err != nil {
		return c.ActionInterface.Upgrade(name, namespace, ch, vals, opts...)
	}
	current := c.last
	if c.releases.rendered(c.key, values, current) {
		renders.WithLabelValues("skipped").Inc()
		return current, nil
	}
	renders.WithLabelValues("rendered").Inc()
	rel, err := c.ActionInterface.Upgrade(name, namespace, ch, vals, opts...)
	if err == nil && deployed(current) && rel.Manifest == current.Manifest {
		c.releases.remember(c.key, values, current, false, 0)
	}
	return rel, err
}

// operating records an operation about to run on the release, after the revision the
// reconcile read (none for an install), and forgets that revision.
func (c *rememberingClient) operating() {
	latest := 0
	if c.last != nil {
		latest = c.last.Version
	}
	c.releases.operating(c.key, latest)
	c.last = nil
}

// write runs an install or upgrade of vals and remembers the revision it wrote; a
// failed one forgets the resource.
func (c *rememberingClient) write(ch *chart.Chart, vals map[string]any, do func() (*release.Release, error)) (*release.Release, error) {
	seen := c.releases.begin(c.key)
	rel, err := do()
	values, derr := valuesDigest(ch, vals)
	if err != nil || derr != nil || !deployed(rel) {
		c.releases.forget(c.key)
		return rel, err
	}
	c.releases.remember(c.key, values, rel, true, seen)
	return rel, err
}

// Reconcile reads back rel's objects and repairs them, unless they are known to be as
// rendered.
func (c *rememberingClient) Reconcile(rel *release.Release) error {
	if c.releases.asRendered(c.key, rel) {
		readBacks.WithLabelValues("skipped").Inc()
		return nil
	}
	readBacks.WithLabelValues("read").Inc()
	seen := c.releases.begin(c.key)
	if err := c.ActionInterface.Reconcile(rel); err != nil {
		return err
	}
	c.releases.read(c.key, rel, seen)
	return nil
}

// Uninstall forgets the resource, and that this process wrote any of its revisions.
func (c *rememberingClient) Uninstall(name string, opts ...helmclient.UninstallOption) (*release.UninstallReleaseResponse, error) {
	c.last = nil
	c.releases.gone(c.key)
	return c.ActionInterface.Uninstall(name, opts...)
}

// changeOf is the resource of kind gk whose release rendered obj, as the reconciler's
// dependent watches find it: its controller owner of that kind, or, for an object that
// cannot have one, the operator-sdk/primary-resource annotations. false for anything
// else (a report ConfigMap the controller writes): the reconciler repairs nothing for
// it either. Nor for a release Secret, which the cluster owns.
func changeOf(gk schema.GroupKind, obj any) (types.NamespacedName, bool) {
	o, ok := obj.(client.Object)
	if !ok || helmReleaseLabel.Matches(labels.Set(o.GetLabels())) {
		// A release Secret is Helm's storage, which the reconciler writes at every
		// install and upgrade, not an object of the release.
		return types.NamespacedName{}, false
	}
	if ref := metav1.GetControllerOf(o); ref != nil {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil || ref.Kind != gk.Kind || gv.Group != gk.Group {
			return types.NamespacedName{}, false
		}
		return types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}, true
	}
	a := o.GetAnnotations()
	if a[sdkhandler.TypeAnnotation] != gk.String() {
		return types.NamespacedName{}, false
	}
	ns, name, found := strings.Cut(a[sdkhandler.NamespacedNameAnnotation], "/")
	if !found {
		return types.NamespacedName{Name: ns}, ns != ""
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}
