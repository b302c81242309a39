package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	helmtime "helm.sh/helm/v3/pkg/time"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/plan"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	protoreport "github.com/pgpilot/pgpilot/internal/protocol/report"
	"github.com/pgpilot/pgpilot/test/testutil"
)

const timeout = 30 * time.Second

// The README's example, applied verbatim from config/samples, renders the whole
// topology, and the controller adds credentials and the primary Lease.
func TestExampleRendersTheTopology(t *testing.T) {
	ns := newNamespace(t)
	sample, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", "db_v1_postgrescluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, ns, sample)

	var sts appsv1.StatefulSet
	testutil.Eventually(t, timeout, func() error { return get(ns, "my-db", &sts) })
	if got := *sts.Spec.Replicas; got != 3 {
		t.Errorf("StatefulSet replicas = %d, want 3", got)
	}
	containers := map[string]corev1.Container{}
	for _, c := range append(sts.Spec.Template.Spec.InitContainers, sts.Spec.Template.Spec.Containers...) {
		containers[c.Name] = c
	}
	if got := containers["postgres"].Image; got != "postgres:16.11" {
		t.Errorf("postgres image = %q, want the pinned default for version 16, postgres:16.11", got)
	}
	if got := containers["install-agent"].Image; got != agentImage {
		t.Errorf("agent image = %q, want RELATED_IMAGE_AGENT %q", got, agentImage)
	}
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("update strategy = %s, want OnDelete", sts.Spec.UpdateStrategy.Type)
	}
	if p := sts.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType ||
		p.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("PVC retention = %+v, want Retain on delete and scale", p)
	}

	podLabels := labels.Set(sts.Spec.Template.Labels)
	wantServices := map[string]string{"my-db-rw": dbv1.RolePrimary, "my-db-ro": dbv1.RoleReplica, "my-db-r": "", "my-db-headless": ""}
	for name, role := range wantServices {
		var svc corev1.Service
		if err := get(ns, name, &svc); err != nil {
			t.Errorf("Service %s: %v", name, err)
			continue
		}
		if got := svc.Spec.Selector[dbv1.LabelRole]; got != role {
			t.Errorf("Service %s selects role %q, want %q", name, got, role)
		}
		withRole := labels.Merge(podLabels, labels.Set{dbv1.LabelRole: role})
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(withRole) {
			t.Errorf("Service %s selector %v does not match the pods' labels %v", name, svc.Spec.Selector, withRole)
		}
	}
	for _, obj := range []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "my-db-config"}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "my-db"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "my-db-instance"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "my-db-instance"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "my-db-instance"}},
	} {
		if err := get(ns, obj.GetName(), obj); err != nil {
			t.Errorf("%T %s: %v", obj, obj.GetName(), err)
		}
	}

	var cluster dbv1.PostgresCluster
	testutil.Eventually(t, timeout, func() error { return get(ns, "my-db", &cluster) })
	passwords := map[string]string{}
	var token corev1.Secret
	testutil.Eventually(t, timeout, func() error { return get(ns, "my-db-agent", &token) })
	for _, name := range []string{"my-db-superuser", "my-db-replication", "my-db-app"} {
		var s corev1.Secret
		testutil.Eventually(t, timeout, func() error { return get(ns, name, &s) })
		pw := string(s.Data["password"])
		if len(pw) != 32 || s.Type != corev1.SecretTypeBasicAuth {
			t.Errorf("Secret %s: type %s, password of %d characters; want basic-auth, 32", name, s.Type, len(pw))
		}
		if ref := metav1.GetControllerOf(&s); ref == nil || ref.UID != cluster.UID {
			t.Errorf("Secret %s is not owned by the cluster: %v", name, s.OwnerReferences)
		}
		passwords[name] = pw
	}
	if len(passwords) != 3 || passwords["my-db-app"] == passwords["my-db-superuser"] {
		t.Errorf("passwords are not distinct")
	}

	var lease coordinationv1.Lease
	testutil.Eventually(t, timeout, func() error { return get(ns, "my-db-primary", &lease) })
	if h := lease.Spec.HolderIdentity; h == nil || *h != "my-db-0" {
		t.Errorf("primary Lease holder = %v, want my-db-0", h)
	}

	// Nothing readable from the cluster object or the rendered release reveals a password.
	testutil.Eventually(t, timeout, func() error {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(dbv1.GroupVersion.WithKind("PostgresCluster"))
		if err := get(ns, "my-db", u); err != nil {
			return err
		}
		if name, _, _ := unstructured.NestedString(u.Object, "status", "deployedRelease", "name"); name != "my-db" {
			return fmt.Errorf("status.deployedRelease.name = %q, want my-db", name)
		}
		manifest, err := deployedManifest(ns, "my-db")
		if err != nil {
			return err
		}
		if !strings.Contains(manifest, "kind: StatefulSet") {
			return fmt.Errorf("the deployed release has no StatefulSet yet")
		}
		raw, err := json.Marshal(u.Object)
		if err != nil {
			return err
		}
		for name, pw := range passwords {
			if bytes.Contains(raw, []byte(pw)) {
				t.Fatalf("the password of %s appears in the PostgresCluster object", name)
			}
			if strings.Contains(manifest, pw) {
				t.Fatalf("the password of %s appears in the rendered release", name)
			}
		}
		if strings.Contains(manifest, "kind: Secret") {
			t.Fatalf("the chart rendered a Secret")
		}
		return nil
	})
}

