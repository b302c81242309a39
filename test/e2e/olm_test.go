//go:build e2e && olm

package e2e

// pgpilot installed the ways its users install it, through OLM on the local node
// (make olm-e2e: OLM built from source, images in the node's registry): operator-sdk
// run bundle, a Subscription from a catalog (as OperatorHub does), and an upgrade to a
// next version through a manually approved InstallPlan. After each install the
// README's example cluster becomes Healthy and fails over with no acknowledged row
// lost. These tests need the olm build tag besides e2e; make e2e does not run them.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	scapiv1alpha3 "github.com/operator-framework/api/pkg/apis/scorecard/v1alpha3"
	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The install's names: the namespace docs/install.md installs into, the package and
// the operator's Deployment as the bundle names them.
const (
	olmInstallNamespace = "pgpilot-system"
	olmPackage          = "pgpilot"
	olmDeployment       = "pgpilot-controller-manager"
)

// olmEnv is what hack/olm/e2e.sh passes: images, versions, tools. Each must be set.
func olmEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run make olm-e2e", name)
	}
	return v
}

// olmClient is a client that knows OLM's types besides pgpilot's and Kubernetes'.
func olmClient(t *testing.T) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := operatorsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// controller-runtime's client logs nothing the tests read.
	ctrllog.SetLogger(logr.Discard())
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// localImages is the operator's environment on this node: the PostgreSQL image of the
// local major (Debian's PostgreSQL 15, built here) instead of the official image the CSV
// names, given through the Subscription's config as OLM provides for.
func localImages(t *testing.T) []corev1.EnvVar {
	return []corev1.EnvVar{{Name: "RELATED_IMAGE_POSTGRES_" + version, Value: olmEnv(t, "E2E_POSTGRES_IMAGE")}}
}

// installNamespace creates pgpilot-system, enforcing the restricted Pod Security
// Standard when restricted, as docs/install.md writes it, and deletes it at the end.
func installNamespace(t *testing.T, c client.Client, restricted bool) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: olmInstallNamespace}}
	if restricted {
		ns.Labels = map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}
	}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), ns)
		testutil.Eventually(t, 3*time.Minute, func() error {
			err := c.Get(context.Background(), client.ObjectKeyFromObject(ns), &corev1.Namespace{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("namespace %s still there (%v)", ns.Name, err)
		})
	})
}

// waitCSV waits until the CSV name in the install namespace has Succeeded.
func waitCSV(t *testing.T, c client.Client, name string, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		var csv v1alpha1.ClusterServiceVersion
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: name}, &csv); err != nil {
			return err
		}
		if csv.Status.Phase != v1alpha1.CSVPhaseSucceeded {
			return fmt.Errorf("CSV %s is %s: %s", name, csv.Status.Phase, csv.Status.Message)
		}
		return nil
	})
}

// waitOperator waits until the operator's Deployment has rolled out with image and the
// environment env (OLM applies a Subscription's config to it).
func waitOperator(t *testing.T, c client.Client, image string, env []corev1.EnvVar, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		var dep appsv1.Deployment
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: olmDeployment}, &dep); err != nil {
			return err
		}
		for _, ctr := range dep.Spec.Template.Spec.Containers {
			if ctr.Image != image {
				return fmt.Errorf("container %s runs %s, want %s", ctr.Name, ctr.Image, image)
			}
			for _, want := range env {
				if !slices.Contains(ctr.Env, want) {
					return fmt.Errorf("container %s has no %s=%s yet", ctr.Name, want.Name, want.Value)
				}
			}
		}
		st := dep.Status
		if st.ObservedGeneration != dep.Generation || st.UpdatedReplicas != *dep.Spec.Replicas ||
			st.AvailableReplicas != *dep.Spec.Replicas || st.Replicas != *dep.Spec.Replicas {
			return fmt.Errorf("deployment %s: %d updated, %d available, %d in all of %d", dep.Name,
				st.UpdatedReplicas, st.AvailableReplicas, st.Replicas, *dep.Spec.Replicas)
		}
		// The Deployment's counts leave out terminating pods, and an old operator pod
		// that still runs may still lead: wait until only the new ones are left.
		var pods corev1.PodList
		if err := c.List(context.Background(), &pods, client.InNamespace(olmInstallNamespace), client.MatchingLabels(dep.Spec.Selector.MatchLabels)); err != nil {
			return err
		}
		if len(pods.Items) != int(*dep.Spec.Replicas) {
			return fmt.Errorf("%d operator pods, want %d", len(pods.Items), *dep.Spec.Replicas)
		}
		for _, p := range pods.Items {
			for _, ctr := range p.Spec.Containers {
				if p.DeletionTimestamp != nil || ctr.Image != image {
					return fmt.Errorf("operator pod %s (%s) is on its way out", p.Name, ctr.Image)
				}
			}
		}
		return nil
	})
}

