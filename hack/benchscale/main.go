// Command benchscale is `make bench-scale`: what the operator costs at 10 to 1,000
// PostgresClusters. On a real kube-apiserver and etcd without nodes it runs the operator
// as it is deployed (the manager and the controller as two processes, with the
// arguments and environment of config/'s Deployment, as its ServiceAccount), and a
// hollow kubelet (internal/tools/hollow) that gives every instance a pod and an agent
// API over a scripted state, so the controller's observation loop and its failovers run
// as they would against real instances. For each N it prints the processes' memory and
// CPU (idle and during a wave of spec changes), their API requests per second by verb,
// create → rendered and spec change → rendered, and failure → promotion when one
// primary fails; and, to read those by, why the controller found clusters unsettled, its
// heap and goroutines, and how far apart the hollow primaries renewed their Leases
// (agents renew every second; a harness that cannot keeps every cluster unsettled).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/internal/tools/hollow"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// interrupted is set once the run is interrupted: every wait ends.
var interrupted atomic.Bool

func main() {
	sizes := flag.String("n", "10,100,300,1000", "Cluster counts to measure, in increasing order; each adds clusters to the previous.")
	namespaces := flag.Int("namespaces", 10, "Namespaces the clusters are spread across.")
	failures := flag.Int("failures", 10, "Primaries failed one after another at each N.")
	probes := flag.Int("probes", 20, "Clusters created one at a time at each N to time create → rendered.")
	idle := flag.Duration("idle", time.Minute, "How long the idle figures are measured at each N.")
	settle := flag.Duration("settle", 30*time.Second, "How long to wait after a wave before the idle figures.")
	logDir := flag.String("log-dir", "bin/bench-scale", "Where the operator's logs are written.")
	wave := flag.Bool("wave", true, "Measure a wave of spec changes at each N (false: skip it, for the failures' figures sooner).")
	profile := flag.Bool("profile", false, "Serve each process's Go profiles and save a CPU profile of each, idle and during the wave, into -log-dir.")
	flag.Parse()
	// The operator under test logs to its own files; the harness's libraries say nothing.
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "benchscale: -n: %q is not a cluster count\n", f)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	b := &bench{namespaces: *namespaces, failures: *failures, probes: *probes, idle: *idle, settle: *settle, logDir: *logDir, profile: *profile, wave: *wave}
	if err := b.run(ns); err != nil {
		fmt.Fprintln(os.Stderr, "benchscale:", err)
		os.Exit(1)
	}
}

type bench struct {
	namespaces, failures, probes int
	idle, settle                 time.Duration
	logDir                       string
	profile                      bool
	wave                         bool

	root     string
	client   client.Client
	kubelet  *hollow.Kubelet
	procs    []*process
	clusters []types.NamespacedName
	seen     *seen
	results  []result
}

// result is what one N measured.
type result struct {
	n                                  int
	waveRendered, waveHealthy          time.Duration
	drained                            time.Duration
	waveUnrendered, waveUnhealthy      int
	idle, wave                         usage
	createP50, createP95               time.Duration
	changeP50, changeP95               time.Duration
	changeMissing                      int
	promoteP50, promoteP95, promoteMax time.Duration
	promoteMissing                     int
	releaseSecretBytes, releaseSecrets int64
	// renewalGaps are the times between two renewals of a Lease by the hollow
	// primaries while idle, sorted: agents renew every second.
	renewalGaps []time.Duration
}

