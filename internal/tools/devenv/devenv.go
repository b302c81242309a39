// Package devenv runs pgpilot against a local kube-apiserver and etcd built from source:
// the integration tests' environment and `make run`'s embedded default.
package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/helmmanager"
)

// RepoRoot walks up from the working directory to the directory holding watches.yaml.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "watches.yaml")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no watches.yaml in the working directory or above it")
		}
		dir = parent
	}
}

// Assets returns the directory holding kube-apiserver, etcd and kubectl: KUBEBUILDER_ASSETS
// when set, else what hack/control-plane.sh builds (once) and caches.
func Assets(root string) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", "control-plane.sh"))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the control plane with hack/control-plane.sh: %w", err)
	}
	return strings.TrimSpace(out.String()), nil
}

// StartControlPlane starts etcd and kube-apiserver with pgpilot's CRDs (and those in
// extraCRDDirs) installed.
func StartControlPlane(root string, extraCRDDirs ...string) (*envtest.Environment, error) {
	env, err := ControlPlane(root, extraCRDDirs...)
	if err != nil {
		return nil, err
	}
	return env, StartPrepared(env)
}

// ControlPlane is StartControlPlane's environment, not started yet: its servers'
// flags can still be changed.
func ControlPlane(root string, extraCRDDirs ...string) (*envtest.Environment, error) {
	assets, err := Assets(root)
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append([]string{filepath.Join(root, "config", "crd", "bases")}, extraCRDDirs...),
		ErrorIfCRDPathMissing: true,
	}, nil
}

// StartPrepared starts an environment made by ControlPlane.
func StartPrepared(env *envtest.Environment) error {
	if _, err := env.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver and etcd from %s: %w", env.BinaryAssetsDirectory, err)
	}
	return nil
}

// OperatorOptions are the optional settings of StartOperator.
type OperatorOptions struct {
	// Namespaces, when set, are the only ones both managers watch, as WATCH_NAMESPACE
	// makes the deployed managers do: operators started side by side for clusters in
	// different namespaces (test/pg's parallel tests) never act on each other's
	// clusters.
	Namespaces []string
	// Log, when set, receives both managers' logs (controller-runtime's global logger
	// otherwise).
	Log logr.Logger
}

// StartOperator runs the Helm manager and the controller in this process until ctx ends,
// with the chart paths of watches.yaml resolved against root. Errors of either manager
// arrive on the returned channel.
func StartOperator(ctx context.Context, cfg *rest.Config, root string, options ...OperatorOptions) (<-chan error, error) {
	var o OperatorOptions
	if len(options) > 0 {
		o = options[len(options)-1]
	}
	if err := os.Chdir(root); err != nil {
		return nil, err
	}
	scheme, err := controller.Scheme()
	if err != nil {
		return nil, err
	}
	helmScheme, err := helmmanager.Scheme()
	if err != nil {
		return nil, err
	}
	noMetrics := metricsserver.Options{BindAddress: "0"}
	// Tests start the operator again in the same process (after "killing" it), which
	// controller-runtime's check for unique controller names would refuse.
	again := config.Controller{SkipNameValidation: ptr.To(true)}
	helmMgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: helmScheme, Metrics: noMetrics,
		Cache: inNamespaces(helmmanager.CacheOptions(), o.Namespaces), Controller: again, Logger: o.Log})
	if err != nil {
		return nil, err
	}
	opts := helmmanager.DefaultOptions()
	opts.WatchesFile = filepath.Join(root, "watches.yaml")
	if _, err := helmmanager.Setup(helmMgr, opts); err != nil {
		return nil, err
	}
	controllerMgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: noMetrics,
		Cache: inNamespaces(controller.CacheOptions(), o.Namespaces), Controller: again, Logger: o.Log})
	if err != nil {
		return nil, err
	}
	if err := controller.Setup(controllerMgr, clock.RealClock{}, controller.Options{MaxRollingClusters: controller.DefaultMaxRollingClusters}); err != nil {
		return nil, err
	}
	errs := make(chan error, 2)
	for _, m := range []ctrl.Manager{helmMgr, controllerMgr} {
		go func() { errs <- m.Start(ctx) }()
	}
	return errs, nil
}

// inNamespaces limits opts to namespaces; none leaves it watching every namespace.
func inNamespaces(opts cache.Options, namespaces []string) cache.Options {
	if len(namespaces) == 0 {
		return opts
	}
	opts.DefaultNamespaces = make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	return opts
}