// deployedManifest is the manifest of release's deployed revision, read from its Helm
// release Secret (the release's JSON, gzipped and base64-encoded).
func deployedManifest(ns, release string) (string, error) {
	var secrets corev1.SecretList
	if err := k8s.List(context.Background(), &secrets, client.InNamespace(ns),
		client.MatchingLabels{"owner": "helm", "name": release, "status": "deployed"}); err != nil {
		return "", err
	}
	if len(secrets.Items) != 1 {
		return "", fmt.Errorf("%d deployed revisions of release %s, want 1", len(secrets.Items), release)
	}
	gz, err := base64.StdEncoding.DecodeString(string(secrets.Items[0].Data["release"]))
	if err != nil {
		return "", err
	}
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return "", err
	}
	var rel struct {
		Manifest string `json:"manifest"`
	}
	if err := json.NewDecoder(r).Decode(&rel); err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

// With the instance pods running, the controller labels them by role, fills the status,
// and kubectl's columns show it; readiness changes move the phase.
func TestStatusFollowsThePods(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "db"))
	var sts appsv1.StatefulSet
	testutil.Eventually(t, timeout, func() error { return get(ns, "db", &sts) })
	startPods(t, &sts)

	testutil.Eventually(t, timeout, func() error {
		for i, want := range []string{dbv1.RolePrimary, dbv1.RoleReplica, dbv1.RoleReplica} {
			var pod corev1.Pod
			if err := get(ns, fmt.Sprintf("db-%d", i), &pod); err != nil {
				return err
			}
			if got := pod.Labels[dbv1.LabelRole]; got != want {
				return fmt.Errorf("pod %s role %q, want %q", pod.Name, got, want)
			}
		}
		return nil
	})
	waitForStatus(t, ns, "db", dbv1.PhaseHealthy, 3)
	// The first primary came up: the Lease says so, so no agent will ever initdb again.
	testutil.Eventually(t, timeout, func() error {
		var lease coordinationv1.Lease
		if err := get(ns, "db-primary", &lease); err != nil {
			return err
		}
		if lease.Annotations[dbv1.AnnotationBootstrapped] != "true" {
			return fmt.Errorf("the Lease is not marked bootstrapped: %v", lease.Annotations)
		}
		return nil
	})

	out := kubectl(t, "get", "pgc", "-n", ns)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get pgc printed:\n%s", out)
	}
	header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	if diff := cmp.Diff([]string{"NAME", "VERSION", "INSTANCES", "READY", "PRIMARY", "PHASE", "AGE"}, header); diff != "" {
		t.Errorf("columns (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"db", "16", "3", "3", "db-0", "Healthy"}, row[:len(row)-1]); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}

	setReady(t, ns, "db-2", false)
	waitForStatus(t, ns, "db", dbv1.PhaseDegraded, 2)
	setReady(t, ns, "db-0", false)
	c := waitForStatus(t, ns, "db", dbv1.PhaseUnavailable, 1)
	ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != dbv1.ReasonPrimaryNotReady {
		t.Errorf("Ready condition = %+v, want False/%s", ready, dbv1.ReasonPrimaryNotReady)
	}
	if c.Status.Instances[0].Role != dbv1.RolePrimary || c.Status.Instances[0].Ready {
		t.Errorf("instances[0] = %+v, want the primary, not ready", c.Status.Instances[0])
	}
}

// A spec change is rolled into the StatefulSet, and the Helm manager's status write
// (its Deployed condition and release) leaves the controller's status fields in place: a
// watcher of the cluster never sees it without a phase or a primary.
func TestSpecChangeRollsAndStatusSurvivesHelm(t *testing.T) {
	ns := newNamespace(t)
	sts := startHealthy(t, newCluster(ns, "grow"))
	// Every version of the cluster from here on, as a watcher sees it.
	var healthy dbv1.PostgresCluster
	if err := get(ns, "grow", &healthy); err != nil {
		t.Fatal(err)
	}
	watcher, err := client.NewWithWatch(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watcher.Watch(context.Background(), &dbv1.PostgresClusterList{}, client.InNamespace(ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: healthy.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	if err := update(ns, "grow", func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 5 }); err != nil {
		t.Fatal(err)
	}
	var c dbv1.PostgresCluster
	waitReplicas(t, ns, "grow", sts, 5)
	var role rbacv1.Role
	if err := get(ns, "grow-instance", &role); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(role.Rules), "grow-4") {
		t.Errorf("the pods' Role does not name grow-4 after scaling to 5: %v", role.Rules)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "grow", &c); err != nil {
			return err
		}
		deployed := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionDeployed)
		if deployed == nil || deployed.Reason != "UpgradeSuccessful" {
			return fmt.Errorf("no Deployed/UpgradeSuccessful condition yet: %+v", c.Status.Conditions)
		}
		if r := c.Status.DeployedRelease; r == nil || r.Name != "grow" || r.Manifest != "" {
			return fmt.Errorf("status.deployedRelease = %+v, want the release's name and no manifest", r)
		}
		if c.Status.Phase != dbv1.PhaseDegraded || c.Status.ReadyInstances != 3 || c.Status.CurrentPrimary != "grow-0" ||
			c.Status.ObservedGeneration != c.Generation {
			return fmt.Errorf("status = phase %q, ready %d, primary %q, observedGeneration %d (generation %d)",
				c.Status.Phase, c.Status.ReadyInstances, c.Status.CurrentPrimary, c.Status.ObservedGeneration, c.Generation)
		}
		return nil
	})

	// Normal operation warns of nothing: the release's upgrade emitted no Warning (the
	// operator's own overrides, its images and namespace, are no user's to be warned
	// of). The controllers' Normal events are written, so a Warning would be by now.
	// Only the Helm reconciler's (postgrescluster-controller) are looked at: here no
	// agent answers, and the failover controller rightly warns of that.
	testutil.Eventually(t, timeout, func() error {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		created := false
		for _, e := range events.Items {
			if e.InvolvedObject.Name != "grow" {
				continue
			}
			if e.Type == corev1.EventTypeWarning && e.Source.Component == "postgrescluster-controller" {
				t.Fatalf("Warning event of the Helm reconciler in normal operation: %s: %s", e.Reason, e.Message)
			}
			created = created || e.Reason == dbv1.ReasonCredentialsCreated
		}
		if !created {
			return fmt.Errorf("no CredentialsCreated event yet")
		}
		return nil
	})

	// The versions up to the one just read, Helm's status write among them.
	for seen := ""; seen != c.ResourceVersion; {
		select {
		case ev := <-w.ResultChan():
			v, ok := ev.Object.(*dbv1.PostgresCluster)
			if !ok {
				t.Fatalf("watch event %s: %v", ev.Type, ev.Object)
			}
			seen = v.ResourceVersion
			if v.Status.Phase == "" || v.Status.CurrentPrimary == "" || len(v.Status.Instances) == 0 {
				t.Errorf("resourceVersion %s: the status lost the controller's fields: phase %q, primary %q, %d instances, conditions %v",
					v.ResourceVersion, v.Status.Phase, v.Status.CurrentPrimary, len(v.Status.Instances), v.Status.Conditions)
			}
		case <-time.After(timeout):
			t.Fatalf("the watch did not reach resourceVersion %s", c.ResourceVersion)
		}
	}
}

