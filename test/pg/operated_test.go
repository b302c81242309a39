package pg

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// newOperatedCluster creates a PostgresCluster for the operator to run, and prepares
// its instances from what the operator renders and creates: config.json from the
// ConfigMap, the credentials and the agent token from the Secrets. Pods are created from
// the StatefulSet's template when the instances start, and a kubelet stand-in reports
// each pod's IP and its agent's readiness.
func newOperatedCluster(t testing.TB, n int, opts ...func(*dbv1.PostgresCluster)) *cluster {
	t.Helper()
	return newOperatedClusterIn(t, "", n, opts...)
}

// newOperatedClusterIn is newOperatedCluster in namespace ns, which exists and whose
// first cluster's operator runs this one too; "" makes a namespace and an operator of
// the cluster's own.
func newOperatedClusterIn(t testing.TB, ns string, n int, opts ...func(*dbv1.PostgresCluster)) *cluster {
	t.Helper()
	c, k := nextCluster(t)
	ctx := context.Background()
	if ns != "" {
		c.namespace = ns
	} else if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace}}); err != nil {
		t.Fatal(err)
	}
	if ns == "" {
		c.startOperator()
	} else {
		c.stopOperator = func() {} // the namespace's first cluster's operator runs it
	}
	pgc := &dbv1.PostgresCluster{
		ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: c.namespace},
		Spec:       dbv1.PostgresClusterSpec{Replicas: int32(n), Version: "15"},
	}
	for _, o := range opts {
		o(pgc)
	}
	if err := k8s.Create(ctx, pgc); err != nil {
		t.Fatal(err)
	}
	get := func(name string, obj client.Object) error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, obj)
	}
	var cm corev1.ConfigMap
	testutil.Eventually(t, time.Minute, func() error { return get(dbv1.NamesOf(c.name).ConfigMap(), &cm) })
	testutil.Eventually(t, time.Minute, func() error { return get(c.name, &c.sts) })
	mustWrite(t, filepath.Join(c.dir, "config.json"), []byte(c.mountVolumes(cm.Data["config.json"])))
	names := dbv1.NamesOf(c.name)
	secretFiles := map[string]string{"superuser": names.SuperuserSecret(), "replication": names.ReplicationSecret(), "app": names.AppSecret()}
	for dir, secret := range secretFiles {
		var s corev1.Secret
		testutil.Eventually(t, time.Minute, func() error { return get(secret, &s) })
		mustMkdir(t, filepath.Join(c.dir, "secrets", dir), 0o755)
		mustWrite(t, filepath.Join(c.dir, "secrets", dir, "username"), s.Data["username"])
		mustWrite(t, filepath.Join(c.dir, "secrets", dir, "password"), s.Data["password"])
		cred := pgconf.Credential{Username: string(s.Data["username"]), Password: string(s.Data["password"])}
		switch dir {
		case "superuser":
			c.creds.Superuser = cred
		case "replication":
			c.creds.Replication = cred
		case "app":
			c.creds.App = cred
		}
	}
	var tok corev1.Secret
	testutil.Eventually(t, time.Minute, func() error { return get(dbv1.NamesOf(c.name).AgentTokenSecret(), &tok) })
	c.token = string(tok.Data["token"])
	c.mountTLS()
	c.addInstances(k, n)
	kubeletCtx, stopKubelet := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.kubelet(kubeletCtx) }()
	t.Cleanup(func() { stopKubelet(); wg.Wait(); c.stopAll(); c.stopOperator() })
	return c
}

// mountVolumes does what the kubelet does for the backup stores the postgres container
// mounts: Secret volumes become files (their keys renamed by items), claims become
// directories shared by every cluster of the test run (keyed by claim name). It returns
// config.json with the mount paths pointing there.
func (c *cluster) mountVolumes(config string) string {
	c.t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range c.sts.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, ctr := range c.sts.Spec.Template.Spec.Containers {
		if ctr.Name != "postgres" {
			continue
		}
		for _, m := range ctr.VolumeMounts {
			v := volumes[m.Name]
			var local string
			switch {
			case v.Secret != nil && (strings.HasPrefix(m.Name, "backup-") || strings.HasPrefix(m.Name, "restore-")):
				local = filepath.Join(c.dir, "mounts", m.Name)
				var s corev1.Secret
				testutil.Eventually(c.t, time.Minute, func() error {
					return k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: v.Secret.SecretName}, &s)
				})
				mustMkdir(c.t, local, 0o755)
				for _, item := range v.Secret.Items {
					mustWrite(c.t, filepath.Join(local, item.Path), s.Data[item.Key])
				}
			case v.PersistentVolumeClaim != nil && strings.HasSuffix(m.Name, "-store"):
				local = filepath.Join(workDir, "claims", v.PersistentVolumeClaim.ClaimName)
				mustMkdir(c.t, local, 0o755)
			default:
				continue
			}
			chownR(c.t, local)
			config = strings.ReplaceAll(config, `"`+m.MountPath, `"`+local)
		}
	}
	return config
}

// startOperator starts an operator (Helm manager and controller) for this cluster's test.
// It watches the cluster's namespace only, as an operator deployed with
// WATCH_NAMESPACE does: the operators of tests running in parallel each run their own
// clusters. Its log is kept, and shown with the agents' when the test fails.
func (c *cluster) startOperator() {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if c.operatorLog == nil {
		c.operatorLog = &bytes.Buffer{}
	}
	log := zap.New(zap.WriteTo(syncWriter(c.operatorLog)), zap.UseDevMode(false))
	errs, err := devenv.StartOperator(ctx, operatorConfig, repoRoot, devenv.OperatorOptions{Namespaces: []string{c.namespace}, Log: log})
	if err != nil {
		cancel()
		c.t.Fatal(err)
	}
	c.stopOperator = func() {
		cancel()
		for range 2 {
			if err := <-errs; err != nil {
				c.t.Logf("the operator stopped: %v", err)
			}
		}
	}
}