// exampleFailsOver is the README's example (3 instances, the local image's major):
// it becomes Healthy, takes writes, its primary's pod is deleted, another instance
// takes writes, the old primary comes back as a replica, and no acknowledged row is
// lost. The cluster is deleted at the end, while the operator still runs (its
// finalizer needs it).
func exampleFailsOver(t *testing.T) {
	t.Helper()
	d := newDB(t, 3)
	d.waitHealthy(3, 10*time.Minute)
	w := d.newTable()
	w.insert(50)
	old := d.deletePrimaryPod(w)
	d.waitReplica(old, 3, 5*time.Minute)
	w.insert(10)
	w.check()
	d.deleteCluster(3 * time.Minute)
}

// deleteCluster deletes the PostgresCluster and waits until it is gone.
func (d *db) deleteCluster(timeout time.Duration) {
	d.t.Helper()
	pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: d.name}}
	if err := k8s.Delete(context.Background(), pgc); err != nil {
		d.t.Fatal(err)
	}
	testutil.Eventually(d.t, timeout, func() error {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pgc), &dbv1.PostgresCluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("cluster %s/%s still there (%v)", d.ns, d.name, err)
	})
}

// operatorSDK runs operator-sdk with args, logs what it wrote and fails the test when it
// fails; it returns what it wrote on its standard output.
func operatorSDK(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(olmEnv(t, "E2E_OPERATOR_SDK"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	t.Logf("operator-sdk %s (%s):\n%s%s", strings.Join(args, " "), time.Since(start).Round(time.Second), stderr.String(), out)
	if err != nil {
		t.Fatalf("operator-sdk %s: %v", args[0], err)
	}
	return out
}

// `operator-sdk run bundle <bundle image>` installs the bundle through OLM (a catalog of
// that one bundle, an OperatorGroup and a Subscription), the example fails over, and
// `operator-sdk cleanup` removes the operator again.
func TestOLMRunBundle(t *testing.T) {
	c := olmClient(t)
	// Not restricted: the catalog pod operator-sdk makes sets no runAsNonRoot (on purpose,
	// for OpenShift's ranges) and its init container no security context at all, which the
	// restricted profile refuses. docs/install.md creates the namespace plainly too.
	installNamespace(t, c, false)
	bundle := olmEnv(t, "E2E_OLM_BUNDLE")
	operatorSDK(t, "run", "bundle", bundle, "--namespace", olmInstallNamespace,
		"--security-context-config", "restricted", "--timeout", "5m",
		// An empty file-based index served by the opm image built here; operator-sdk's
		// default is opm:latest, and its decompression image busybox from Docker Hub.
		"--index-image", olmEnv(t, "E2E_OLM_INDEX"), "--decompression-image", olmEnv(t, "E2E_OLM_BUSYBOX"))
	csvName := olmPackage + ".v" + olmEnv(t, "E2E_OLM_VERSION")
	waitCSV(t, c, csvName, time.Minute)

	var subs v1alpha1.SubscriptionList
	if err := c.List(context.Background(), &subs, client.InNamespace(olmInstallNamespace)); err != nil {
		t.Fatal(err)
	}
	if len(subs.Items) != 1 {
		t.Fatalf("run bundle made %d Subscriptions, want 1", len(subs.Items))
	}
	sub := subs.Items[0]
	patch := client.MergeFrom(sub.DeepCopy())
	sub.Spec.Config = &v1alpha1.SubscriptionConfig{Env: localImages(t)}
	if err := c.Patch(context.Background(), &sub, patch); err != nil {
		t.Fatal(err)
	}
	waitOperator(t, c, operatorImage(t, c, csvName), localImages(t), 5*time.Minute)

	exampleFailsOver(t)

	operatorSDK(t, "cleanup", olmPackage, "--namespace", olmInstallNamespace, "--timeout", "3m")
	testutil.Eventually(t, 2*time.Minute, func() error {
		var dep appsv1.Deployment
		err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: olmDeployment}, &dep)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the operator's Deployment is still there (%v)", err)
		}
		var csvs v1alpha1.ClusterServiceVersionList
		if err := c.List(context.Background(), &csvs, client.InNamespace(olmInstallNamespace)); err != nil {
			return err
		}
		for _, csv := range csvs.Items {
			if csv.Name == csvName {
				return fmt.Errorf("CSV %s is still there", csvName)
			}
		}
		return nil
	})
}