// A write of a cluster's status alone does not reconcile its Helm release (the
// operator's controllers write status at every change of the instances, a failover's
// included); a change of the spec or the metadata still does.
func TestStatusWritesDoNotReconcileTheRelease(t *testing.T) {
	ns := newNamespace(t)
	startHealthy(t, newCluster(ns, "quiet"))
	before := quietHelm(t)

	const writes = 10
	for i := range writes {
		var c dbv1.PostgresCluster
		if err := get(ns, "quiet", &c); err != nil {
			t.Fatal(err)
		}
		old := c.DeepCopy()
		c.Status.Conditions = append(c.Status.Conditions, dbv1.Condition{Type: fmt.Sprintf("IntegrationProbe%d", i), Status: metav1.ConditionTrue,
			Reason: "Probe", Message: fmt.Sprint(i), LastTransitionTime: metav1.Now()})
		if err := k8s.Status().Patch(context.Background(), &c, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	// The count is the process's: another test's cluster may reconcile meanwhile.
	// Without the filter ten status writes reconcile this one about ten times.
	if n := helmReconciles(t) - before; n > writes/2 {
		t.Errorf("%d status writes were followed by %v reconciles of the Helm release", writes, n)
	}

	before = helmReconciles(t)
	if err := update(ns, "quiet", func(c *dbv1.PostgresCluster) {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, "example.com/touched", "yes")
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if helmReconciles(t) == before {
			return fmt.Errorf("a change of the annotations did not reconcile the Helm release")
		}
		return nil
	})
}

// helmReconciles is how many reconciles the Helm reconciler of PostgresCluster has
// finished in this process, from controller-runtime's metrics.
func helmReconciles(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "postgrescluster-controller" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// quietHelm waits until the Helm reconciler has finished no reconcile for 2 s,
// and returns its count.
func quietHelm(t *testing.T) float64 {
	t.Helper()
	var n float64
	testutil.Eventually(t, timeout, func() error {
		n = helmReconciles(t)
		time.Sleep(2 * time.Second)
		if m := helmReconciles(t); m != n {
			return fmt.Errorf("the Helm reconciler is still busy (%v reconciles in the last 2 s)", m-n)
		}
		return nil
	})
	return n
}

func roles(rs ...any) map[string]any     { return map[string]any{"version": "16", "roles": rs} }
func databases(ds ...any) map[string]any { return map[string]any{"version": "16", "databases": ds} }

// Invalid specs are refused by the API server with a message that says what to fix.
func TestInvalidSpecsAreRejected(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name string
		spec map[string]any
		want string
	}{
		{"no replicas", map[string]any{"replicas": int64(0), "version": "16"}, "should be greater than or equal to 1"},
		{"too many replicas", map[string]any{"replicas": int64(17), "version": "16"}, "should be less than or equal to 16"},
		{"unsupported version", map[string]any{"version": "9"}, `Unsupported value: "9"`},
		{"version missing", map[string]any{"replicas": int64(3)}, "spec.version: Required value"},
		{"system database", map[string]any{"version": "16", "bootstrap": map[string]any{"database": "postgres"}}, "cannot be a PostgreSQL system database"},
		{"reserved owner", map[string]any{"version": "16", "bootstrap": map[string]any{"owner": "pg_monitor"}}, "those roles are reserved"},
		{"zero storage", map[string]any{"version": "16", "storage": map[string]any{"size": "0"}}, "size must be greater than zero"},
		{"more synchronous replicas than replicas", map[string]any{"version": "16", "replicas": int64(2),
			"postgresql": map[string]any{"synchronousReplicas": int64(2)}}, "synchronousReplicas must be less than replicas"},
		{"negative idle slot timeout", map[string]any{"version": "16", "postgresql": map[string]any{"idleSlotTimeout": "-5m"}}, "idleSlotTimeout must be a duration between 0s and 168h"},
		{"idle slot timeout over a week", map[string]any{"version": "16", "postgresql": map[string]any{"idleSlotTimeout": "200h"}}, "idleSlotTimeout must be a duration between 0s and 168h"},
		{"zero read lag", map[string]any{"version": "16", "postgresql": map[string]any{"maxReadLag": "0s"}}, "maxReadLag must be a duration between 1s and 24h"},
		{"read lag over a day", map[string]any{"version": "16", "postgresql": map[string]any{"maxReadLag": "25h"}}, "maxReadLag must be a duration between 1s and 24h"},
		{"a client of no selector", map[string]any{"version": "16", "networkPolicy": map[string]any{"clients": []any{map[string]any{}}}},
			"each of clients needs a podSelector, a namespaceSelector or an ipBlock"},
		{"a metrics scraper of no selector", map[string]any{"version": "16", "networkPolicy": map[string]any{"metricsScrapers": []any{map[string]any{}}}},
			"each of metricsScrapers needs a podSelector, a namespaceSelector or an ipBlock"},
		{"the superuser as a role", roles(map[string]any{"name": "postgres"}), "role name is reserved"},
		{"a pg_ role", roles(map[string]any{"name": "pg_monitor"}), "role name is reserved"},
		{"the replication role", roles(map[string]any{"name": "pgpilot_replication"}), "role name is reserved"},
		{"a name of pgpilot's", roles(map[string]any{"name": "pgpilot_backup"}), "role name is reserved"},
		{"a role name to quote", roles(map[string]any{"name": "Robert'); DROP"}), "spec.roles[0].name in body should match"},
		{"a role twice", roles(map[string]any{"name": "a"}, map[string]any{"name": "a"}), "Duplicate value"},
		{"a member of itself", roles(map[string]any{"name": "a", "inRoles": []any{"a"}}), "a role cannot be a member of itself"},
		{"the bootstrap owner as a role", roles(map[string]any{"name": "app"}), "roles cannot name the bootstrap owner"},
		{"a member of pg_execute_server_program", roles(map[string]any{"name": "a", "inRoles": []any{"readers", "pg_execute_server_program"}}), "inRoles cannot name postgres (the superuser), pg_execute_server_program"},
		{"a member of pg_read_server_files", roles(map[string]any{"name": "a", "inRoles": []any{"pg_read_server_files"}}), "inRoles cannot name"},
		{"a member of pg_write_server_files", roles(map[string]any{"name": "a", "inRoles": []any{"pg_write_server_files"}}), "inRoles cannot name"},
		{"a member of the superuser", roles(map[string]any{"name": "a", "inRoles": []any{"postgres"}}), "inRoles cannot name"},
		{"a member of the replication role", roles(map[string]any{"name": "a", "inRoles": []any{"pgpilot_replication"}}), "inRoles cannot name"},
		{"a member of the monitoring role", roles(map[string]any{"name": "a", "inRoles": []any{"pgpilot_monitor"}}), "inRoles cannot name"},
		{"createrole on 15", map[string]any{"version": "15", "roles": []any{map[string]any{"name": "a", "createrole": true}}}, "roles cannot have createrole with PostgreSQL 14 or 15"},
		{"template1", databases(map[string]any{"name": "template1", "owner": "a"}), "database name is reserved"},
		{"a database without owner", databases(map[string]any{"name": "d"}), "a database needs an owner unless ensure is absent"},
		{"the bootstrap database dropped", databases(map[string]any{"name": "app", "ensure": "absent"}), "the bootstrap database cannot be ensured absent"},
		{"an extension name to quote", databases(map[string]any{"name": "d", "owner": "a", "extensions": []any{"x\"; DROP"}}), "should match"},
	}
	postgresql := func(pg map[string]any) map[string]any {
		return map[string]any{"version": "16", "replicas": int64(3), "postgresql": pg}
	}
	parameters := func(kv ...string) map[string]any {
		m := map[string]any{"work_mem": "8MB"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return postgresql(map[string]any{"parameters": m})
	}
	type invalid = struct {
		name string
		spec map[string]any
		want string
	}
	const managed = "parameters managed by pgpilot or that run shell commands cannot be set"
	for _, p := range dbv1.ManagedParameters {
		cases = append(cases, invalid{"managed parameter " + p, parameters(p, "x"), managed})
	}
	const libraries = "libraries must come from PostgreSQL's own library directory"
	for _, p := range []string{"shared_preload_libraries", "session_preload_libraries", "local_preload_libraries", "jit_provider"} {
		cases = append(cases, invalid{p + " by path", parameters(p, "pg_stat_statements,/var/lib/postgresql/data/x"), libraries})
	}
	cases = append(cases, invalid{"dynamic_library_path", parameters("dynamic_library_path", "$libdir:/tmp"), libraries})
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": dbv1.GroupVersion.String(), "kind": "PostgresCluster",
				"metadata": map[string]any{"name": fmt.Sprintf("bad-%d", i), "namespace": ns},
				"spec":     tc.spec,
			}}
			err := k8s.Create(context.Background(), u)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an Invalid error containing %q", err, tc.want)
			}
		})
	}
	t.Run("safe libraries, memberships and createrole from 16 are accepted", func(t *testing.T) {
		spec := parameters("shared_preload_libraries", "pg_stat_statements, auto_explain", "dynamic_library_path", "$libdir")
		spec["roles"] = []any{map[string]any{"name": "a", "createrole": true, "inRoles": []any{"pg_monitor", "pg_read_all_data", "readers"}}}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": dbv1.GroupVersion.String(), "kind": "PostgresCluster",
			"metadata": map[string]any{"name": "safe", "namespace": ns},
			"spec":     spec,
		}}
		if err := k8s.Create(context.Background(), u); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("name too long", func(t *testing.T) {
		err := k8s.Create(context.Background(), newCluster(ns, strings.Repeat("a", 51)))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "at most 50 characters") {
			t.Fatalf("got %v", err)
		}
	})
}

