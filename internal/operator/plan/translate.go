package plan

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/operator-framework/helm-operator-plugins/pkg/reconciler"
	helmchart "helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Translator is the PostgresCluster chart's helm-operator-plugins value translator: the
// custom resource's spec with watches.yaml's overrideValues applied, and the plan made
// from it under "plan".
type Translator struct {
	// Overrides are watches.yaml's overrideValues: chart value paths to values, each
	// with $VARIABLES expanded from the environment, applied over the spec.
	Overrides map[string]string
	// Chart is the chart the values are for: its values.yaml fills what the spec leaves
	// out before the plan is made.
	Chart *helmchart.Chart
	// Reader reads what exists; the API server itself, not a cache, so that the plan
	// never starts informers on every ConfigMap and StatefulSet of the cluster.
	Reader client.Reader
}

// Translate implements values.Translator.
func (t Translator) Translate(ctx context.Context, obj *unstructured.Unstructured) (chartutil.Values, error) {
	spec, _, err := unstructured.NestedMap(obj.Object, "spec")
	if err != nil {
		return nil, fmt.Errorf("reading the spec: %w", err)
	}
	if spec == nil {
		spec = map[string]any{}
	}
	for path, v := range t.Overrides {
		if err := strvals.ParseInto(path+"="+os.ExpandEnv(v), spec); err != nil {
			return nil, fmt.Errorf("applying the override of %s: %w", path, err)
		}
	}
	values, typed, err := coalesce(t.Chart, spec)
	if err != nil {
		return nil, err
	}
	cluster := Cluster{Name: obj.GetName(), Namespace: obj.GetNamespace(), RestartedAt: obj.GetAnnotations()[dbv1.AnnotationRestartedAt]}
	observed, err := Observe(ctx, t.Reader, cluster, typed)
	if err != nil {
		return nil, err
	}
	if values, err = withPlan(values, cluster, typed, observed); err != nil {
		return nil, err
	}
	if typed.Monitoring.Enabled {
		if p, ok := values["plan"].(map[string]any); ok {
			p["dashboard"] = string(chartFile(t.Chart, DashboardFile))
		}
	}
	return values, nil
}

// DashboardFile is the chart's Grafana dashboard, which its grafana-dashboard template
// renders for a cluster with monitoring enabled: from plan.dashboard when the values
// carry it, else from the chart's files.
const DashboardFile = "dashboards/pgpilot.json"

// WithoutDashboard is ch without DashboardFile, for the Helm reconciler: Helm stores the
// chart in every revision of every release, and the dashboard was 43 KB of each
// (17 % of a release, most of what is left once the schema is not stored). The
// Translator, which has the whole chart, passes the dashboard in the values of a
// cluster with monitoring enabled, so that only its releases store it.
func WithoutDashboard(ch *helmchart.Chart) *helmchart.Chart {
	out := *ch
	out.Files = nil
	for _, f := range ch.Files {
		if f.Name != DashboardFile {
			out.Files = append(out.Files, f)
		}
	}
	return &out
}

func chartFile(ch *helmchart.Chart, name string) []byte {
	for _, f := range ch.Files {
		if f.Name == name {
			return f.Data
		}
	}
	return nil
}

// ChartValues are the values the chart renders cluster with: spec coalesced with the
// chart's values.yaml, and the plan made from them and observed. It is Translate without
// the reads, for renders outside a cluster.
func ChartValues(ch *helmchart.Chart, cluster Cluster, spec map[string]any, observed Observed) (chartutil.Values, error) {
	values, typed, err := coalesce(ch, spec)
	if err != nil {
		return nil, err
	}
	return withPlan(values, cluster, typed, observed)
}

func coalesce(ch *helmchart.Chart, spec map[string]any) (chartutil.Values, Values, error) {
	var typed Values
	values, err := chartutil.CoalesceValues(ch, spec)
	if err != nil {
		return nil, typed, fmt.Errorf("coalescing the values: %w", err)
	}
	if typed, err = viaJSON[Values](values); err != nil {
		return nil, typed, fmt.Errorf("reading the values: %w", err)
	}
	return values, typed, nil
}

// viaJSON is in as a T: the values' untyped tree and the plan's types meet in JSON.
func viaJSON[T any](in any) (T, error) {
	var out T
	raw, err := json.Marshal(in)
	if err != nil {
		return out, err
	}
	err = json.Unmarshal(raw, &out)
	return out, err
}

// RefusedPrefix begins the error of a spec the plan refuses, as the Helm reconciler's
// ReleaseFailed condition carries it: the status controller tells it from a failure to
// read what exists, which passes.
const RefusedPrefix = "spec refused: "