// operatorImage is the image the CSV's Deployment runs.
func operatorImage(t *testing.T, c client.Client, csvName string) string {
	t.Helper()
	var csv v1alpha1.ClusterServiceVersion
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: csvName}, &csv); err != nil {
		t.Fatal(err)
	}
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		if d.Name == olmDeployment {
			return d.Spec.Template.Spec.Containers[0].Image
		}
	}
	t.Fatalf("CSV %s has no Deployment %s", csvName, olmDeployment)
	return ""
}

// catalogSource creates a CatalogSource serving image in OLM's namespace, as
// docs/install.md writes it, and deletes it at the end; it waits until its registry
// pod serves.
func catalogSource(t *testing.T, c client.Client, name, image string) *v1alpha1.CatalogSource {
	t.Helper()
	cs := &v1alpha1.CatalogSource{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: olmEnv(t, "E2E_OLM_NAMESPACE")},
		Spec: v1alpha1.CatalogSourceSpec{
			SourceType:    v1alpha1.SourceTypeGrpc,
			Image:         image,
			DisplayName:   "pgpilot",
			Publisher:     "pgpilot project",
			GrpcPodConfig: &v1alpha1.GrpcPodConfig{SecurityContextConfig: v1alpha1.Restricted},
		},
	}
	if err := c.Create(context.Background(), cs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), cs) })
	waitCatalogServes(t, c, cs, image)
	return cs
}

// waitCatalogServes waits until the CatalogSource's registry pod runs image and OLM
// has connected to it.
func waitCatalogServes(t *testing.T, c client.Client, cs *v1alpha1.CatalogSource, image string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Minute, func() error {
		var got v1alpha1.CatalogSource
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(cs), &got); err != nil {
			return err
		}
		if got.Status.GRPCConnectionState == nil || got.Status.GRPCConnectionState.LastObservedState != "READY" {
			return fmt.Errorf("catalog %s: connection %+v", cs.Name, got.Status.GRPCConnectionState)
		}
		var pods corev1.PodList
		if err := c.List(context.Background(), &pods, client.InNamespace(cs.Namespace), client.MatchingLabels{"olm.catalogSource": cs.Name}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == image && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}
		return fmt.Errorf("no running registry pod of %s with %s yet", cs.Name, image)
	})
}

