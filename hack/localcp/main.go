// Command localcp is `make run`'s embedded default: with no reachable cluster, it starts
// a local kube-apiserver and etcd (the ones the integration tests use), installs the
// CRDs, applies the sample PostgresCluster, and runs the Helm manager and the controller
// in-process until interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

func main() {
	kubeconfig := flag.String("kubeconfig-out", "bin/local/kubeconfig", "Where to write the kubeconfig of the local control plane.")
	sample := flag.String("sample", "config/samples/db_v1_postgrescluster.yaml", "PostgresCluster to apply into the default namespace; empty for none.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if err := run(*kubeconfig, *sample); err != nil {
		fmt.Fprintln(os.Stderr, "localcp:", err)
		os.Exit(1)
	}
}

func run(kubeconfigPath, samplePath string) error {
	root, err := devenv.RepoRoot()
	if err != nil {
		return err
	}
	if !filepath.IsAbs(kubeconfigPath) {
		kubeconfigPath = filepath.Join(root, kubeconfigPath)
	}
	// No node runs the pods: the images need names only, the local builds' (make
	// image-operator, make image-pgbouncer) unless given.
	for name, image := range map[string]string{
		"RELATED_IMAGE_AGENT":     "pgpilot:dev",
		"RELATED_IMAGE_PGBOUNCER": "pgpilot-pgbouncer:1.18.0",
	} {
		if os.Getenv(name) == "" {
			os.Setenv(name, image)
		}
	}
	fmt.Println("Starting a local kube-apiserver and etcd (built from source on first use, about 5 minutes)...")
	env, err := devenv.StartControlPlane(root)
	if err != nil {
		return err
	}
	defer env.Stop() //nolint:errcheck // best effort on the way out

	user, err := env.AddUser(envtest.User{Name: "pgpilot-dev", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(kubeconfigPath), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfigPath, kc, 0o600); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errs, err := devenv.StartOperator(ctx, env.Config, root)
	if err != nil {
		return err
	}
	if samplePath != "" {
		if err := apply(ctx, env, filepath.Join(root, samplePath)); err != nil {
			return err
		}
	}
	fmt.Printf(`
pgpilot is running against a local control plane (API server and etcd only: no nodes,
so pods are created but never start; the operator's objects, status and events are real).

  export KUBECONFIG=%s
  export PATH=%s:$PATH
  kubectl get pgc,sts,svc,secrets,lease
  kubectl describe pgc my-db

Press Ctrl-C to stop; the local control plane's data goes with it.
`, kubeconfigPath, env.BinaryAssetsDirectory)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}

func apply(ctx context.Context, env *envtest.Environment, path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if u.GetNamespace() == "" {
		u.SetNamespace("default")
	}
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, u); err != nil {
		return fmt.Errorf("applying %s: %w", path, err)
	}
	fmt.Printf("Applied %s %s/%s\n", u.GetKind(), u.GetNamespace(), u.GetName())
	return nil
}
