// Package image checks the operator image without a Docker daemon: it reads the
// Dockerfile, lays out a directory as the image's file system would be (the binaries
// built by the builder stage's own command, the files its COPY lines copy), and runs the
// binaries from the image's working directory, the manager and the controller against a
// real kube-apiserver.
package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	Cmd  string // upper case: FROM, COPY, RUN, ...
	Args string
}

// stage is one FROM ... of a multi-stage Dockerfile.
type stage struct {
	From, Name   string
	Instructions []instruction
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.Instructions {
		if in.Cmd == cmd {
			out = append(out, in.Args)
		}
	}
	return out
}

func (s stage) last(cmd string) string {
	all := s.all(cmd)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// parseDockerfile splits a Dockerfile into stages; ARGs before the first FROM are dropped.
func parseDockerfile(data string) []stage {
	var stages []stage
	var line string
	for _, raw := range strings.Split(data, "\n") {
		raw = strings.TrimSpace(raw)
		if line == "" && (raw == "" || strings.HasPrefix(raw, "#")) {
			continue
		}
		if strings.HasPrefix(raw, "#") {
			continue // a comment inside a continued instruction
		}
		if cont, ok := strings.CutSuffix(raw, "\\"); ok {
			line += cont + " "
			continue
		}
		line += raw
		cmd, args, _ := strings.Cut(line, " ")
		line = ""
		in := instruction{Cmd: strings.ToUpper(cmd), Args: strings.Join(strings.Fields(args), " ")}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			s := stage{From: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.Name = f[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].Instructions = append(stages[len(stages)-1].Instructions, in)
		}
	}
	return stages
}

// copyArgs splits a COPY's arguments into its --flags, sources and destination.
func copyArgs(args string) (flags map[string]string, srcs []string, dst string) {
	flags = map[string]string{}
	f := strings.Fields(args)
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		k, v, _ := strings.Cut(strings.TrimPrefix(f[0], "--"), "=")
		flags[k] = v
		f = f[1:]
	}
	return flags, f[:len(f)-1], f[len(f)-1]
}

type image struct {
	root    string // the repository
	builder stage
	final   stage
}

func readImage(t *testing.T) image {
	t.Helper()
	root, err := devenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(data))
	if len(stages) != 2 || stages[0].Name != "builder" {
		t.Fatalf("the Dockerfile has stages %+v, want a builder stage and the image", stages)
	}
	return image{root: root, builder: stages[0], final: stages[1]}
}

// The builder stage copies every directory holding a package the commands import.
func TestBuilderCopiesEverySourceTheCommandsNeed(t *testing.T) {
	img := readImage(t)
	copied := map[string]bool{}
	for _, c := range img.builder.all("COPY") {
		_, srcs, _ := copyArgs(c)
		for _, s := range srcs {
			copied[strings.TrimSuffix(s, "/")] = true
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the builder does not copy %s", f)
		}
	}
	list := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}{{end}}", "./cmd/...")
	list.Dir = img.root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	need := map[string]bool{}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(img.root, dir)
		if err != nil {
			t.Fatal(err)
		}
		need[strings.Split(filepath.ToSlash(rel), "/")[0]] = true
	}
	for dir := range need {
		if !copied[dir] {
			t.Errorf("the commands import packages under %s/, which the builder does not copy", dir)
		}
	}
}