// What the CRD cannot check (its CEL cost budget does not allow a rule over every key
// and value of a map) the operator checks before it renders anything: the cluster says
// what is wrong in its Ready condition, and nothing is deployed until it is fixed.
func TestParametersTheCRDCannotCheck(t *testing.T) {
	ns := newNamespace(t)
	for i, tc := range []struct {
		params   map[string]string
		requests corev1.ResourceList
		want     string
	}{
		{params: map[string]string{"RESTORE_COMMAND": "touch /tmp/x"}},
		{params: map[string]string{"work_mem = 1\narchive_command": "x"}},
		{params: map[string]string{"application_name": "a\nb"}},
		{params: map[string]string{"fsync": "off"}},
		{params: map[string]string{"Shared_Preload_Libraries": "/tmp/x"}},
		{params: map[string]string{"shared_buffers": "200GB"}}, // above the 2Gi memory limit
		{params: map[string]string{"max_connections": "3"}},    // no room for the agent's sessions
		// The API server would refuse only the StatefulSet's pod.
		{requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")}, want: "spec.resources: requests.memory 3Gi is above limits.memory 2Gi"},
	} {
		if tc.want == "" {
			tc.want = "spec.postgresql.parameters: "
		}
		c := newCluster(ns, fmt.Sprintf("unchecked-%d", i))
		c.Spec.PostgreSQL.Parameters = tc.params
		c.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}
		c.Spec.Resources.Requests = tc.requests
		create(t, c)
		testutil.Eventually(t, timeout, func() error {
			if err := get(ns, c.Name, c); err != nil {
				return err
			}
			ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
			if c.Status.Phase != dbv1.PhaseFailed || ready == nil || !strings.Contains(ready.Message, tc.want) {
				return fmt.Errorf("phase %q, Ready %+v", c.Status.Phase, ready)
			}
			return nil
		})
		if err := get(ns, c.Name, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			t.Errorf("%+v: the StatefulSet was rendered (%v)", tc, err)
		}
	}

	// Fixed, the cluster renders.
	if err := update(ns, "unchecked-3", func(c *dbv1.PostgresCluster) {
		c.Spec.PostgreSQL.AllowUnsafeDurability = true
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error { return get(ns, "unchecked-3", &appsv1.StatefulSet{}) })
}

// Changes that would lose data or cannot be carried out are refused on update.
func TestUnsafeUpdatesAreRejected(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name   string
		change func(*dbv1.PostgresCluster)
		want   string
	}{
		{"shrink storage", func(c *dbv1.PostgresCluster) { withStorage("5Gi", "fast")(c) }, "size cannot shrink from 10Gi to 5Gi"},
		{"change storage class", func(c *dbv1.PostgresCluster) { withStorage("10Gi", "slow")(c) }, "storageClassName cannot be changed"},
		{"drop storage class", func(c *dbv1.PostgresCluster) { c.Spec.Storage.StorageClassName = nil }, "storageClassName cannot be changed"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(ns, fmt.Sprintf("upd-%d", i), withStorage("10Gi", "fast"))
			create(t, c)
			err := update(ns, c.Name, tc.change)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an Invalid error containing %q", err, tc.want)
			}
		})
	}
	t.Run("grow storage and upgrade are accepted", func(t *testing.T) {
		create(t, newCluster(ns, "upd-ok", withStorage("10Gi", "fast")))
		err := update(ns, "upd-ok", func(c *dbv1.PostgresCluster) {
			withStorage("20Gi", "fast")(c)
			c.Spec.Version = "17"
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// spec.version follows the data: free while the cluster has none; once the primary's
// major version is recorded (the failover controller writes it in the report, the
// status controller shows it), an older version is refused at admission, a newer one
// is an upgrade, and the data's version stays accepted (the way back).
func TestVersionFollowsTheData(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "ver"))
	testutil.Eventually(t, timeout, func() error { return get(ns, "ver-primary", &coordinationv1.Lease{}) })
	for _, v := range []string{"17", "15", "16"} {
		if err := update(ns, "ver", func(c *dbv1.PostgresCluster) { c.Spec.Version = v }); err != nil {
			t.Fatalf("version %s before the cluster has data: %v", v, err)
		}
	}

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var l coordinationv1.Lease
		if err := get(ns, "ver-primary", &l); err != nil {
			return err
		}
		// Where an operator before the cluster's report kept it: the failover
		// controller moves it into the report and off the Lease.
		metav1.SetMetaDataAnnotation(&l.ObjectMeta, primarylease.LegacyDataVersion, "16")
		return k8s.Update(context.Background(), &l)
	})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		var c dbv1.PostgresCluster
		if err := get(ns, "ver", &c); err != nil {
			return err
		}
		if c.Status.DataVersion != "16" {
			return fmt.Errorf("status.dataVersion %q", c.Status.DataVersion)
		}
		var l coordinationv1.Lease
		if err := get(ns, "ver-primary", &l); err != nil {
			return err
		}
		if v, ok := l.Annotations[primarylease.LegacyDataVersion]; ok {
			return fmt.Errorf("the Lease still holds the data version %q", v)
		}
		var rep corev1.ConfigMap
		if err := get(ns, "ver-report", &rep); err != nil {
			return err
		}
		if v := protoreport.Parse(&rep).DataVersion; v != "16" {
			return fmt.Errorf("the report's data version %q", v)
		}
		return nil
	})
	// An older major is refused; a newer one is an upgrade: the pods get its image and
	// carry the data's programs from the image they ran it with; and back again.
	err = update(ns, "ver", func(c *dbv1.PostgresCluster) { c.Spec.Version = "15" })
	if want := "spec.version cannot change from 16 to 15: the data is PostgreSQL 16"; !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("version 15: got %v, want an Invalid error containing %q", err, want)
	}
	carried := func(sts appsv1.StatefulSet) string {
		for _, c := range sts.Spec.Template.Spec.InitContainers {
			if c.Name == plan.CarryContainer {
				return c.Image
			}
		}
		return ""
	}
	for _, step := range []struct{ version, image, carry string }{
		{"17", "postgres:17.7", "postgres:16.11"},
		{"16", "postgres:16.11", ""},
	} {
		if err := update(ns, "ver", func(c *dbv1.PostgresCluster) { c.Spec.Version = step.version }); err != nil {
			t.Fatalf("version %s: %v", step.version, err)
		}
		testutil.Eventually(t, timeout, func() error {
			var sts appsv1.StatefulSet
			if err := get(ns, "ver", &sts); err != nil {
				return err
			}
			if image, carry := sts.Spec.Template.Spec.Containers[0].Image, carried(sts); image != step.image || carry != step.carry {
				return fmt.Errorf("version %s: image %q carrying %q, want %q carrying %q", step.version, image, carry, step.image, step.carry)
			}
			return nil
		})
	}
	if err := update(ns, "ver", func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 2 }); err != nil {
		t.Errorf("another change with the data's version: %v", err)
	}
}

