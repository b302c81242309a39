package helmmanager

import (
	"context"
	"testing"
	"time"

	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
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

func (f *fakeHelm) render(vals map[string]any) string { return "replicas: " + vals["replicas"].(string) }

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
	}), r)
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
	r.changed(types.NamespacedName{})
	step("after a change to an object of no cluster", "3", counts{gets: 1, reconciles: 1})
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

func TestChangesAreCountedByCluster(t *testing.T) {
	r := newReleases()
	var passed int
	h := changeCountingHandler{ResourceEventHandler: countingHandler{&passed}, releases: r}
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	svc := func(selector, status string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service"}}
		u.SetNamespace("ns")
		u.SetName("db-rw")
		u.SetLabels(map[string]string{dbv1.LabelCluster: "db"})
		u.SetResourceVersion(status)
		u.Object[digestField] = selector
		u.Object["status"] = map[string]any{"s": status}
		return u
	}
	h.OnUpdate(svc("a", "1"), svc("a", "2"))
	if got := r.begin(key); got != 0 {
		t.Errorf("a status update counted %d changes, want 0", got)
	}
	h.OnUpdate(svc("a", "2"), svc("b", "3"))
	if got := r.begin(key); got != 1 {
		t.Errorf("an update of the content counted %d changes, want 1", got)
	}
	h.OnDelete(svc("b", "3"))
	if got := r.begin(key); got != 2 {
		t.Errorf("a deletion counted %d changes, want 2", got)
	}
	release := svc("a", "4")
	release.SetLabels(map[string]string{"owner": "helm"})
	h.OnUpdate(svc("a", "1"), release)
	if got := r.begin(key) + r.unattributed; got != 2 {
		t.Errorf("a release Secret's update counted a change (%d, want 2)", got)
	}
	if passed != 4 {
		t.Errorf("the reconciler's handler saw %d events, want all 4", passed)
	}
}

type countingHandler struct{ n *int }

func (h countingHandler) OnAdd(any, bool)    { *h.n++ }
func (h countingHandler) OnUpdate(any, any) { *h.n++ }
func (h countingHandler) OnDelete(any)      { *h.n++ }