func (b *bench) run(sizes []int) error {
	root, err := devenv.RepoRoot()
	if err != nil {
		return err
	}
	b.root = root
	if err := os.MkdirAll(filepath.Join(root, b.logDir), 0o755); err != nil {
		return err
	}
	fmt.Println("Building the manager and the controller...")
	for _, bin := range []string{"manager", "controller"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(root, "bin", bin), "./cmd/"+bin)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building %s: %w", bin, err)
		}
	}
	fmt.Println("Starting a kube-apiserver and etcd...")
	env, err := devenv.ControlPlane(root)
	if err != nil {
		return err
	}
	// Three Services a cluster need a cluster IP each: envtest's /24 holds 84 clusters.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.96.0.0/16")
	if err := devenv.StartPrepared(env); err != nil {
		return err
	}
	defer env.Stop() //nolint:errcheck // best effort on the way out
	// Interrupted, it still stops the control plane and the operator on its way out.
	sigCtx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// A process of the operator that exits in the middle (the manager losing its
	// leader Lease to an overloaded API server, a crash) ends the run with that said:
	// its figures would be nobody's.
	ctx, fail := context.WithCancelCause(sigCtx)
	defer fail(nil)
	go func() { <-ctx.Done(); interrupted.Store(true) }()
	if _, err := devenv.InstallOperator(ctx, env.Config, root); err != nil {
		return err
	}
	admin := rest.CopyConfig(env.Config)
	admin.QPS, admin.Burst = 1000, 2000
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := dbv1.AddToScheme(scheme); err != nil {
		return err
	}
	if b.client, err = client.New(admin, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	kubeconfig, err := operatorKubeconfig(env, filepath.Join(root, b.logDir, "kubeconfig"))
	if err != nil {
		return err
	}
	if b.procs, err = startOperator(ctx, fail, root, kubeconfig, filepath.Join(root, b.logDir), b.profile); err != nil {
		return err
	}
	defer func() {
		for _, p := range b.procs {
			p.stop()
		}
	}()
	if b.kubelet, err = hollow.Start(ctx, admin, logr.Discard()); err != nil {
		return err
	}
	if b.seen, err = watch(ctx, admin, scheme); err != nil {
		return err
	}
	for i := range b.namespaces {
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceName(i)}}
		if err := b.client.Create(ctx, nsObj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	for _, n := range sizes {
		r, err := b.measure(ctx, n)
		if cause := context.Cause(ctx); cause != nil {
			return cause
		}
		if err != nil {
			return err
		}
		b.results = append(b.results, r)
		b.print(os.Stdout)
	}
	return nil
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func namespaceName(i int) string { return fmt.Sprintf("scale-%d", i) }

// measure grows the fleet to n clusters and measures it.
func (b *bench) measure(ctx context.Context, n int) (result, error) {
	r := result{n: n}
	fmt.Printf("\n== N=%d: creating %d clusters\n", n, n-len(b.clusters))
	created := b.create(ctx, n-len(b.clusters), 32)
	r.waveRendered, r.waveUnrendered = b.waitAll(created, b.seen.rendered, 30*time.Minute)
	fmt.Printf("   every StatefulSet rendered after %s (%d not)\n", r.waveRendered.Round(time.Second), r.waveUnrendered)
	r.waveHealthy, r.waveUnhealthy = b.waitAll(created, b.seen.healthy, 30*time.Minute)
	fmt.Printf("   every cluster Healthy after %s (%d not)\n", r.waveHealthy.Round(time.Second), r.waveUnhealthy)

	// Idle is idle: the Helm manager's queue holds the wave's follow-up reconciles
	// (each install's release Secret queues one) for a while after the last cluster is
	// Healthy, and a probe created before it empties waits behind them.
	r.drained = b.drain(ctx, 30*time.Minute)
	fmt.Printf("   every queue of the manager empty after %s more\n", r.drained.Round(time.Second))
	fmt.Printf("   settling %s, then measuring idle for %s\n", b.settle, b.idle)
	sleep(ctx, b.settle)
	b.kubelet.RenewalGaps() // from the idle span alone
	r.idle = b.usage(func() {
		b.profiles(fmt.Sprintf("idle-%d", n), b.idle)
		sleep(ctx, b.idle)
	})
	r.renewalGaps = b.kubelet.RenewalGaps()
	for i, p := range b.procs {
		fmt.Printf("    idle: %s RSS %.0f MB, CPU %.2f cores\n", p.name, r.idle.rss[i]/1e6, r.idle.cpu[i])
	}

	fmt.Printf("   creating %d clusters one at a time\n", b.probes)
	var creates []time.Duration
	for range b.probes {
		c := b.create(ctx, 1, 1)
		d, missing := b.waitAll(c, b.seen.rendered, time.Minute)
		if missing == 0 {
			creates = append(creates, d)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	r.createP50, r.createP95 = testutil.Percentile(creates, 0.50), testutil.Percentile(creates, 0.95)
	// The probes are part of the fleet from now on; wait until they run.
	b.waitAll(b.clusters[len(b.clusters)-b.probes:], b.seen.healthy, 5*time.Minute)

	if b.wave {
		fmt.Printf("   changing a setting of all %d clusters\n", len(b.clusters))
		var changes []time.Duration
		r.wave = b.usage(func() {
			b.profiles(fmt.Sprintf("wave-%d", n), 20*time.Second)
			changes, r.changeMissing = b.changeAll(ctx, 32, 10*time.Minute)
		})
		r.changeP50, r.changeP95 = testutil.Percentile(changes, 0.50), testutil.Percentile(changes, 0.95)
		sleep(ctx, 10*time.Second)
	}

	fmt.Printf("   failing %d primaries one after another\n", b.failures)
	var promotions []time.Duration
	for range b.failures {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		d, err := b.failPrimary(ctx)
		if err != nil {
			fmt.Println("   ", err)
			r.promoteMissing++
			continue
		}
		fmt.Printf("    failure → promotion %s\n", d.Round(10*time.Millisecond))
		promotions = append(promotions, d)
	}
	r.promoteP50, r.promoteP95 = testutil.Percentile(promotions, 0.50), testutil.Percentile(promotions, 0.95)
	if len(promotions) > 0 {
		r.promoteMax = slices.Max(promotions)
	}
	r.releaseSecrets, r.releaseSecretBytes = b.releaseSecrets(ctx)
	return r, nil
}

// profiles saves a CPU profile of each process over d, in the background, and a heap
// profile of each as it starts.
func (b *bench) profiles(what string, d time.Duration) {
	if !b.profile {
		return
	}
	for _, p := range b.procs {
		p.save("heap", filepath.Join(b.root, b.logDir, p.name+"-"+what+"-heap.pprof"))
		go p.save(fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), filepath.Join(b.root, b.logDir, p.name+"-"+what+".pprof"))
	}
}

// create makes count README-example clusters, concurrently with workers, and returns
// them once all are created.
func (b *bench) create(ctx context.Context, count, workers int) []types.NamespacedName {
	first := len(b.clusters)
	keys := make([]types.NamespacedName, count)
	for i := range keys {
		idx := first + i
		keys[i] = types.NamespacedName{Namespace: namespaceName(idx % b.namespaces), Name: fmt.Sprintf("db-%d", idx)}
	}
	forEach(keys, workers, func(key types.NamespacedName) {
		pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
			Spec: dbv1.PostgresClusterSpec{Replicas: 3, Version: "16"}}
		b.seen.created(key, time.Now())
		for {
			err := b.client.Create(ctx, pgc)
			if err == nil || apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
				break
			}
			fmt.Println("    creating", key, ":", err)
			time.Sleep(time.Second)
		}
	})
	b.clusters = append(b.clusters, keys...)
	return keys
}