// Deleting a cluster removes what the chart rendered and keeps the volumes and the
// primary Lease; the credentials Secrets are owned by the cluster for the garbage
// collector (which envtest does not run).
func TestDeleteKeepsVolumes(t *testing.T) {
	ns := newNamespace(t)
	c := newCluster(ns, "gone")
	create(t, c)
	var sts appsv1.StatefulSet
	testutil.Eventually(t, timeout, func() error { return get(ns, "gone", &sts) })
	for i := range 3 {
		create(t, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("data-gone-%d", i), Namespace: ns, Labels: sts.Spec.Selector.MatchLabels},
			Spec:       sts.Spec.VolumeClaimTemplates[0].Spec,
		})
	}
	testutil.Eventually(t, timeout, func() error { return get(ns, "gone-primary", &coordinationv1.Lease{}) })

	if err := k8s.Delete(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "gone", &dbv1.PostgresCluster{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster still there (%v)", err)
		}
		return nil
	})
	for _, obj := range []client.Object{&appsv1.StatefulSet{}, &corev1.Service{}, &corev1.ConfigMap{}} {
		name := map[string]string{"*v1.StatefulSet": "gone", "*v1.Service": "gone-rw", "*v1.ConfigMap": "gone-config"}[fmt.Sprintf("%T", obj)]
		if err := get(ns, name, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s survived the cluster (%v)", obj, name, err)
		}
	}
	for i := range 3 {
		if err := get(ns, fmt.Sprintf("data-gone-%d", i), &corev1.PersistentVolumeClaim{}); err != nil {
			t.Errorf("volume data-gone-%d: %v", i, err)
		}
	}
	if err := get(ns, "gone-primary", &coordinationv1.Lease{}); err != nil {
		t.Errorf("primary Lease: %v", err)
	}

	// The cluster is created again on its kept volumes, its Lease deleted too: nothing
	// tells it from a new cluster but the volumes, older than it. No instance is named
	// the first primary (with an empty volume it would run initdb and serve an empty
	// database) until the agents have reported what their volumes hold.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "gone-primary", Namespace: ns}}
	if err := k8s.Delete(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of a second
	create(t, newCluster(ns, "gone"))
	testutil.Eventually(t, timeout, func() error {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "gone" && e.Reason == dbv1.ReasonNoPrimary &&
				strings.Contains(e.Message, "waiting for the agents of gone-0, gone-1, gone-2") {
				return nil
			}
		}
		return errors.New("no event says the first primary waits for the agents of the kept volumes")
	})
	if err := get(ns, "gone-primary", &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("a primary Lease was created for a cluster on kept volumes whose agents did not answer (%v)", err)
	}
}