func withPlan(values chartutil.Values, cluster Cluster, typed Values, observed Observed) (chartutil.Values, error) {
	p, err := Decide(cluster, typed, observed)
	if err != nil {
		return nil, fmt.Errorf("%s%w", RefusedPrefix, err)
	}
	tree, err := viaJSON[map[string]any](p)
	if err != nil {
		return nil, err
	}
	values["plan"] = tree
	return values, nil
}

// Observe reads what the plan of cluster depends on: its deployed ConfigMap and
// StatefulSet, the primary Lease and report of a deployed cluster and, for a restore from a PostgresBackup not yet deployed, that backup.
// What does not exist is left nil.
func Observe(ctx context.Context, r client.Reader, cluster Cluster, v Values) (Observed, error) {
	var observed Observed
	names := dbv1.NamesOf(cluster.Name)
	var err error
	if observed.ConfigMap, err = get(ctx, r, cluster.Namespace, names.ConfigMap(), &corev1.ConfigMap{}); err != nil {
		return observed, err
	}
	if observed.StatefulSet, err = get(ctx, r, cluster.Namespace, names.StatefulSet(), &appsv1.StatefulSet{}); err != nil {
		return observed, err
	}
	if observed.StatefulSet != nil {
		if observed.PrimaryLease, err = get(ctx, r, cluster.Namespace, names.PrimaryLease(), &coordinationv1.Lease{}); err != nil {
			return observed, err
		}
		if observed.Report, err = get(ctx, r, cluster.Namespace, names.Report(), &corev1.ConfigMap{}); err != nil {
			return observed, err
		}
	}
	from := v.Bootstrap.FromBackup
	if from == nil || from.BackupName == "" || deployedRestore(observed.ConfigMap) != nil {
		return observed, nil
	}
	observed.Backup, err = getBackup(ctx, r, cluster.Namespace, from.BackupName)
	return observed, err
}

// getBackup reads a PostgresBackup, nil when it does not exist. It is read unstructured:
// the Helm manager's scheme holds the Kubernetes types only (helm-operator-plugins
// registers each watched kind there as unstructured, and a typed registration of the
// group would clash with it).
func getBackup(ctx context.Context, r client.Reader, namespace, name string) (*dbv1.PostgresBackup, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(dbv1.GroupVersion.WithKind("PostgresBackup"))
	u, err := get(ctx, r, namespace, name, u)
	if u == nil || err != nil {
		return nil, err
	}
	var b dbv1.PostgresBackup
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
		return nil, fmt.Errorf("reading PostgresBackup %s/%s: %w", namespace, name, err)
	}
	return &b, nil
}

// get reads namespace/name into obj: nil when it does not exist.
func get[T client.Object](ctx context.Context, r client.Reader, namespace, name string, obj T) (T, error) {
	var none T
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
	if apierrors.IsNotFound(err) {
		return none, nil
	}
	if err != nil {
		return none, fmt.Errorf("reading %T %s/%s: %w", obj, namespace, name, err)
	}
	return obj, nil
}

// RestoreSourceWatch makes the Helm reconciler of the cluster kind gvk reconcile, at
// every change of a PostgresBackup, the clusters of its namespace that restore from it
// (bootstrap.fromBackup.backupName). Without it a cluster created before its backup
// completed would wait for the backoff of its failed plans, which reaches minutes.
// PostgresBackups are watched unstructured, like everything in the Helm manager.
func RestoreSourceWatch(c cache.Cache, clusters client.Reader, gvk schema.GroupVersionKind) reconciler.ControllerSetupFunc {
	return func(setup reconciler.ControllerSetup) error {
		backup := &unstructured.Unstructured{}
		backup.SetGroupVersionKind(dbv1.GroupVersion.WithKind("PostgresBackup"))
		restoring := func(ctx context.Context, b client.Object) []reconcile.Request {
			return clustersRestoringFrom(ctx, clusters, gvk, b.GetNamespace(), b.GetName())
		}
		return setup.Watch(source.Kind[client.Object](c, backup, handler.EnqueueRequestsFromMapFunc(restoring)))
	}
}

func clustersRestoringFrom(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, namespace, backup string) []reconcile.Request {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.List(ctx, list, client.InNamespace(namespace)); err != nil {
		log.FromContext(ctx).Error(err, "Listing the clusters that may restore from a PostgresBackup failed", "postgresBackup", backup)
		return nil
	}
	var requests []reconcile.Request
	for _, c := range list.Items {
		if name, _, _ := unstructured.NestedString(c.Object, "spec", "bootstrap", "fromBackup", "backupName"); name == backup {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&c)})
		}
	}
	return requests
}