// subscribe creates an OperatorGroup for all namespaces and a Subscription to the
// stable channel of catalog cs, as docs/install.md writes them.
func subscribe(t *testing.T, c client.Client, cs *v1alpha1.CatalogSource, approval v1alpha1.Approval, startingCSV string) *v1alpha1.Subscription {
	t.Helper()
	og := &operatorsv1.OperatorGroup{ObjectMeta: metav1.ObjectMeta{Name: olmPackage, Namespace: olmInstallNamespace}}
	if err := c.Create(context.Background(), og); err != nil {
		t.Fatal(err)
	}
	sub := &v1alpha1.Subscription{
		ObjectMeta: metav1.ObjectMeta{Name: olmPackage, Namespace: olmInstallNamespace},
		Spec: &v1alpha1.SubscriptionSpec{
			Package: olmPackage, Channel: "stable", CatalogSource: cs.Name, CatalogSourceNamespace: cs.Namespace,
			InstallPlanApproval: approval, StartingCSV: startingCSV,
			Config: &v1alpha1.SubscriptionConfig{Env: localImages(t)},
		},
	}
	if err := c.Create(context.Background(), sub); err != nil {
		t.Fatal(err)
	}
	return sub
}

// uninstall removes the operator as docs/install.md says: the Subscription, then the
// installed CSV, and waits until its Deployment is gone.
func uninstall(t *testing.T, c client.Client, csvName string) {
	t.Helper()
	ctx := context.Background()
	_ = c.Delete(ctx, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: olmPackage, Namespace: olmInstallNamespace}})
	_ = c.Delete(ctx, &v1alpha1.ClusterServiceVersion{ObjectMeta: metav1.ObjectMeta{Name: csvName, Namespace: olmInstallNamespace}})
	testutil.Eventually(t, 2*time.Minute, func() error {
		err := c.Get(ctx, client.ObjectKey{Namespace: olmInstallNamespace, Name: olmDeployment}, &appsv1.Deployment{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the operator's Deployment is still there (%v)", err)
	})
}

// A CatalogSource serving catalog/ as an image, an OperatorGroup and a Subscription on
// the stable channel: the OperatorHub way. The example fails over.
func TestOLMSubscription(t *testing.T) {
	c := olmClient(t)
	installNamespace(t, c, true)
	cs := catalogSource(t, c, "pgpilot", olmEnv(t, "E2E_OLM_CATALOG"))
	subscribe(t, c, cs, v1alpha1.ApprovalAutomatic, "")
	csvName := olmPackage + ".v" + olmEnv(t, "E2E_OLM_VERSION")
	waitCSV(t, c, csvName, 5*time.Minute)
	waitOperator(t, c, operatorImage(t, c, csvName), localImages(t), 5*time.Minute)

	exampleFailsOver(t)

	uninstall(t, c, csvName)
}

// approveInstallPlan waits until the Subscription has an InstallPlan that installs
// csvName and waits for approval, and approves it.
func approveInstallPlan(t *testing.T, c client.Client, csvName string) {
	t.Helper()
	var ip v1alpha1.InstallPlan
	testutil.Eventually(t, 5*time.Minute, func() error {
		var sub v1alpha1.Subscription
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: olmPackage}, &sub); err != nil {
			return err
		}
		if sub.Status.InstallPlanRef == nil {
			return fmt.Errorf("subscription %s: state %s, no InstallPlan yet", sub.Name, sub.Status.State)
		}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: sub.Status.InstallPlanRef.Name}, &ip); err != nil {
			return err
		}
		if !slices.Contains(ip.Spec.ClusterServiceVersionNames, csvName) {
			return fmt.Errorf("InstallPlan %s installs %v, not yet %s", ip.Name, ip.Spec.ClusterServiceVersionNames, csvName)
		}
		if ip.Status.Phase != v1alpha1.InstallPlanPhaseRequiresApproval {
			return fmt.Errorf("InstallPlan %s is %s", ip.Name, ip.Status.Phase)
		}
		return nil
	})
	patch := client.MergeFrom(ip.DeepCopy())
	ip.Spec.Approved = true
	if err := c.Patch(context.Background(), &ip, patch); err != nil {
		t.Fatal(err)
	}
	t.Logf("approved InstallPlan %s (%v)", ip.Name, ip.Spec.ClusterServiceVersionNames)
}