// The Helm manager watches what it rendered and puts back a hand-edited or deleted
// object, each time: a release it remembers as unchanged is read back after any change
// its watches see.
func TestDriftIsReverted(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "drift"))
	var svc corev1.Service
	testutil.Eventually(t, timeout, func() error { return get(ns, "drift-rw", &svc) })
	for round := range 2 {
		testutil.Eventually(t, timeout, func() error {
			if err := get(ns, "drift-rw", &svc); err != nil {
				return err
			}
			svc.Spec.Selector[dbv1.LabelRole] = dbv1.RoleReplica
			return k8s.Update(context.Background(), &svc)
		})
		testutil.Eventually(t, timeout, func() error {
			if err := get(ns, "drift-rw", &svc); err != nil {
				return err
			}
			if got := svc.Spec.Selector[dbv1.LabelRole]; got != dbv1.RolePrimary {
				return fmt.Errorf("edit %d: drift-rw still selects role %q", round+1, got)
			}
			return nil
		})

		var ro corev1.Service
		testutil.Eventually(t, timeout, func() error { return get(ns, "drift-ro", &ro) })
		if err := k8s.Delete(context.Background(), &ro); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, timeout, func() error {
			var again corev1.Service
			if err := get(ns, "drift-ro", &again); err != nil {
				return err
			}
			if again.UID == ro.UID {
				return fmt.Errorf("deletion %d: drift-ro not deleted yet", round+1)
			}
			return nil
		})
	}
}

