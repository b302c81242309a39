package credentials_test

import (
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller"
	"github.com/pgpilot/pgpilot/internal/operator/controller/credentials"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// env is a Reconciler on a fake API server holding objects.
type env struct {
	t        *testing.T
	client   client.Client
	recorder *record.FakeRecorder
	r        *credentials.Reconciler
}

func newEnv(t *testing.T, objects ...client.Object) *env {
	t.Helper()
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objects...).Build()
	recorder := record.NewFakeRecorder(100)
	// A seeded generator: the passwords are the same on every run.
	random := rand.NewChaCha8([32]byte{'p', 'g', 'p', 'i', 'l', 'o', 't'})
	return &env{t: t, client: c, recorder: recorder,
		r: credentials.NewReconciler(c, c, scheme, recorder, random)}
}

func (e *env) reconcile(name string) {
	e.t.Helper()
	res, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "prod", Name: name}})
	if err != nil {
		e.t.Fatalf("Reconcile: %v", err)
	}
	if diff := cmp.Diff(ctrl.Result{}, res); diff != "" {
		e.t.Errorf("Reconcile result (-want +got):\n%s", diff)
	}
}

// secrets returns every Secret in namespace prod by name.
func (e *env) secrets() map[string]corev1.Secret {
	e.t.Helper()
	var list corev1.SecretList
	if err := e.client.List(context.Background(), &list, client.InNamespace("prod")); err != nil {
		e.t.Fatal(err)
	}
	out := map[string]corev1.Secret{}
	for _, s := range list.Items {
		out[s.Name] = s
	}
	return out
}

// snapshot is the JSON of every Secret in namespace prod by name.
func (e *env) snapshot() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for name, s := range e.secrets() {
		b, err := json.Marshal(s)
		if err != nil {
			e.t.Fatal(err)
		}
		out[name] = string(b)
	}
	return out
}