// An upgrade through OLM: a catalog with the current bundle, a Subscription with manual
// approval, a running cluster; then the catalog serves the next version too (built by
// make olm-e2e), its InstallPlan is approved, OLM replaces the operator, and the new
// operator rolls the instances (the agent comes from the operator image): replicas
// first, the primary last, handing its role over as it stops, while a writer inserts
// without pause. No
// acknowledged row is lost and the cluster's status names the new operator version.
func TestOLMUpgrade(t *testing.T) {
	c := olmClient(t)
	installNamespace(t, c, true)
	current, next := olmEnv(t, "E2E_OLM_VERSION"), olmEnv(t, "E2E_OLM_NEXT")
	currentCSV, nextCSV := olmPackage+".v"+current, olmPackage+".v"+next
	cs := catalogSource(t, c, "pgpilot-upgrade", olmEnv(t, "E2E_OLM_CATALOG"))
	subscribe(t, c, cs, v1alpha1.ApprovalManual, currentCSV)
	approveInstallPlan(t, c, currentCSV)
	waitCSV(t, c, currentCSV, 5*time.Minute)
	oldImage := operatorImage(t, c, currentCSV)
	waitOperator(t, c, oldImage, localImages(t), 5*time.Minute)

	d := newDB(t, 3)
	d.waitHealthy(3, 10*time.Minute)
	d.waitOperatorVersion(current, 2*time.Minute)
	d.waitStreaming(2, time.Minute)
	w := d.newTable()
	w.insert(50)
	uids := map[string]string{}
	for _, p := range d.pods() {
		uids[p.Name] = string(p.UID)
	}
	primary := d.cluster().Status.CurrentPrimary

	t.Log("serving the next version from the catalog")
	nextCatalog := olmEnv(t, "E2E_OLM_CATALOG_NEXT")
	patch := client.MergeFrom(cs.DeepCopy())
	cs.Spec.Image = nextCatalog
	if err := c.Patch(context.Background(), cs, patch); err != nil {
		t.Fatal(err)
	}
	waitCatalogServes(t, c, cs, nextCatalog)

	primaries := d.watchPrimaries()
	var order []string
	began := time.Now()
	before := len(w.attempts)
	gap := w.continuously(func() {
		approveInstallPlan(t, c, nextCSV)
		waitCSV(t, c, nextCSV, 5*time.Minute)
		newImage := operatorImage(t, c, nextCSV)
		if newImage == oldImage {
			t.Fatalf("the next CSV runs the same image %s", newImage)
		}
		waitOperator(t, c, newImage, localImages(t), 5*time.Minute)
		t.Logf("operator replaced by %s after %s", newImage, time.Since(began).Round(time.Second))
		// Every instance restarted once, with the new operator's agent.
		testutil.Eventually(t, 15*time.Minute, func() error {
			seen := len(order)
			defer func() {
				for _, name := range order[seen:] {
					t.Logf("%s restarted (seen %s after the approval)", name, time.Since(began).Round(100*time.Millisecond))
				}
			}()
			return d.rolledOut(uids, &order, func(p corev1.Pod) error {
				if agent := p.Spec.InitContainers[0].Image; agent != newImage {
					return fmt.Errorf("pod %s has the agent %s", p.Name, agent)
				}
				return nil
			})
		})
	})
	seen := primaries()
	from, to := longestGap(w.attempts[before:]) // the continuous writer's
	t.Logf("upgrade %s -> %s: instances restarted in the order %v, primaries %v, in %s; longest time without an acknowledged write %s (from %s to %s after the approval)",
		current, next, order, seen, time.Since(began).Round(time.Second), gap.Round(10*time.Millisecond),
		from.Sub(began).Round(100*time.Millisecond), to.Sub(began).Round(100*time.Millisecond))
	// The writer's attempts in the gap: how each failed, and how long it took (a
	// connection to an address that went away waits its whole connect timeout).
	for _, a := range w.attempts[before:] {
		if a.End.After(from) && a.Start.Before(to) {
			t.Logf("  attempt %s to %s (%s): %v", a.Start.UTC().Format("15:04:05.000"), a.End.UTC().Format("15:04:05.000"),
				a.End.Sub(a.Start).Round(time.Millisecond), a.Err)
		}
	}
	// What each part did around the longest gap: the instances' agents and postgres
	// (the old primary's pod was replaced since, with its log) and the operator's.
	for _, p := range d.pods() {
		logWindow(t, p.Namespace, p.Name, "postgres", from, to)
	}
	var operators corev1.PodList
	if err := c.List(context.Background(), &operators, client.InNamespace(olmInstallNamespace)); err == nil {
		for _, p := range operators.Items {
			logWindow(t, p.Namespace, p.Name, "controller", from, to)
		}
	}
	if order[2] != primary {
		t.Errorf("restart order %v: the primary %s was not last", order, primary)
	}
	if len(seen) != 2 {
		t.Errorf("primaries during the upgrade %v: want one handover", seen)
	}
	d.waitOperatorVersion(next, 2*time.Minute)
	d.waitStreaming(2, 2*time.Minute)
	w.insert(10)
	w.check()
	var old v1alpha1.ClusterServiceVersion
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: olmInstallNamespace, Name: currentCSV}, &old); !apierrors.IsNotFound(err) {
		t.Errorf("the replaced CSV %s is still there (%v, phase %s)", currentCSV, err, old.Status.Phase)
	}

	d.deleteCluster(3 * time.Minute)
	uninstall(t, c, nextCSV)
}