// forEach calls do for every key, from workers goroutines, and returns when all are done.
func forEach(keys []types.NamespacedName, workers int, do func(types.NamespacedName)) {
	work := make(chan types.NamespacedName)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range work {
				do(key)
			}
		}()
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
}

// waitAll waits until at(key) is known for every key or timeout passes; it returns the
// longest time from creation (or the last change) and how many never got there.
func (b *bench) waitAll(keys []types.NamespacedName, at func(types.NamespacedName) (time.Duration, bool), timeout time.Duration) (time.Duration, int) {
	deadline := time.Now().Add(timeout)
	for {
		var longest time.Duration
		missing := 0
		for _, k := range keys {
			d, ok := at(k)
			if !ok {
				missing++
				continue
			}
			longest = max(longest, d)
		}
		if missing == 0 || time.Now().After(deadline) || interrupted.Load() {
			return longest, missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// changeAll sets work_mem on every cluster, concurrently with workers, and returns how
// long each took to reach its rendered ConfigMap.
func (b *bench) changeAll(ctx context.Context, workers int, timeout time.Duration) ([]time.Duration, int) {
	value := fmt.Sprintf("%dkB", 4096+rand.IntN(4096))
	b.seen.expect(value)
	forEach(b.clusters, workers, func(key types.NamespacedName) {
		patch := []byte(`{"spec":{"postgresql":{"parameters":{"work_mem":"` + value + `"}}}}`)
		pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
		b.seen.changed(key, time.Now())
		if err := b.client.Patch(ctx, pgc, client.RawPatch(types.MergePatchType, patch)); err != nil {
			fmt.Println("    changing", key, ":", err)
		}
	})
	b.waitAll(b.clusters, b.seen.changeRendered, timeout)
	var ds []time.Duration
	missing := 0
	for _, k := range b.clusters {
		if d, ok := b.seen.changeRendered(k); ok {
			ds = append(ds, d)
		} else {
			missing++
		}
	}
	return ds, missing
}

// failPrimary kills the primary of a random cluster and returns how long until the
// operator promoted another instance; the old primary then comes back as a standby.
func (b *bench) failPrimary(ctx context.Context) (time.Duration, error) {
	key := b.clusters[rand.IntN(len(b.clusters))]
	primary := b.kubelet.Primary(key.Namespace, key.Name)
	if primary == "" {
		return 0, fmt.Errorf("%s has no primary", key)
	}
	for len(b.kubelet.Promotions()) > 0 {
		<-b.kubelet.Promotions()
	}
	killed, err := b.kubelet.Kill(key.Namespace, primary)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := b.kubelet.Revive(ctx, key.Namespace, primary); err != nil {
			fmt.Println("    reviving", primary, ":", err)
		}
		time.Sleep(3 * time.Second)
	}()
	timeout := time.After(time.Minute)
	for {
		select {
		case p := <-b.kubelet.Promotions():
			if p.Namespace == key.Namespace && strings.HasPrefix(p.Pod, key.Name+"-") {
				return p.At.Sub(killed), nil
			}
		case <-timeout:
			return 0, fmt.Errorf("no promotion in %s a minute after its primary %s died", key, primary)
		}
	}
}

// releaseSecrets counts Helm's release Secrets and their bytes.
func (b *bench) releaseSecrets(ctx context.Context) (count, bytes int64) {
	var list corev1.SecretList
	if err := b.client.List(ctx, &list, client.MatchingLabels{"owner": "helm"}); err != nil {
		return 0, 0
	}
	for _, s := range list.Items {
		count++
		for _, v := range s.Data {
			bytes += int64(len(v))
		}
	}
	return count, bytes
}

// usage is what the operator's processes used over a span.
type usage struct {
	seconds float64
	// cpu in cores and rss in bytes (at the end), by process.
	cpu, rss []float64
	// requests per second by process and verb.
	requests []map[string]float64
	// observations per second of the failover controller's, by kind (full, quiet,
	// unvouched), by process.
	observations []map[string]float64
	// unsettled cycles per second of the failover controller's, by reason, by process.
	unsettled []map[string]float64
	// heap (in use) and stacks in bytes, and goroutines, at the end, by process.
	heap, stacks, goroutines []float64
}

func (b *bench) usage(during func()) usage {
	u := usage{}
	cpu0 := make([]float64, len(b.procs))
	req0 := make([]map[string]float64, len(b.procs))
	obs0 := make([]map[string]float64, len(b.procs))
	uns0 := make([]map[string]float64, len(b.procs))
	for i, p := range b.procs {
		cpu0[i] = p.cpuSeconds()
		m := p.scrape()
		req0[i] = m.requests()
		obs0[i] = m.counters("pgpilot_failover_observations_total", "kind")
		uns0[i] = m.counters("pgpilot_failover_unsettled_cycles_total", "reason")
	}
	rates := func(now, before map[string]float64) map[string]float64 {
		per := map[string]float64{}
		for k, v := range now {
			per[k] = (v - before[k]) / u.seconds
		}
		return per
	}
	start := time.Now()
	during()
	u.seconds = time.Since(start).Seconds()
	for i, p := range b.procs {
		u.cpu = append(u.cpu, (p.cpuSeconds()-cpu0[i])/u.seconds)
		u.rss = append(u.rss, p.rss())
		m := p.scrape()
		u.requests = append(u.requests, rates(m.requests(), req0[i]))
		u.observations = append(u.observations, rates(m.counters("pgpilot_failover_observations_total", "kind"), obs0[i]))
		u.unsettled = append(u.unsettled, rates(m.counters("pgpilot_failover_unsettled_cycles_total", "reason"), uns0[i]))
		g := m.gauges("go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines")
		u.heap, u.stacks, u.goroutines = append(u.heap, g[0]), append(u.stacks, g[1]), append(u.goroutines, g[2])
	}
	return u
}

func (b *bench) print(w io.Writer) {
	header := "| |"
	sep := "|---|"
	for _, r := range b.results {
		header += fmt.Sprintf(" N=%d |", r.n)
		sep += "---|"
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, header)
	fmt.Fprintln(w, sep)
	row := func(name string, cell func(r result) string) {
		line := "| " + name + " |"
		for _, r := range b.results {
			line += " " + cell(r) + " |"
		}
		fmt.Fprintln(w, line)
	}
	mb := func(v float64) string { return fmt.Sprintf("%.0f MB", v/1e6) }
	ms := func(d time.Duration) string {
		if d < 10*time.Second {
			return fmt.Sprintf("%.2f s", d.Seconds())
		}
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	// waved is a wave figure, "-" where no wave was measured (-wave=false).
	waved := func(r result, f func(u usage) string) string {
		if len(r.wave.rss) == 0 {
			return "-"
		}
		return f(r.wave)
	}
	for i, p := range b.procs {
		row(p.name+" RSS idle / wave", func(r result) string {
			return mb(r.idle.rss[i]) + " / " + waved(r, func(u usage) string { return mb(u.rss[i]) })
		})
		row(p.name+" heap in use / stacks / goroutines idle", func(r result) string {
			return fmt.Sprintf("%s / %s / %.0f", mb(r.idle.heap[i]), mb(r.idle.stacks[i]), r.idle.goroutines[i])
		})
		row(p.name+" CPU idle / wave (cores)", func(r result) string {
			return fmt.Sprintf("%.2f / ", r.idle.cpu[i]) + waved(r, func(u usage) string { return fmt.Sprintf("%.2f", u.cpu[i]) })
		})
		row(p.name+" API req/s idle", func(r result) string { return verbs(r.idle.requests[i]) })
		row(p.name+" API req/s wave", func(r result) string { return waved(r, func(u usage) string { return verbs(u.requests[i]) }) })
		if len(b.results) > 0 && len(b.results[0].idle.observations[i]) > 0 {
			row(p.name+" agent observations/s idle", func(r result) string { return verbs(r.idle.observations[i]) })
			row(p.name+" unsettled cycles/s idle", func(r result) string { return verbs(r.idle.unsettled[i]) })
		}
	}
	row("harness: Lease renewal gap idle p50 / p95 / max", func(r result) string {
		g := r.renewalGaps
		if len(g) == 0 {
			return "-"
		}
		return ms(g[len(g)/2]) + " / " + ms(g[len(g)*95/100]) + " / " + ms(g[len(g)-1])
	})
	row("both RSS idle", func(r result) string {
		var sum float64
		for _, v := range r.idle.rss {
			sum += v
		}
		return mb(sum)
	})
	row("create wave: all rendered / all Healthy", func(r result) string {
		s := ms(r.waveRendered) + " / " + ms(r.waveHealthy)
		if r.waveUnrendered+r.waveUnhealthy > 0 {
			s += fmt.Sprintf(" (%d, %d missing)", r.waveUnrendered, r.waveUnhealthy)
		}
		return s
	})
	row("create wave: manager's queue empty after Healthy", func(r result) string { return ms(r.drained) })
	row("create → rendered p50 / p95", func(r result) string { return ms(r.createP50) + " / " + ms(r.createP95) })
	row("spec change → rendered p50 / p95", func(r result) string {
		s := ms(r.changeP50) + " / " + ms(r.changeP95)
		if r.changeMissing > 0 {
			s += fmt.Sprintf(" (%d missing)", r.changeMissing)
		}
		return s
	})
	row("primary failure → promotion p50 / p95 / max", func(r result) string {
		s := ms(r.promoteP50) + " / " + ms(r.promoteP95) + " / " + ms(r.promoteMax)
		if r.promoteMissing > 0 {
			s += fmt.Sprintf(" (%d missing)", r.promoteMissing)
		}
		return s
	})
	row("Helm release Secrets (count, MB)", func(r result) string {
		return fmt.Sprintf("%d, %.1f MB", r.releaseSecrets, float64(r.releaseSecretBytes)/1e6)
	})
}

func verbs(m map[string]float64) string {
	var keys []string
	for k, v := range m {
		if v >= 0.05 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, m[k]))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, ", ")
}

// operatorKubeconfig writes a kubeconfig that acts as the operator's ServiceAccount.
func operatorKubeconfig(env *envtest.Environment, path string) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "bench-scale", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	raw, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		return "", err
	}
	for _, a := range kc.AuthInfos {
		a.Impersonate = "system:serviceaccount:" + devenv.OperatorNamespace + ":" + devenv.OperatorServiceAccount
		a.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + devenv.OperatorNamespace, "system:authenticated"}
	}
	return path, clientcmd.WriteToFile(*kc, path)
}