// A revision left pending by an operation that never ended (a manager killed mid-way,
// an upgrade whose rollback failed too) is marked failed, and the spec is rendered
// again: helm-operator-plugins alone refuses every later operation on such a release
// ("another operation (install/upgrade/rollback) is in progress"), and the cluster
// stays Irreconcilable.
func TestAReleaseLeftPendingIsRecovered(t *testing.T) {
	ns := newNamespace(t)
	sts := startHealthy(t, newCluster(ns, "stuck"))
	store := driver.NewSecrets(kubernetes.NewForConfigOrDie(cfg).CoreV1().Secrets(ns))
	var deployed *release.Release
	testutil.Eventually(t, timeout, func() error {
		rels, err := store.Query(map[string]string{"name": "stuck", "owner": "helm", "status": "deployed"})
		if err != nil {
			return err
		}
		deployed = rels[0]
		return nil
	})
	// What a manager killed in the middle of an upgrade leaves, an hour ago.
	pending := *deployed
	info := *deployed.Info
	info.Status, info.Description = release.StatusPendingUpgrade, "Preparing upgrade"
	info.LastDeployed = helmtime.Time{Time: time.Now().Add(-time.Hour)}
	pending.Info, pending.Version = &info, deployed.Version+1
	if err := store.Create(fmt.Sprintf("sh.helm.release.v1.stuck.v%d", pending.Version), &pending); err != nil {
		t.Fatal(err)
	}

	if err := update(ns, "stuck", func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 4 }); err != nil {
		t.Fatal(err)
	}
	waitReplicas(t, ns, "stuck", sts, 4)
	testutil.Eventually(t, timeout, func() error {
		rels, err := store.Query(map[string]string{"name": "stuck", "owner": "helm", "status": "deployed"})
		if err != nil {
			return err
		}
		if len(rels) != 1 || rels[0].Version <= pending.Version {
			return fmt.Errorf("deployed revisions %v, want one after %d", versions(rels), pending.Version)
		}
		return nil
	})
	left, err := store.Get(fmt.Sprintf("sh.helm.release.v1.stuck.v%d", pending.Version))
	if err != nil {
		t.Fatal(err)
	}
	if left.Info.Status != release.StatusFailed {
		t.Errorf("the revision left pending is %s, want failed", left.Info.Status)
	}
	var c dbv1.PostgresCluster
	if err := get(ns, "stuck", &c); err != nil {
		t.Fatal(err)
	}
	if cond := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionIrreconcilable); cond != nil && cond.Status == metav1.ConditionTrue {
		t.Errorf("Irreconcilable: %s", cond.Message)
	}
}

func versions(rels []*release.Release) []int {
	var out []int
	for _, r := range rels {
		out = append(out, r.Version)
	}
	return out
}

// A Secret the user created beforehand is used as it is; one without a password is
// reported; passwords never change once created.
func TestCredentials(t *testing.T) {
	ns := newNamespace(t)
	create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "own-app", Namespace: ns},
		Type:       corev1.SecretTypeBasicAuth,
		Data:       map[string][]byte{"username": []byte("app"), "password": []byte("chosen-by-the-user")},
	})
	create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "own-superuser", Namespace: ns},
		Data:       map[string][]byte{"username": []byte("postgres")},
	})
	create(t, newCluster(ns, "own"))
	var repl corev1.Secret
	testutil.Eventually(t, timeout, func() error { return get(ns, "own-replication", &repl) })

	var c dbv1.PostgresCluster
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "own", &c); err != nil {
			return err
		}
		cond := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionCredentialsReady)
		if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, `Secret own-superuser has no "password" key`) {
			return fmt.Errorf("CredentialsReady = %+v", cond)
		}
		return nil
	})
	var app corev1.Secret
	if err := get(ns, "own-app", &app); err != nil || string(app.Data["password"]) != "chosen-by-the-user" {
		t.Errorf("the user's app Secret was changed: %v %q", err, app.Data["password"])
	}

	if err := update(ns, "own", func(c *dbv1.PostgresCluster) { c.Spec.Replicas = 2 }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "own", &c); err != nil {
			return err
		}
		if c.Status.ObservedGeneration != c.Generation {
			return fmt.Errorf("generation %d not observed yet", c.Generation)
		}
		return nil
	})
	var again corev1.Secret
	if err := get(ns, "own-replication", &again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Data["password"], repl.Data["password"]) {
		t.Error("the replication password changed")
	}
}

// With the Prometheus Operator's CRDs present, monitoring.enabled renders a PodMonitor
// and a PrometheusRule, and the MonitoringReady condition says so.
func TestMonitoringRendersAPodMonitor(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "mon", withMonitoring()))
	testutil.Eventually(t, timeout, func() error {
		for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion("monitoring.coreos.com/v1")
			u.SetKind(kind)
			if err := get(ns, "mon", u); err != nil {
				return err
			}
		}
		var dash corev1.ConfigMap
		if err := get(ns, "mon-dashboard", &dash); err != nil {
			return err
		}
		if dash.Labels["grafana_dashboard"] != "1" || !strings.Contains(dash.Data["pgpilot-"+ns+"-mon.json"], `"uid": "pgpilot-`+ns+`-mon"`) {
			return fmt.Errorf("the dashboard ConfigMap is not Grafana's dashboard sidecar's: labels %v", dash.Labels)
		}
		var c dbv1.PostgresCluster
		if err := get(ns, "mon", &c); err != nil {
			return err
		}
		cond := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionMonitoringReady)
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != dbv1.ReasonPrometheusOperatorFound {
			return fmt.Errorf("MonitoringReady is %+v", cond)
		}
		return nil
	})

	// The release stores the dashboard in its values, not in its chart, and no schema.
	rel := storedRelease(t, ns, "mon")
	if len(rel.Chart.Schema) > 0 {
		t.Errorf("the release stores the chart's values schema (%d bytes)", len(rel.Chart.Schema))
	}
	for _, f := range rel.Chart.Files {
		if f.Name == plan.DashboardFile {
			t.Errorf("the release stores %s in its chart", f.Name)
		}
	}
	if p, _ := rel.Config["plan"].(map[string]any); p == nil || !strings.Contains(fmt.Sprint(p["dashboard"]), "PGPILOT_CLUSTER") {
		t.Error("the release's values carry no dashboard")
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// storedRelease is the last release of cluster name as Helm's Secrets driver stored it.
func storedRelease(t *testing.T, ns, name string) *release.Release {
	t.Helper()
	var list corev1.SecretList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm", "name": name}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Secret
	for i := range list.Items {
		if last == nil || atoi(list.Items[i].Labels["version"]) > atoi(last.Labels["version"]) {
			last = &list.Items[i]
		}
	}
	if last == nil {
		t.Fatalf("no release Secret of %s", name)
	}
	compressed, err := base64.StdEncoding.DecodeString(string(last.Data["release"]))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(compressed))
	if err != nil {
		t.Fatal(err)
	}
	var rel release.Release
	if err := json.NewDecoder(zr).Decode(&rel); err != nil {
		t.Fatal(err)
	}
	return &rel
}

