package helmmanager

import (
	"context"
	"testing"
	"time"

	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	sdkhandler "github.com/operator-framework/operator-lib/handler"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// fakeHelm is a release store that renders values["replicas"] into its manifest and
// counts what the reconciler would send to the API server.
type fakeHelm struct {
	deployed   *release.Release
	gets       int
	dryRuns    int
	upgrades   int
	reconciles int
	// duringReconcile runs inside Reconcile, as a watch event would arrive.
	duringReconcile func()
}

func (f *fakeHelm) render(vals map[string]any) string {
	return "replicas: " + vals["replicas"].(string)
}

func (f *fakeHelm) Get(string, ...helmclient.GetOption) (*release.Release, error) {
	f.gets++
	return f.deployed, nil
}

func (f *fakeHelm) History(string, ...helmclient.HistoryOption) ([]*release.Release, error) {
	return nil, nil
}

func (f *fakeHelm) Install(name, _ string, _ *chart.Chart, vals map[string]any, _ ...helmclient.InstallOption) (*release.Release, error) {
	f.deployed = &release.Release{Name: name, Version: 1, Manifest: f.render(vals), Info: &release.Info{Status: release.StatusDeployed}}
	return f.deployed, nil
}

func (f *fakeHelm) Upgrade(name, _ string, _ *chart.Chart, vals map[string]any, opts ...helmclient.UpgradeOption) (*release.Release, error) {
	var u action.Upgrade
	for _, o := range opts {
		if err := o(&u); err != nil {
			return nil, err
		}
	}
	next := &release.Release{Name: name, Version: f.deployed.Version + 1, Manifest: f.render(vals), Info: &release.Info{Status: release.StatusDeployed}}
	if u.DryRun {
		f.dryRuns++
		return next, nil
	}
	f.upgrades++
	f.deployed = next
	return next, nil
}

func (f *fakeHelm) Uninstall(string, ...helmclient.UninstallOption) (*release.UninstallReleaseResponse, error) {
	return nil, nil
}

func (f *fakeHelm) Reconcile(*release.Release) error {
	f.reconciles++
	if f.duringReconcile != nil {
		f.duringReconcile()
		f.duringReconcile = nil
	}
	return nil
}

var dryRun helmclient.UpgradeOption = func(u *action.Upgrade) error {
	u.DryRun = true
	return nil
}

// reconcileLikeV080 does what helm-operator-plugins v0.8.0's reconciler does with its action
// client: read the release twice, dry-run an upgrade, and then upgrade when the manifest
// changed or read back the objects when it did not.
func reconcileLikeV080(t *testing.T, getter helmclient.ActionClientGetter, replicas string) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetNamespace("ns")
	obj.SetName("db")
	c, err := getter.ActionClientFor(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{"replicas": replicas}
	if _, err := c.Get("db"); err != nil {
		t.Fatal(err)
	}
	current, err := c.Get("db")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Upgrade("db", "ns", nil, vals, dryRun)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Manifest != current.Manifest {
		if _, err := c.Upgrade("db", "ns", nil, vals); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := c.Reconcile(current); err != nil {
		t.Fatal(err)
	}
}

func TestAnUnchangedReleaseIsNotRenderedOrReadAgain(t *testing.T) {
	fake := &fakeHelm{}
	r := newReleases()
	now := time.Now()
	r.now = func() time.Time { return now }
	getter := remembering(helmclient.ActionClientGetterFunc(func(context.Context, client.Object) (helmclient.ActionInterface, error) {
		return fake, nil
	}), nil, r)
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	if _, err := fake.Install("db", "ns", nil, map[string]any{"replicas": "3"}); err != nil {
		t.Fatal(err)
	}

	type counts struct{ gets, dryRuns, upgrades, reconciles int }
	step := func(what, replicas string, want counts) {
		t.Helper()
		before := counts{fake.gets, fake.dryRuns, fake.upgrades, fake.reconciles}
		reconcileLikeV080(t, getter, replicas)
		got := counts{fake.gets - before.gets, fake.dryRuns - before.dryRuns, fake.upgrades - before.upgrades, fake.reconciles - before.reconciles}
		if got != want {
			t.Errorf("%s: got %+v from the API server, want %+v", what, got, want)
		}
	}
	step("the first reconcile after a start", "3", counts{gets: 1, dryRuns: 1, reconciles: 1})
	step("a reconcile that changes nothing", "3", counts{gets: 1})
	r.changed(key)
	step("after a change to one of its objects", "3", counts{gets: 1, reconciles: 1})
	r.changed(types.NamespacedName{Namespace: "ns", Name: "other"})
	step("after a change to another cluster's object", "3", counts{gets: 1})
	step("new values", "5", counts{gets: 1, dryRuns: 1, upgrades: 1})
	step("after its own upgrade", "5", counts{gets: 1})
	now = now.Add(trustFor)
	step("once trustFor has passed", "5", counts{gets: 1, dryRuns: 1, reconciles: 1})

	fake.duringReconcile = func() { r.changed(key) }
	r.changed(key)
	step("a change while the objects are read", "5", counts{gets: 1, reconciles: 1})
	step("the next reconcile", "5", counts{gets: 1, reconciles: 1})
	step("and the one after", "5", counts{gets: 1})

	fake.deployed = &release.Release{Name: "db", Version: fake.deployed.Version + 1, Manifest: "replicas: 5", Info: &release.Info{Status: release.StatusDeployed}}
	step("a revision written by someone else", "5", counts{gets: 1, dryRuns: 1, reconciles: 1})
	fake.deployed.Info.Status = release.StatusFailed
	step("a failed revision", "5", counts{gets: 1, dryRuns: 1, reconciles: 1})
}

// Changes are counted for the cluster whose release rendered the object, found as the
// reconciler's own watches find it; other objects' changes are not counted.
func TestChangesAreCountedByCluster(t *testing.T) {
	r := newReleases()
	var passed int
	gk := dbv1.GroupVersion.WithKind("PostgresCluster").GroupKind()
	h := changeCountingHandler{ResourceEventHandler: countingHandler{&passed}, releases: r, kind: gk}
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	owned := func(digest, rv string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service"}}
		u.SetNamespace("ns")
		u.SetName("db-rw")
		u.SetLabels(map[string]string{dbv1.LabelCluster: "db"})
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: dbv1.GroupVersion.String(), Kind: "PostgresCluster", Name: "db", Controller: ptr.To(true)}})
		u.SetResourceVersion(rv)
		u.Object[digestField] = digest
		u.Object["status"] = map[string]any{"s": rv}
		return u
	}
	count := func(what string, want uint64) {
		t.Helper()
		if got := r.begin(key); got != want {
			t.Errorf("%s: %d changes counted, want %d", what, got, want)
		}
	}
	h.OnUpdate(owned("a", "1"), owned("a", "2"))
	count("a status update", 0)
	h.OnUpdate(owned("a", "2"), owned("b", "3"))
	count("an update of the content", 1)
	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/db-rw", Obj: owned("b", "3")})
	count("a deletion", 2)

	report := owned("a", "4")
	report.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: dbv1.GroupVersion.String(), Kind: "PostgresCluster", Name: "db"}})
	h.OnUpdate(owned("a", "3"), report)
	count("an update of an object the cluster owns but did not render", 2)

	annotated := owned("a", "5")
	annotated.SetOwnerReferences(nil)
	annotated.SetAnnotations(map[string]string{sdkhandler.TypeAnnotation: gk.String(), sdkhandler.NamespacedNameAnnotation: "ns/db"})
	h.OnDelete(annotated)
	count("a deletion of an object that names its cluster by annotation", 3)

	release := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sh.helm.release.v1.db.v1", ResourceVersion: "6",
		Labels: map[string]string{"owner": "helm", "status": "deployed"}, OwnerReferences: annotated.GetOwnerReferences()}}
	release.OwnerReferences = []metav1.OwnerReference{{APIVersion: dbv1.GroupVersion.String(), Kind: "PostgresCluster", Name: "db", Controller: ptr.To(true)}}
	pending := release.DeepCopy()
	pending.Labels["status"], pending.ResourceVersion = "pending-install", "5"
	h.OnUpdate(pending, release)
	count("an update of the release Secret", 3)

	if passed != 6 {
		t.Errorf("the reconciler's handler saw %d events, want all 6", passed)
	}
}

type countingHandler struct{ n *int }

func (h countingHandler) OnAdd(any, bool)   { *h.n++ }
func (h countingHandler) OnUpdate(any, any) { *h.n++ }
func (h countingHandler) OnDelete(any)      { *h.n++ }