// process is one of the operator's containers, run as a process.
type process struct {
	name    string
	cmd     *exec.Cmd
	metrics string
	// pprof is the address of its Go profiles; "" when not served.
	pprof string
	// exited is closed once the process has exited; stopping is set by stop.
	exited   chan struct{}
	stopping atomic.Bool
}

// save saves the process's profile /debug/pprof/<which> into file.
func (p *process) save(which, file string) {
	if p.pprof == "" {
		return
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s", p.pprof, which)) //nolint:gosec,noctx // the local process's profile
	if err != nil {
		fmt.Println("    profiling", p.name, ":", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

// startOperator starts the manager and the controller with the arguments and the
// environment of config/default's Deployment.
// fail is called with what happened when one exits before it is stopped.
func startOperator(ctx context.Context, fail context.CancelCauseFunc, root, kubeconfig, logDir string, profile bool) ([]*process, error) {
	objs, err := devenv.BuildKustomization(filepath.Join(root, "config", "default"))
	if err != nil {
		return nil, err
	}
	var dep appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep); err != nil {
				return nil, err
			}
		}
	}
	if len(dep.Spec.Template.Spec.Containers) == 0 {
		return nil, errors.New("config/default has no Deployment")
	}
	var procs []*process
	for i, c := range dep.Spec.Template.Spec.Containers {
		p := &process{name: c.Name, exited: make(chan struct{})}
		bin := filepath.Join(root, "bin", filepath.Base(c.Command[0]))
		args := slices.Clone(c.Args)
		if c.Name == "controller" {
			// The controller's own election (4 s / 2.5 s / 0.5 s) makes it stop when the
			// API server does not take a renewal for 2.5 s, which the overloaded control
			// plane of this bench at 1,000 clusters does (docs/architecture.md, "Fifth
			// round"). One replica runs here, so nothing would take over: the bench keeps
			// the durations its earlier rounds ran with.
			args = append(args, "--leader-election-lease-duration=15s", "--leader-election-renew-deadline=10s",
				"--leader-election-retry-period=2s")
		}
		if profile {
			p.pprof = fmt.Sprintf("127.0.0.1:%d", 6060+i)
			args = append(args, "--pprof-bind-address="+p.pprof)
		}
		p.cmd = exec.CommandContext(ctx, bin, args...)
		p.cmd.Dir = root
		p.cmd.Env = []string{"KUBECONFIG=" + kubeconfig, "PATH=" + os.Getenv("PATH")}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				p.cmd.Env = append(p.cmd.Env, e.Name+"="+e.Value)
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
				p.cmd.Env = append(p.cmd.Env, e.Name+"=pgpilot-bench-scale")
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
				p.cmd.Env = append(p.cmd.Env, e.Name+"="+devenv.OperatorNamespace)
			case e.ValueFrom.ResourceFieldRef != nil:
				q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
				p.cmd.Env = append(p.cmd.Env, e.Name+"="+strconv.FormatInt(q.Value(), 10))
			default:
				return nil, fmt.Errorf("container %s: cannot set %s outside a pod", c.Name, e.Name)
			}
		}
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok {
				p.metrics = "http://127.0.0.1" + v[strings.LastIndex(v, ":"):] + "/metrics"
			}
		}
		logPath := filepath.Join(logDir, c.Name+".log")
		logFile, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
		if err := p.cmd.Start(); err != nil {
			return nil, err
		}
		go func() {
			err := p.cmd.Wait()
			close(p.exited)
			if !p.stopping.Load() {
				fail(fmt.Errorf("the %s exited during the run (%v); the last lines of %s say why", p.name, err, logPath))
			}
		}()
		procs = append(procs, p)
	}
	return procs, nil
}