// The image's runtime settings: a non-root user, the working directory the manager finds
// watches.yaml in, $HOME for Helm's cache.
func TestImageSettings(t *testing.T) {
	img := readImage(t)
	want := map[string]string{
		"FROM":       "scratch",
		"USER":       "65532:65532",
		"WORKDIR":    "/opt/pgpilot",
		"ENV":        "HOME=/tmp",
		"ENTRYPOINT": `["/usr/local/bin/manager"]`,
	}
	got := map[string]string{"FROM": img.final.From}
	for k := range want {
		if k != "FROM" {
			got[k] = img.final.last(k)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("image settings (-want +got):\n%s", diff)
	}
}

var (
	layoutOnce sync.Once
	layoutFS   string
	layoutErr  error
	scratch    string
)

func TestMain(m *testing.M) {
	var err error
	if scratch, err = os.MkdirTemp("", "pgpilot-image-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(scratch)
	os.Exit(code)
}

// layout returns the image's file system, built once for every test under a temporary
// directory: the builder stage's own build command with /out/ there, then the final
// stage's COPY lines.
func layout(t *testing.T, img image) string {
	t.Helper()
	layoutOnce.Do(func() { layoutFS, layoutErr = buildLayout(img) })
	if layoutErr != nil {
		t.Fatal(layoutErr)
	}
	return layoutFS
}

func buildLayout(img image) (string, error) {
	fs := filepath.Join(scratch, "rootfs")
	out := filepath.Join(scratch, "out") + "/"
	emptyTmp := filepath.Join(scratch, "empty")
	if err := os.MkdirAll(emptyTmp, 0o755); err != nil {
		return "", err
	}
	var build string
	for _, run := range img.builder.all("RUN") {
		if strings.Contains(run, "go build") {
			build = run
		}
	}
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "-o /out/ ./cmd/...") {
		return "", fmt.Errorf("the builder's build command %q does not build ./cmd/... statically into /out/", build)
	}
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(build, "/out/", out))
	cmd.Dir = img.root
	cmd.Env = append(os.Environ(), "TARGETOS=", "TARGETARCH=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %v\n%s", build, err, b)
	}

	for _, c := range img.final.all("COPY") {
		flags, srcs, dst := copyArgs(c)
		for _, src := range srcs {
			from := filepath.Join(img.root, src)
			switch flags["from"] {
			case "":
			case "builder":
				switch src {
				case "/out/":
					from = out
				case "/rootfs/tmp":
					from = emptyTmp // the builder makes an empty /tmp
				default:
					return "", fmt.Errorf("COPY --from=builder %s: unknown builder path", src)
				}
			default:
				return "", fmt.Errorf("COPY --from=%s: unknown stage", flags["from"])
			}
			if err := copyTree(from, filepath.Join(fs, dst), strings.HasSuffix(dst, "/")); err != nil {
				return "", fmt.Errorf("COPY %s: %w", c, err)
			}
		}
	}
	return fs, nil
}

