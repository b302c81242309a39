// Package helmmanager registers one helm-operator-plugins reconciler per watches.yaml entry.
package helmmanager

import (
	"fmt"
	"time"

	"github.com/operator-framework/helm-operator-plugins/pkg/annotation"
	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	"github.com/operator-framework/helm-operator-plugins/pkg/reconciler"
	"github.com/operator-framework/helm-operator-plugins/pkg/watches"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/plan"
)

// Scheme returns the Helm manager's scheme: the Kubernetes types only. The reconciler
// registers each watched kind itself, as unstructured.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Options are the defaults for watches.yaml entries that do not set their own.
type Options struct {
	// WatchesFile is the path of watches.yaml; chart paths in it are relative to the
	// working directory.
	WatchesFile string
	// MaxConcurrentReconciles applies to entries without maxConcurrentReconciles.
	MaxConcurrentReconciles int
	// ReconcilePeriod applies to entries without reconcilePeriod.
	ReconcilePeriod time.Duration
	// MaxReleaseHistory is how many Helm release revisions are kept per cluster.
	MaxReleaseHistory int
}

// DefaultOptions are the manager's flag defaults.
func DefaultOptions() Options {
	return Options{
		WatchesFile:             "watches.yaml",
		MaxConcurrentReconciles: 4,
		ReconcilePeriod:         10 * time.Minute,
		MaxReleaseHistory:       3,
	}
}

// Setup loads the watches file and adds a Helm reconciler for each entry to mgr,
// honouring each entry's own fields over the defaults in opts. mgr's cache is made with
// CacheOptions.
func Setup(mgr ctrl.Manager, opts Options) ([]watches.Watch, error) {
	ws, err := watches.Load(opts.WatchesFile)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", opts.WatchesFile, err)
	}
	log := mgr.GetLogger().WithName("helm")
	configs, err := helmclient.NewActionConfigGetter(mgr.GetConfig(), mgr.GetRESTMapper())
	if err != nil {
		return nil, fmt.Errorf("creating the Helm action config getter: %w", err)
	}
	actions, err := actionClientGetter(configs)
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		if err := checkCached(w.GroupVersionKind); err != nil {
			return nil, err
		}
		period := opts.ReconcilePeriod
		if w.ReconcilePeriod != nil {
			period = w.ReconcilePeriod.Duration
		}
		concurrency := opts.MaxConcurrentReconciles
		if w.MaxConcurrentReconciles != nil {
			concurrency = *w.MaxConcurrentReconciles
		}
		released := newReleases()
		options := []reconciler.Option{
			reconciler.WithChart(*plan.WithoutDashboard(withoutSchema(w.Chart))),
			reconciler.WithGroupVersionKind(w.GroupVersionKind),
			reconciler.WithSelector(*w.Selector),
			reconciler.SkipDependentWatches(!*w.WatchDependentResources),
			reconciler.WithMaxConcurrentReconciles(concurrency),
			// The period is kept by spreadResync, not by the reconciler's requeue.
			reconciler.WithReconcilePeriod(0),
			reconciler.WithControllerSetupFunc(spreadResync(mgr.GetCache(), w.GroupVersionKind, period)),
			reconciler.WithMaxReleaseHistory(opts.MaxReleaseHistory),
			reconciler.WithInstallAnnotations(annotation.DefaultInstallAnnotations...),
			reconciler.WithUpgradeAnnotations(annotation.DefaultUpgradeAnnotations...),
			reconciler.WithUninstallAnnotations(annotation.DefaultUninstallAnnotations...),
			reconciler.WithLog(log.WithValues("gvk", w.GroupVersionKind.String())),
			reconciler.WithActionClientGetter(remembering(actions, configs, released)),
			reconciler.WithClient(keepStatus(mgr.GetClient(), mgr.GetAPIReader(), w.GroupVersionKind)),
		}
		if p := planned(mgr, w); p != nil {
			options = append(options, p...)
		} else {
			options = append(options, reconciler.WithOverrideValues(w.OverrideValues))
		}
		r, err := reconciler.New(options...)
		if err != nil {
			return nil, fmt.Errorf("creating the Helm reconciler for %s: %w", w.GroupVersionKind, err)
		}
		if err := r.SetupWithManager(statusBlind(mgr, w.GroupVersionKind, released)); err != nil {
			return nil, fmt.Errorf("setting up the Helm reconciler for %s: %w", w.GroupVersionKind, err)
		}
		log.Info("Configured watch", "gvk", w.GroupVersionKind.String(), "chart", w.ChartPath,
			"maxConcurrentReconciles", concurrency, "reconcilePeriod", period.String())
	}
	return ws, nil
}

// withoutSchema is ch without its values.schema.json, for a kind whose values are its
// custom resource's spec: the API server validated the spec against the CRD's schema,
// which values.schema.json is made from (hack/values-schema), and the rest of the values
// are the operator's own. With the schema, Helm compiled its 108 KB and validated the
// values at every install, upgrade and dry-run upgrade (every reconcile), and stored it
// in every revision of every release, about half of each release Secret. The chart in
// helm-charts/ keeps it for those who install the chart with helm.
func withoutSchema(ch *chart.Chart) *chart.Chart {
	out := *ch
	out.Schema = nil
	return &out
}

// planned are the options of the kinds whose chart renders a plan made in Go
// (internal/operator/plan): its value translator, and a watch of what the plan reads that the
// reconciler does not already watch. None for the others, which take their spec as the
// values, with watches.yaml's overrideValues applied by the reconciler.
//
// The translator applies a planned kind's overrideValues itself: the reconciler emits a
// Warning event ValueOverridden for every override at every upgrade of a release, seven
// per cluster per change, although an override here is the operator's images and
// namespace, which no user sets (the CRD has no field for them): normal operation,
// not a problem to warn of.
func planned(mgr ctrl.Manager, w watches.Watch) []reconciler.Option {
	if w.GroupVersionKind != dbv1.GroupVersion.WithKind("PostgresCluster") {
		return nil
	}
	return []reconciler.Option{
		reconciler.WithValueTranslator(plan.Translator{Chart: w.Chart, Reader: mgr.GetAPIReader(), Overrides: w.OverrideValues}),
		reconciler.WithControllerSetupFunc(plan.RestoreSourceWatch(mgr.GetCache(), mgr.GetClient(), w.GroupVersionKind)),
	}
}

// actionClientGetter is helm-operator-plugins' default with Helm's client-side OpenAPI
// validation turned off. That validation downloads the API server's whole OpenAPI
// document for every install, upgrade and dry-run, and checks nothing the API server
// does not check again when the objects are written; the chart's own tests decode every
// rendered object strictly.
func actionClientGetter(configs helmclient.ActionConfigGetter) (helmclient.ActionClientGetter, error) {
	return helmclient.NewActionClientGetter(configs,
		helmclient.AppendInstallOptions(func(i *action.Install) error {
			i.DisableOpenAPIValidation = true
			return nil
		}),
		helmclient.AppendUpgradeOptions(func(u *action.Upgrade) error {
			u.DisableOpenAPIValidation = true
			return nil
		}),
	)
}