// startHealthy creates c, starts its pods and waits until it is Healthy; it returns
// its StatefulSet.
func startHealthy(t *testing.T, c *dbv1.PostgresCluster) *appsv1.StatefulSet {
	t.Helper()
	create(t, c)
	var sts appsv1.StatefulSet
	testutil.Eventually(t, timeout, func() error { return get(c.Namespace, c.Name, &sts) })
	startPods(t, &sts)
	waitForStatus(t, c.Namespace, c.Name, dbv1.PhaseHealthy, c.Spec.Replicas)
	return &sts
}

func waitForStatus(t *testing.T, ns, name string, phase dbv1.Phase, ready int32) *dbv1.PostgresCluster {
	t.Helper()
	var c dbv1.PostgresCluster
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, name, &c); err != nil {
			return err
		}
		if c.Status.Phase != phase || c.Status.ReadyInstances != ready {
			return fmt.Errorf("phase %q with %d ready, want %q with %d", c.Status.Phase, c.Status.ReadyInstances, phase, ready)
		}
		return nil
	})
	return &c
}

// kubectl runs the kubectl built with the control plane against it, as a cluster admin.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "kubectl-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k, err := admin.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := k.Run(args...)
	out, _ := io.ReadAll(stdout)
	if err != nil {
		msg, _ := io.ReadAll(stderr)
		t.Fatalf("kubectl %v: %v: %s", args, err, msg)
	}
	return string(out)
}

// Why an instance does not run reaches the cluster: the kubelet's word on a pod (killed
// for memory), the StatefulSet's on a pod it cannot create, each in
// status.instances[].message or the Ready condition, with an event when it begins and
// when it ends.
func TestWhyAnInstanceDoesNotRunIsTold(t *testing.T) {
	ns := newNamespace(t)
	sts := startHealthy(t, newCluster(ns, "why"))
	ctx := context.Background()

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pod corev1.Pod
		if err := get(ns, "why-1", &pod); err != nil {
			return err
		}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "postgres", Image: "postgres:16",
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}}
		return k8s.Status().Update(ctx, &pod)
	})
	if err != nil {
		t.Fatal(err)
	}
	c := waitForStatus(t, ns, "why", dbv1.PhaseDegraded, 2)
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "why", c); err != nil {
			return err
		}
		if msg := c.Status.Instances[1].Message; !strings.Contains(msg, "OOMKilled") || !strings.Contains(msg, "killed for memory") {
			return fmt.Errorf("instances[1].message %q, want it killed for memory", msg)
		}
		ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
		if ready == nil || ready.Reason != dbv1.ReasonInstanceNotRunning || !strings.Contains(ready.Message, "why-1 keeps exiting") {
			return fmt.Errorf("Ready %+v, want %s naming why-1", ready, dbv1.ReasonInstanceNotRunning)
		}
		return nil
	})

	// A pod the StatefulSet cannot create: its FailedCreate event names the cause.
	if err := k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "why-2"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	create(t, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "why.failedcreate"},
		InvolvedObject: corev1.ObjectReference{Kind: "StatefulSet", APIVersion: "apps/v1", Namespace: ns, Name: sts.Name, UID: sts.UID},
		Reason:         "FailedCreate", Type: corev1.EventTypeWarning, Count: 1,
		Message:        `create Pod why-2 in StatefulSet why failed error: pods "why-2" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2`,
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Source: corev1.EventSource{Component: "statefulset-controller"},
	})
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "why", c); err != nil {
			return err
		}
		ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
		if ready == nil || !strings.Contains(ready.Message, `why-2 has no pod: the StatefulSet cannot create it: create Pod why-2 in StatefulSet why failed error: pods "why-2" is forbidden: exceeded quota`) {
			return fmt.Errorf("Ready %+v, want why-2's quota named", ready)
		}
		return nil
	})

	setReady(t, ns, "why-1", true)
	testutil.Eventually(t, timeout, func() error {
		var events corev1.EventList
		if err := k8s.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		var told, ended bool
		for _, e := range events.Items {
			if e.InvolvedObject.Kind != "PostgresCluster" {
				continue
			}
			told = told || e.Reason == dbv1.ReasonInstanceNotRunning && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "why-1 keeps exiting")
			ended = ended || e.Reason == dbv1.ReasonInstanceRunning && e.Message == "why-1 runs again"
		}
		if !told || !ended {
			return fmt.Errorf("events: why-1's problem told %v, its end told %v", told, ended)
		}
		return nil
	})
}
