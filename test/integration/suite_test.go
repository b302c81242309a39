// Package integration runs the Helm manager and the controller against a real
// kube-apiserver and etcd (built from source by hack/control-plane.sh and cached).
package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

// agentImage is what RELATED_IMAGE_AGENT says during the tests.
const agentImage = "pgpilot:integration"

var (
	k8s client.Client
	cfg *rest.Config
	// operatorCfg impersonates the operator's ServiceAccount.
	operatorCfg *rest.Config
	env         *envtest.Environment
	repoRoot    string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The managers log to a file, shown when a test fails.
	logFile, err := os.CreateTemp("", "pgpilot-integration-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logFile.Close()
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.Level(zapLevel()), func(o *zap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder }))
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("logtostderr", "false")
	_ = klogFlags.Set("stderrthreshold", "FATAL")
	klog.SetOutput(logFile)
	if repoRoot, err = devenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The Deployment sets these from config/manager; the tests leave the PostgreSQL
	// images unset so the chart's pinned defaults are used.
	os.Setenv("RELATED_IMAGE_AGENT", agentImage)
	os.Setenv("RELATED_IMAGE_PGBOUNCER", poolerImage)
	// As the downward API sets it in the operator's pod.
	os.Setenv(managerflags.PodNamespaceEnv, devenv.OperatorNamespace)
	env, err = devenv.StartControlPlane(repoRoot, filepath.Join(repoRoot, "test", "testdata", "crds"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	cfg = env.Config
	scheme, err := controller.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The operator runs as its ServiceAccount with config/'s RBAC, so every test also
	// shows that RBAC is enough.
	operatorCfg, err = devenv.InstallOperator(ctx, cfg, repoRoot)
	if err != nil {
		fmt.Fprintln(os.Stderr, "installing config/default:", err)
		return 1
	}
	errs, err := devenv.StartOperator(ctx, operatorCfg, repoRoot)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the operator:", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "the managers' log is in", logFile.Name())
	}
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, "a manager stopped with:", err)
			code = 1
		}
	}
	return code
}

// zapLevel is info; PGPILOT_TEST_LOG=debug adds the managers' debug logs.
func zapLevel() zapcore.Level {
	if os.Getenv("PGPILOT_TEST_LOG") == "debug" {
		return zapcore.DebugLevel
	}
	return zapcore.InfoLevel
}