// events drains the recorder.
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// names are the sorted keys of m.
func names[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

func createdEvent(secret, user string) string {
	return "Normal " + dbv1.ReasonCredentialsCreated + " Created Secret " + secret + " for role " + user
}

func TestReconcileCreatesSecrets(t *testing.T) {
	cluster := newCluster(withBootstrap("orders", "shopkeeper"))
	e := newEnv(t, cluster)
	e.reconcile("db")

	all := e.secrets()
	if diff := cmp.Diff([]string{"db-agent", "db-agent-auth", "db-app", "db-metrics", "db-replication", "db-superuser"}, names(all)); diff != "" {
		t.Fatalf("Secrets (-want +got):\n%s", diff)
	}
	for _, name := range []string{"db-agent", "db-metrics"} {
		token := all[name]
		if len(token.Data[secrets.KeyToken]) != 48 || token.Type != corev1.SecretTypeOpaque || metav1.GetControllerOf(&token) == nil {
			t.Errorf("token Secret %s: type %s, token of %d bytes, owner %v", name, token.Type, len(token.Data[secrets.KeyToken]), token.OwnerReferences)
		}
	}
	// The pods get digests of the operator's and Prometheus's tokens, never the tokens,
	// and a token of their own.
	auth := all["db-agent-auth"]
	wantAuth := map[string]string{
		agentapi.FileControlDigest: agentapi.Digest(string(all["db-agent"].Data[secrets.KeyToken])),
		agentapi.FileMetricsDigest: agentapi.Digest(string(all["db-metrics"].Data[secrets.KeyToken])),
	}
	for k, v := range wantAuth {
		if string(auth.Data[k]) != v {
			t.Errorf("db-agent-auth %s = %q, want %q", k, auth.Data[k], v)
		}
	}
	if len(auth.Data[agentapi.FilePeerToken]) != 48 || len(auth.Data) != 4 {
		t.Errorf("db-agent-auth holds %d keys, a peer token of %d bytes", len(auth.Data), len(auth.Data[agentapi.FilePeerToken]))
	}
	// The pooler's pods mount the peers' token's digest, not the token.
	if got, want := string(auth.Data[agentapi.FilePeerDigest]), agentapi.Digest(string(auth.Data[agentapi.FilePeerToken])); got != want {
		t.Errorf("db-agent-auth %s = %q, want %q", agentapi.FilePeerDigest, got, want)
	}
	for _, name := range []string{"db-agent", "db-agent-auth", "db-metrics"} {
		delete(all, name)
	}
	wantOwner := []metav1.OwnerReference{{
		APIVersion: "db.example.com/v1", Kind: "PostgresCluster", Name: "db", UID: cluster.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	wantLabels := map[string]string{
		dbv1.LabelCluster:              "db",
		"app.kubernetes.io/managed-by": "pgpilot",
		"app.kubernetes.io/part-of":    "pgpilot",
	}
	wantUsers := map[string]string{"db-superuser": "postgres", "db-replication": "pgpilot_replication", "db-app": "shopkeeper"}
	passwords := map[string]string{}
	for name, s := range all {
		if s.Type != corev1.SecretTypeBasicAuth {
			t.Errorf("%s: type %q, want %q", name, s.Type, corev1.SecretTypeBasicAuth)
		}
		if diff := cmp.Diff(wantOwner, s.OwnerReferences); diff != "" {
			t.Errorf("%s: owner references (-want +got):\n%s", name, diff)
		}
		if diff := cmp.Diff(wantLabels, s.Labels); diff != "" {
			t.Errorf("%s: labels (-want +got):\n%s", name, diff)
		}
		if got := string(s.Data[secrets.KeyUsername]); got != wantUsers[name] {
			t.Errorf("%s: username %q, want %q", name, got, wantUsers[name])
		}
		password := string(s.Data[secrets.KeyPassword])
		if len(password) != credentials.PasswordLength || !passwordPattern.MatchString(password) {
			t.Errorf("%s: password %q, want %d characters of [A-Za-z0-9]", name, password, credentials.PasswordLength)
		}
		if p := secrets.Problem(&s); p != "" {
			t.Errorf("%s: %s", name, p)
		}
		passwords[name] = password
	}
	if passwords["db-superuser"] == passwords["db-replication"] || passwords["db-superuser"] == passwords["db-app"] ||
		passwords["db-replication"] == passwords["db-app"] {
		t.Errorf("passwords are not distinct: %v", passwords)
	}
	for _, name := range []string{"db-superuser", "db-replication"} {
		if diff := cmp.Diff([]string{"password", "username"}, names(all[name].Data)); diff != "" {
			t.Errorf("%s: keys (-want +got):\n%s", name, diff)
		}
	}

	app := all["db-app"]
	wantApp := map[string]string{
		"username": "shopkeeper",
		"password": passwords["db-app"],
		"dbname":   "orders",
		"host":     "db-rw",
		"port":     "5432",
	}
	gotApp := map[string]string{}
	for k, v := range app.Data {
		if k != secrets.KeyURI {
			gotApp[k] = string(v)
		}
	}
	if diff := cmp.Diff(wantApp, gotApp); diff != "" {
		t.Errorf("db-app data (-want +got):\n%s", diff)
	}
	uri, err := url.Parse(string(app.Data[secrets.KeyURI]))
	if err != nil {
		t.Fatalf("db-app uri: %v", err)
	}
	password, _ := uri.User.Password()
	type connection struct{ Scheme, User, Password, Host, Path string }
	want := connection{"postgresql", "shopkeeper", passwords["db-app"], "db-rw.prod:5432", "/orders"}
	got := connection{uri.Scheme, uri.User.Username(), password, uri.Host, uri.Path}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("db-app uri %s (-want +got):\n%s", uri.Redacted(), diff)
	}
	// A client that uses the uri verifies the server with the cluster's CA.
	if q := uri.Query(); q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") != "/etc/pgpilot/ca/ca.crt" {
		t.Errorf("db-app uri %s: want sslmode=verify-full and sslrootcert=/etc/pgpilot/ca/ca.crt", uri.Redacted())
	}

	events := e.events()
	wantEvents := []string{
		createdEvent("db-superuser", "postgres"),
		createdEvent("db-replication", "pgpilot_replication"),
		createdEvent("db-app", "shopkeeper"),
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-agent for the operator's calls to the agents' API",
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-metrics for Prometheus's scrapes of the agents' API",
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-agent-auth for the agents' API credentials",
	}
	if diff := cmp.Diff(wantEvents, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for _, ev := range events {
		for name, p := range passwords {
			if strings.Contains(ev, p) {
				t.Errorf("event %q contains the password of %s", ev, name)
			}
		}
	}
}

// The application Secret pgpilot made before its uri carried sslmode=verify-full gets
// the new uri, built from the Secret's own password (here one a user rotated): only
// the uri key changes. A Secret a user made is left as it is.
func TestReconcileUpdatesTheAppURIOnly(t *testing.T) {
	e := newEnv(t, newCluster())
	e.reconcile("db")
	app := e.secrets()["db-app"]
	app.Data["password"] = []byte("rotated-by-a-user")
	app.Data["uri"] = []byte("postgresql://app:old@db-rw.prod:5432/app")
	if err := e.client.Update(context.Background(), &app); err != nil {
		t.Fatal(err)
	}
	before := e.secrets()["db-app"]
	e.events()

	e.reconcile("db")
	after := e.secrets()["db-app"]
	if got, want := string(after.Data["uri"]), "postgresql://app:rotated-by-a-user@db-rw.prod:5432/app?sslmode=verify-full&sslrootcert=/etc/pgpilot/ca/ca.crt"; got != want {
		t.Errorf("uri %s, want %s", got, want)
	}
	delete(before.Data, "uri")
	delete(after.Data, "uri")
	if diff := cmp.Diff(before.Data, after.Data); diff != "" {
		t.Errorf("keys other than uri changed (-before +after):\n%s", diff)
	}
	if events := e.events(); len(events) != 0 {
		t.Errorf("events %q", events)
	}

	// A user's own application Secret, made beforehand, keeps its uri.
	mine := newSecret("db-app", map[string]string{"username": "app", "password": "chosen", "uri": "postgresql://app:chosen@elsewhere/app"})
	e = newEnv(t, newCluster(), mine)
	e.reconcile("db")
	if got := string(e.secrets()["db-app"].Data["uri"]); got != "postgresql://app:chosen@elsewhere/app" {
		t.Errorf("a user's Secret's uri became %s", got)
	}
}

func TestReconcileTwiceChangesNothing(t *testing.T) {
	e := newEnv(t, newCluster())
	e.reconcile("db")
	before := e.snapshot()
	if len(before) != 6 {
		t.Fatalf("first reconcile created %d Secrets, want 6", len(before))
	}
	e.events()

	e.reconcile("db")
	if diff := cmp.Diff(before, e.snapshot()); diff != "" {
		t.Errorf("second reconcile changed Secrets (-before +after):\n%s", diff)
	}
	if events := e.events(); len(events) != 0 {
		t.Errorf("second reconcile recorded events %q", events)
	}
}

func TestReconcileKeepsExistingSecret(t *testing.T) {
	// A user chose the superuser password beforehand, without pgpilot's labels.
	mine := newSecret("db-superuser", map[string]string{"username": "postgres", "password": "chosen-by-me"})
	mine.Type = corev1.SecretTypeOpaque
	mine.Annotations = map[string]string{"owner": "dba-team"}
	e := newEnv(t, newCluster(), mine)
	before := e.snapshot()["db-superuser"]

	e.reconcile("db")
	after := e.snapshot()
	if diff := cmp.Diff(before, after["db-superuser"]); diff != "" {
		t.Errorf("the existing Secret changed (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"db-agent", "db-agent-auth", "db-app", "db-metrics", "db-replication", "db-superuser"}, names(e.secrets())); diff != "" {
		t.Errorf("Secrets (-want +got):\n%s", diff)
	}
	wantEvents := []string{createdEvent("db-replication", "pgpilot_replication"), createdEvent("db-app", "app"),
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-agent for the operator's calls to the agents' API",
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-metrics for Prometheus's scrapes of the agents' API",
		"Normal " + dbv1.ReasonCredentialsCreated + " Created Secret db-agent-auth for the agents' API credentials"}
	if diff := cmp.Diff(wantEvents, e.events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestReconcileRecreatesDeletedSecret(t *testing.T) {
	e := newEnv(t, newCluster())
	e.reconcile("db")
	before := e.snapshot()
	e.events()

	app := e.secrets()["db-app"]
	if err := e.client.Delete(context.Background(), &app); err != nil {
		t.Fatal(err)
	}
	e.reconcile("db")

	after := e.secrets()
	recreated, ok := after["db-app"]
	if !ok {
		t.Fatal("db-app was not created again")
	}
	if p := secrets.Problem(&recreated); p != "" {
		t.Error(p)
	}
	if old, got := string(app.Data[secrets.KeyPassword]), string(recreated.Data[secrets.KeyPassword]); got == old {
		t.Errorf("db-app came back with its old password %q; want a new one", got)
	}
	for _, name := range []string{"db-superuser", "db-replication"} {
		if diff := cmp.Diff(before[name], e.snapshot()[name]); diff != "" {
			t.Errorf("%s changed (-before +after):\n%s", name, diff)
		}
	}
	if diff := cmp.Diff([]string{createdEvent("db-app", "app")}, e.events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestReconcileClusterGone(t *testing.T) {
	e := newEnv(t)
	e.reconcile("db")
	if got := e.secrets(); len(got) != 0 {
		t.Errorf("created Secrets %v for a cluster that does not exist", names(got))
	}
	if events := e.events(); len(events) != 0 {
		t.Errorf("recorded events %q", events)
	}
}

func TestReconcileClusterBeingDeleted(t *testing.T) {
	cluster := newCluster()
	cluster.Finalizers = []string{"helm.sdk.operatorframework.io/uninstall-release"}
	cluster.DeletionTimestamp = ptr.To(metav1.NewTime(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)))
	e := newEnv(t, cluster)
	e.reconcile("db")
	for _, want := range secrets.Wanted(cluster) {
		err := e.client.Get(context.Background(), client.ObjectKey{Namespace: "prod", Name: want.Name}, &corev1.Secret{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s: got error %v, want NotFound", want.Name, err)
		}
	}
}

// A token changed in its Secret (a rotation) reaches the pods: the digest they mount
// follows; the peers' own token stays.
func TestTokenRotationUpdatesTheDigest(t *testing.T) {
	e := newEnv(t, newCluster())
	e.reconcile("db")
	before := e.secrets()
	token := before["db-agent"]
	token.Data[secrets.KeyToken] = []byte("a-new-operator-token")
	if err := e.client.Update(context.Background(), &token); err != nil {
		t.Fatal(err)
	}
	e.reconcile("db")
	after := e.secrets()["db-agent-auth"]
	if got, want := string(after.Data[agentapi.FileControlDigest]), agentapi.Digest("a-new-operator-token"); got != want {
		t.Errorf("control digest %q after the rotation, want %q", got, want)
	}
	if string(after.Data[agentapi.FilePeerToken]) != string(before["db-agent-auth"].Data[agentapi.FilePeerToken]) {
		t.Error("the peers' token changed")
	}
}