// kubelet does for the cluster's pods what the StatefulSet controller and the kubelet
// would: it creates each started instance's pod from the template (labelled with
// c.revision), sets its IP, and keeps its Ready condition equal to its agent's /readyz,
// every 100 ms. A pod deleted by someone else restarts: its agent is stopped (SIGTERM)
// and started again, and the pod is created anew.
func (c *cluster) kubelet(ctx context.Context) {
	ready := map[string]bool{}
	created := map[string]bool{}
	missed := map[string]int{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(c.namespace), client.MatchingLabels{dbv1.LabelCluster: c.name}); err != nil {
			continue
		}
		existing := map[string]*corev1.Pod{}
		for i := range pods.Items {
			existing[pods.Items[i].Name] = &pods.Items[i]
		}
		for _, in := range c.instances {
			if in.cmd == nil {
				continue
			}
			if p := existing[in.pod]; created[in.pod] && (p == nil || !p.DeletionTimestamp.IsZero()) {
				// As the kubelet does: the pod stays Terminating while its agent stops
				// (a primary hands over meanwhile, seen by the operator as a pod being
				// deleted, not as one gone), and goes once it has.
				primary := c.holder()
				in.stop()
				if p != nil {
					_ = k8s.Delete(ctx, p, client.GracePeriodSeconds(0))
				}
				// Recorded once the agent runs again, so that a restart counted is one
				// done; with who was primary as the pod went.
				in.start()
				c.mu.Lock()
				c.restarts = append(c.restarts, restart{pod: in.pod, primary: primary})
				c.mu.Unlock()
				created[in.pod], created[in.pod+"/status"], ready[in.pod], missed[in.pod] = false, false, false, 0
				continue
			}
			if !created[in.pod] {
				if err := c.createPod(ctx, in); err != nil {
					continue
				}
				created[in.pod] = true
			}
			now, answered := in.readyz(ctx)
			if !answered {
				// As the kubelet's failureThreshold: an agent slow to answer under load
				// stays ready until it misses three probes in a row.
				if missed[in.pod]++; missed[in.pod] < probeFailureThreshold {
					continue
				}
			} else {
				missed[in.pod] = 0
			}
			if now == ready[in.pod] && created[in.pod+"/status"] {
				continue
			}
			if c.setPodStatus(ctx, in, now) == nil {
				ready[in.pod], created[in.pod+"/status"] = now, true
			}
		}
	}
}

// probeClient probes as the kubelet does: HTTPS without verifying the certificate.
var probeClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet's probes do not verify either
}}

// probeFailureThreshold is the chart's readinessProbe.failureThreshold: how many probes in
// a row an agent may leave unanswered before its pod is not ready.
const probeFailureThreshold = 3

// readyz is the kubelet's readiness probe: GET /readyz on the agent. answered is false
// when no answer came in time (a refused connection answers: the agent is not there).
func (in *instance) readyz(ctx context.Context) (ready, answered bool) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "https://"+in.ip+":8008/readyz", nil)
	if err != nil {
		return false, true
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false, !errors.Is(err, context.DeadlineExceeded)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, true
}

func (c *cluster) createPod(ctx context.Context, in *instance) error {
	labels := map[string]string{}
	for k, v := range c.sts.Spec.Template.Labels {
		labels[k] = v
	}
	c.mu.Lock()
	if c.revision != "" {
		labels[appsv1.ControllerRevisionHashLabelKey] = c.revision
	}
	c.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: in.pod, Namespace: c.namespace, Labels: labels},
		Spec:       *c.sts.Spec.Template.Spec.DeepCopy(),
	}
	for _, claim := range c.sts.Spec.VolumeClaimTemplates {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: claim.Name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name + "-" + in.pod}}})
	}
	pod.Spec.NodeName = "node-a"
	return k8s.Create(ctx, pod)
}

func (c *cluster) setPodStatus(ctx context.Context, in *instance, ready bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pod corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: in.pod}, &pod); err != nil {
			return err
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = in.ip
		pod.Status.PodIPs = []corev1.PodIP{{IP: in.ip}}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		return k8s.Status().Update(ctx, &pod)
	})
}

// readWrite is the instance the read-write Service routes to now: the Ready pod its
// selector matches, as kube-proxy would pick; nil when there is none or several.
func (c *cluster) readWrite() *instance {
	ctx := context.Background()
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: dbv1.NamesOf(c.name).ReadWriteService()}, &svc); err != nil {
		return nil
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(c.namespace), client.MatchingLabelsSelector{Selector: labels.SelectorFromSet(svc.Spec.Selector)}); err != nil {
		return nil
	}
	var endpoints []*instance
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() {
			continue // a terminating pod is no endpoint of a Service
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				for _, in := range c.instances {
					if in.ip == p.Status.PodIP {
						endpoints = append(endpoints, in)
					}
				}
			}
		}
	}
	if len(endpoints) != 1 {
		return nil
	}
	return endpoints[0]
}

// writeThroughRW inserts a row through the read-write Service's endpoint.
func (c *cluster) writeThroughRW(sql string, args ...any) error {
	in := c.readWrite()
	if in == nil {
		return fmt.Errorf("the read-write Service has no single ready endpoint")
	}
	return in.exec(sql, args...)
}