func (p *process) stop() {
	p.stopping.Store(true)
	_ = p.cmd.Process.Signal(os.Interrupt)
	<-p.exited
}

// cpuSeconds is the CPU time the process used so far (user and system).
func (p *process) cpuSeconds() float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which is in parentheses.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// rss is the process's resident memory in bytes.
func (p *process) rss() float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb * 1024
		}
	}
	return 0
}

// drain waits until the first process (the Helm manager) has nothing queued, within
// limit, and returns how long it waited.
func (b *bench) drain(ctx context.Context, limit time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < limit && ctx.Err() == nil {
		if depth, ok := b.procs[0].queued(); ok && depth == 0 {
			break
		}
		sleep(ctx, time.Second)
	}
	return time.Since(start)
}

// queued is how many requests the process's controllers have queued
// (controller-runtime's workqueue_depth, summed); false when it cannot be read.
func (p *process) queued() (float64, bool) {
	m := p.scrape()
	if m == nil {
		return 0, false
	}
	var depth float64
	for _, line := range m {
		if strings.HasPrefix(line, "workqueue_depth{") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				return 0, false
			}
			depth += v
		}
	}
	return depth, true
}

// scrape is one reading of a process's metrics, a line each; nil when it serves none
// or could not be read whole.
type scrape []string