// waitOperatorVersion waits until the cluster's status names the operator version v.
func (d *db) waitOperatorVersion(v string, timeout time.Duration) {
	d.t.Helper()
	testutil.Eventually(d.t, timeout, func() error {
		if got := d.cluster().Status.OperatorVersion; got != v {
			return fmt.Errorf("status.operatorVersion %q, want %q", got, v)
		}
		return nil
	})
}

// operator-sdk scorecard runs the bundle's scorecard configuration
// (bundle/tests/scorecard/config.yaml): the basic and olm suites, each test a pod on the
// cluster with the scorecard-test image built from operator-sdk. Every test passes.
func TestOLMScorecard(t *testing.T) {
	c := olmClient(t)
	// The scorecard's pods set no security context: a namespace of its own, without the
	// restricted profile pgpilot's namespaces enforce.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pgpilot-scorecard"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	// The tests' pods run as the namespace's default ServiceAccount.
	testutil.Eventually(t, time.Minute, func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{})
	})
	for _, suite := range []string{"basic", "olm"} {
		out := operatorSDK(t, "scorecard", olmEnv(t, "E2E_OLM_BUNDLE"), "--namespace", ns.Name,
			"--selector", "suite="+suite, "--output", "json", "--wait-time", "300s",
			// The bundle's contents reach each test pod through an init container that
			// untars them: busybox built here instead of operator-sdk's UBI image.
			"--untar-image", olmEnv(t, "E2E_OLM_BUSYBOX"))
		var list scapiv1alpha3.TestList
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatalf("scorecard %s: %v", suite, err)
		}
		if len(list.Items) == 0 {
			t.Fatalf("scorecard %s ran no test", suite)
		}
		for _, item := range list.Items {
			for _, r := range item.Status.Results {
				t.Logf("scorecard %s: %s %s %v", suite, r.Name, r.State, r.Errors)
				if r.State != scapiv1alpha3.PassState {
					t.Errorf("scorecard %s: %s is %s: %v %s", suite, r.Name, r.State, r.Errors, r.Log)
				}
			}
		}
	}
}

// longestGap is the longest time between two acknowledged attempts, as the two ends.
func longestGap(attempts []testutil.Attempt) (from, to time.Time) {
	var acked []time.Time
	for _, a := range attempts {
		if a.Acked() {
			acked = append(acked, a.End)
		}
	}
	slices.SortFunc(acked, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(acked); i++ {
		if acked[i].Sub(acked[i-1]) > to.Sub(from) {
			from, to = acked[i-1], acked[i]
		}
	}
	return from, to
}