// copyTree copies as COPY does: a directory's contents into dst, a file to dst (or into
// it when dst ends with a slash).
func copyTree(src, dst string, intoDir bool) error {
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		if intoDir {
			dst = filepath.Join(dst, filepath.Base(src))
		}
		return copyFile(src, dst, info.Mode())
	}
	return filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		return copyFile(path, filepath.Join(dst, rel), fi.Mode())
	})
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The image holds one binary per command, the files the manager reads from its working
// directory, and the agent where the chart's init container runs it from; each binary
// starts.
func TestImageLayout(t *testing.T) {
	img := readImage(t)
	fs := layout(t, img)
	workdir := filepath.Join(fs, img.final.last("WORKDIR"))

	cmds, err := os.ReadDir(filepath.Join(img.root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, c := range cmds {
		want = append(want, c.Name())
	}
	bins, err := os.ReadDir(filepath.Join(fs, "usr", "local", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bins {
		got = append(got, b.Name())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("/usr/local/bin (-cmd/ +image):\n%s", diff)
	}

	for _, f := range []string{"watches.yaml", "helm-charts/postgrescluster/Chart.yaml", "helm-charts/postgrescluster/values.schema.json"} {
		if _, err := os.Stat(filepath.Join(workdir, f)); err != nil {
			t.Errorf("the image has no %s in its working directory: %v", f, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(fs, "tmp")); err != nil || !fi.IsDir() {
		t.Errorf("the image has no /tmp (Helm's cache): %v", err)
	}

	for _, b := range got {
		bin := filepath.Join(fs, "usr", "local", "bin", b)
		t.Run(b, func(t *testing.T) {
			if b == "agent" {
				// The init container of every instance pod: the agent copies itself.
				dst := filepath.Join(t.TempDir(), "agent")
				run(t, workdir, bin, "install", dst)
				if fi, err := os.Stat(dst); err != nil || fi.Mode()&0o111 == 0 {
					t.Errorf("agent install did not write an executable %s: %v", dst, err)
				}
				return
			}
			run(t, workdir, bin, "--help")
		})
	}

	// The chart's init container runs the agent from the operator image.
	if slices.Contains(got, "agent") {
		chart, err := os.ReadFile(filepath.Join(workdir, "helm-charts", "postgrescluster", "templates", "statefulset.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(chart), `command: ["/usr/local/bin/agent", "install", "/pgpilot/agent"]`) {
			t.Error("the chart's init container does not run /usr/local/bin/agent install")
		}
	} else {
		t.Log("no cmd/agent yet: the image has no agent for the instance pods' init container")
	}
}

func run(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// The manager and the controller, started from the image's working directory as the
// Deployment starts them, find watches.yaml and the chart there and reconcile
// PostgresClusters in the namespaces of WATCH_NAMESPACE (as OLM sets it for a
// MultiNamespace OperatorGroup), and only there.
func TestBinariesRunFromTheImageWorkingDirectory(t *testing.T) {
	img := readImage(t)
	fs := layout(t, img)
	workdir := filepath.Join(fs, img.final.last("WORKDIR"))
	home := filepath.Join(fs, strings.TrimPrefix(img.final.last("ENV"), "HOME="))

	env, err := devenv.StartControlPlane(img.root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	admin, err := env.AddUser(envtest.User{Name: "image-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfigPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	watched, unwatched := []string{"image-a", "image-b"}, "image-c"
	for _, ns := range append(slices.Clone(watched), unwatched) {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	probes := map[string]<-chan struct{}{}
	metricsAddr := map[string]string{}
	for _, b := range []string{"manager", "controller"} {
		probe := freeAddr(t)
		metricsAddr[b] = freeAddr(t)
		probes[probe] = start(t, workdir, filepath.Join(fs, "usr", "local", "bin", b), []string{
			"KUBECONFIG=" + kubeconfigPath,
			"HOME=" + home,
			"WATCH_NAMESPACE=" + strings.Join(watched, ","),
			"RELATED_IMAGE_AGENT=pgpilot:image-test",
		}, "--health-probe-bind-address="+probe, "--metrics-bind-address="+metricsAddr[b])
	}
	for p, exited := range probes {
		testutil.Eventually(t, time.Minute, func() error {
			select {
			case <-exited:
				t.Fatalf("the process serving %s exited", p)
			default:
			}
			resp, err := http.Get("http://" + p + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s/readyz: %s", p, resp.Status)
			}
			return nil
		})
	}

	for _, ns := range append(slices.Clone(watched), unwatched) {
		pgc := &dbv1.PostgresCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "my-db"},
			Spec:       dbv1.PostgresClusterSpec{Replicas: 3, Version: "16"},
		}
		if err := k8s.Create(ctx, pgc); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range watched {
		testutil.Eventually(t, 2*time.Minute, func() error {
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "my-db"}, &appsv1.StatefulSet{}); err != nil {
				return fmt.Errorf("the manager rendered no StatefulSet in %s: %w", ns, err)
			}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "my-db-superuser"}, &corev1.Secret{}); err != nil {
				return fmt.Errorf("the controller made no credentials in %s: %w", ns, err)
			}
			return nil
		})
	}
	// Both managers have handled the watched namespaces by now; the other one is untouched.
	for _, obj := range []client.Object{&appsv1.StatefulSet{}, &corev1.Secret{}} {
		name := "my-db"
		if _, ok := obj.(*corev1.Secret); ok {
			name = "my-db-superuser"
		}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: unwatched, Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s/%s: %v, want not found: %s is not watched", obj, unwatched, name, err, unwatched)
		}
	}
	var pgc dbv1.PostgresCluster
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: unwatched, Name: "my-db"}, &pgc); err != nil {
		t.Fatal(err)
	}
	if len(pgc.Finalizers) > 0 || !equalStatus(pgc.Status, dbv1.PostgresClusterStatus{}) {
		t.Errorf("the cluster in %s was reconciled: finalizers %v, status %+v", unwatched, pgc.Finalizers, pgc.Status)
	}

	// Both serve controller-runtime's reconcile metrics; the controller its own too
	// (docs/monitoring.md).
	for b, want := range map[string][]string{
		"manager": {`controller_runtime_reconcile_total{controller="postgrescluster-controller",result="success"}`},
		"controller": {`controller_runtime_reconcile_total{controller="failover",result="success"}`,
			`controller_runtime_reconcile_time_seconds_count{controller="status"}`,
			`pgpilot_cluster_phase{cluster="my-db",namespace="image-a",phase="Creating"} 1`,
			`pgpilot_cluster_instances{cluster="my-db",namespace="image-b"} 3`,
			`pgpilot_clusters{phase="Creating"} 2`},
	} {
		testutil.Eventually(t, time.Minute, func() error {
			resp, err := http.Get("http://" + metricsAddr[b] + "/metrics")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			for _, w := range want {
				if !strings.Contains(string(body), w) {
					return fmt.Errorf("the %s's /metrics has no %s", b, w)
				}
			}
			return nil
		})
	}
}

func equalStatus(a, b dbv1.PostgresClusterStatus) bool {
	ua, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&a)
	ub, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&b)
	return cmp.Equal(ua, ub)
}

// start runs bin from dir until the test ends, and shows its output if the test fails.
// The returned channel is closed when the process exits.
func start(t *testing.T, dir, bin string, env []string, args ...string) <-chan struct{} {
	t.Helper()
	var out syncBuffer
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), out.String())
		}
	})
	return done
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