func (p *process) scrape() scrape {
	if p.metrics == "" {
		return nil
	}
	resp, err := http.Get(p.metrics) //nolint:gosec,noctx // the local process's metrics
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var lines scrape
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if s.Err() != nil {
		return nil
	}
	return lines
}

// requests are the API requests so far by verb (client-go's rest_client_requests_total).
func (m scrape) requests() map[string]float64 {
	return m.counters("rest_client_requests_total", "method")
}

// counters are the counter series named name so far, summed by the value of their
// label.
func (m scrape) counters(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range m {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		i := strings.Index(line, label+`="`)
		if i < 0 {
			continue
		}
		verb := line[i+len(label+`="`):]
		verb = verb[:strings.IndexByte(verb, '"')]
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			out[verb] += v
		}
	}
	return out
}

// gauges are the values of the unlabelled series names, 0 for one not found.
func (m scrape) gauges(names ...string) []float64 {
	out := make([]float64, len(names))
	for _, line := range m {
		for i, name := range names {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				out[i], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out
}

// seen records when each cluster was created and changed, and when its objects showed
// it, from the harness's own informers.
type seen struct {
	mu               sync.Mutex
	createdAt        map[types.NamespacedName]time.Time
	renderedAt       map[types.NamespacedName]time.Time
	healthyAt        map[types.NamespacedName]time.Time
	changedAt        map[types.NamespacedName]time.Time
	changeRenderedAt map[types.NamespacedName]time.Time
	value            string
}

func watch(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) (*seen, error) {
	s := &seen{createdAt: map[types.NamespacedName]time.Time{}, renderedAt: map[types.NamespacedName]time.Time{},
		healthyAt: map[types.NamespacedName]time.Time{}, changedAt: map[types.NamespacedName]time.Time{},
		changeRenderedAt: map[types.NamespacedName]time.Time{}}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, err
	}
	handlers := map[client.Object]func(any){
		&appsv1.StatefulSet{}: func(o any) {
			if sts, ok := o.(*appsv1.StatefulSet); ok {
				s.note(s.renderedAt, types.NamespacedName{Namespace: sts.Namespace, Name: sts.Name})
			}
		},
		&corev1.ConfigMap{}: func(o any) {
			cm, ok := o.(*corev1.ConfigMap)
			cluster := ""
			if ok {
				cluster = cm.Labels[dbv1.LabelCluster]
			}
			if cluster == "" || cm.Name != dbv1.NamesOf(cluster).ConfigMap() {
				return
			}
			s.mu.Lock()
			value := s.value
			s.mu.Unlock()
			if value != "" && strings.Contains(cm.Data["config.json"], value) {
				s.note(s.changeRenderedAt, types.NamespacedName{Namespace: cm.Namespace, Name: cluster})
			}
		},
		&dbv1.PostgresCluster{}: func(o any) {
			if pgc, ok := o.(*dbv1.PostgresCluster); ok && pgc.Status.Phase == dbv1.PhaseHealthy {
				s.note(s.healthyAt, types.NamespacedName{Namespace: pgc.Namespace, Name: pgc.Name})
			}
		},
	}
	for obj, h := range handlers {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: h, UpdateFunc: func(_, o any) { h(o) }}); err != nil {
			return nil, err
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("the harness's cache did not sync")
	}
	return s, nil
}

func (s *seen) note(m map[types.NamespacedName]time.Time, key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := m[key]; !ok {
		m[key] = time.Now()
	}
}

func (s *seen) created(key types.NamespacedName, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.createdAt[key] = at
}

func (s *seen) changed(key types.NamespacedName, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changedAt[key] = at
}

// expect starts a wave of changes to value.
func (s *seen) expect(value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.value = value
	s.changeRenderedAt = map[types.NamespacedName]time.Time{}
}

func (s *seen) since(m, from map[types.NamespacedName]time.Time, key types.NamespacedName) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := m[key]
	if !ok {
		return 0, false
	}
	return max(0, at.Sub(from[key])), true
}

func (s *seen) rendered(key types.NamespacedName) (time.Duration, bool) {
	return s.since(s.renderedAt, s.createdAt, key)
}

func (s *seen) healthy(key types.NamespacedName) (time.Duration, bool) {
	return s.since(s.healthyAt, s.createdAt, key)
}

func (s *seen) changeRendered(key types.NamespacedName) (time.Duration, bool) {
	return s.since(s.changeRenderedAt, s.changedAt, key)
}
