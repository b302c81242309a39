// Package credentials creates the superuser, replication and application Secrets of a
// cluster once, with random passwords, and never changes a password afterwards (the
// application Secret's uri follows its password and pgpilot's TLS: keepAppURI).
package credentials

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// PasswordLength is the length of generated passwords: 32 characters of [A-Za-z0-9],
// about 190 bits.
const PasswordLength = 32

const passwordAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// PostgresPort is the port of every instance and Service.
const PostgresPort = 5432

// Reconciler creates a cluster's credentials Secrets.
type Reconciler struct {
	client client.Client
	// reader reads Secrets uncached: the cache holds only Secrets labelled with a
	// cluster, and a user may have created one beforehand without the label.
	reader   client.Reader
	scheme   *runtime.Scheme
	recorder record.EventRecorder
	random   io.Reader
}

// NewReconciler returns a reconciler that draws passwords from random
// (crypto/rand.Reader in production).
func NewReconciler(c client.Client, reader client.Reader, scheme *runtime.Scheme, recorder record.EventRecorder, random io.Reader) *Reconciler {
	if random == nil {
		random = rand.Reader
	}
	return &Reconciler{client: c, reader: reader, scheme: scheme, recorder: recorder, random: random}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile creates whichever of the cluster's credentials Secrets is missing. Existing
// Secrets, including ones a user created beforehand to choose a password, are used as
// they are; only the uri key of the application Secret pgpilot made is kept current
// (keepAppURI).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	for _, want := range secrets.Wanted(&cluster) {
		s, err := r.ensured(ctx, &cluster, want.Name, "role "+want.Username, func() (*corev1.Secret, error) {
			return r.newSecret(&cluster, want)
		})
		if err != nil {
			return ctrl.Result{}, err
		}
		if want.App {
			if err := r.keepAppURI(ctx, &cluster, s); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	names := cluster.Names()
	for _, t := range []struct{ name, what string }{
		{names.AgentTokenSecret(), "the operator's calls to the agents' API"},
		{names.MetricsTokenSecret(), "Prometheus's scrapes of the agents' API"},
	} {
		err := r.ensure(ctx, &cluster, t.name, t.what, func() (*corev1.Secret, error) {
			return r.newTokenSecret(&cluster, t.name, map[string]int{secrets.KeyToken: 48})
		})
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, r.ensureAgentAuth(ctx, &cluster)
}

// ensureAgentAuth keeps the Secret the instance pods mount for the agent API: the
// digests of the operator's and Prometheus's tokens as they are now (a token changed in
// its Secret is taken up), the peers' token, made once, and its digest.
func (r *Reconciler) ensureAgentAuth(ctx context.Context, c *dbv1.PostgresCluster) error {
	names := c.Names()
	digests := map[string][]byte{}
	for key, name := range map[string]string{agentapi.FileControlDigest: names.AgentTokenSecret(), agentapi.FileMetricsDigest: names.MetricsTokenSecret()} {
		var s corev1.Secret
		if err := secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s); err != nil {
			return err
		}
		if len(s.Data[secrets.KeyToken]) == 0 {
			r.recorder.Eventf(c, corev1.EventTypeWarning, dbv1.ReasonCredentialsInvalid, "Secret %s has no %q key: the agents refuse every call with it", name, secrets.KeyToken)
			continue
		}
		digests[key] = []byte(agentapi.Digest(string(s.Data[secrets.KeyToken])))
	}
	s, err := r.ensured(ctx, c, names.AgentAuthSecret(), "the agents' API credentials", func() (*corev1.Secret, error) {
		s, err := r.newTokenSecret(c, names.AgentAuthSecret(), map[string]int{agentapi.FilePeerToken: 48})
		if err == nil {
			for k, v := range digests {
				s.Data[k] = v
			}
		}
		return s, err
	})
	if err != nil {
		return err
	}
	// The peers' token's digest, for those who check that token and must not hold it
	// (the pooler's pods).
	if peer := s.Data[agentapi.FilePeerToken]; len(peer) > 0 {
		digests[agentapi.FilePeerDigest] = []byte(agentapi.Digest(string(peer)))
	}
	changed := false
	for k, v := range digests {
		if !bytes.Equal(s.Data[k], v) {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			s.Data[k], changed = v, true
		}
	}
	if !changed {
		return nil
	}
	if err := r.client.Update(ctx, s); err != nil {
		return fmt.Errorf("updating Secret %s: %w", s.Name, err)
	}
	log.FromContext(ctx).Info("Updated the agents' API credentials: a token changed", "secret", s.Name)
	return nil
}

// keepAppURI keeps the uri key of the application Secret pgpilot made in step with its
// username and password and with what a client needs to verify the server
// (AppURI): Secrets made before the uri carried sslmode=verify-full get it, and a
// password written into the Secret reaches the uri. Only the uri key is written,
// never the password; a Secret pgpilot did not make (a user's, made beforehand) is
// left as it is.
func (r *Reconciler) keepAppURI(ctx context.Context, c *dbv1.PostgresCluster, s *corev1.Secret) error {
	if !metav1.IsControlledBy(s, c) || s.Labels["app.kubernetes.io/managed-by"] != "pgpilot" || secrets.Problem(s) != "" {
		return nil
	}
	want := AppURI(c, string(s.Data[secrets.KeyUsername]), string(s.Data[secrets.KeyPassword]))
	if string(s.Data[secrets.KeyURI]) == want {
		return nil
	}
	s = s.DeepCopy()
	s.Data[secrets.KeyURI] = []byte(want)
	if err := r.client.Update(ctx, s); err != nil {
		return fmt.Errorf("updating the uri of Secret %s: %w", s.Name, err)
	}
	log.FromContext(ctx).Info("Updated the uri of the application Secret: sslmode=verify-full, the CA's path, the Secret's password", "secret", s.Name)
	return nil
}

// ClientCAPath is where the application Secret's uri expects the cluster's CA
// certificate: the Secret <cluster>-ca (key ca.crt) mounted at /etc/pgpilot/ca in the
// client's container (docs/security.md, "Connecting").
const ClientCAPath = "/etc/pgpilot/ca/ca.crt"

// AppURI is the application Secret's uri: the read-write Service by its namespaced
// name (which the server certificate names), the bootstrap database, and
// sslmode=verify-full with the CA at ClientCAPath, so that a client that uses it
// verifies the server it talks to (libpq's default, prefer, verifies nothing).
func AppURI(c *dbv1.PostgresCluster, username, password string) string {
	uri := url.URL{
		Scheme: "postgresql",
		User:   url.UserPassword(username, password),
		Host:   c.ReadWriteServiceName() + "." + c.Namespace + ":" + strconv.Itoa(PostgresPort),
		Path:   "/" + c.Spec.Bootstrap.Database,
		// Written out, not url.Values: a path's slashes stay readable.
		RawQuery: "sslmode=verify-full&sslrootcert=" + ClientCAPath,
	}
	return uri.String()
}

// ensure creates Secret name with build unless it exists.
func (r *Reconciler) ensure(ctx context.Context, c *dbv1.PostgresCluster, name, what string, build func() (*corev1.Secret, error)) error {
	_, err := r.ensured(ctx, c, name, what, build)
	return err
}

// ensured is ensure returning the Secret as it is now. A Secret the cache lacks is
// created at once, not first looked for on the API server: the create fails when it
// exists (a user's, unlabelled, or one the cache has not seen yet), which is read then.
// A new cluster's Secrets thus cost a request each, not two.
func (r *Reconciler) ensured(ctx context.Context, c *dbv1.PostgresCluster, name, what string, build func() (*corev1.Secret, error)) (*corev1.Secret, error) {
	var existing corev1.Secret
	err := r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: name}, &existing)
	if err == nil {
		return &existing, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	secret, err := build()
	if err != nil {
		return nil, err
	}
	if err := r.client.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			err = secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &existing)
			return &existing, err
		}
		return nil, fmt.Errorf("creating Secret %s: %w", name, err)
	}
	log.FromContext(ctx).Info("Created credentials Secret", "secret", name, "for", what)
	r.recorder.Eventf(c, corev1.EventTypeNormal, dbv1.ReasonCredentialsCreated, "Created Secret %s for %s", name, what)
	return secret, nil
}

func (r *Reconciler) newSecret(c *dbv1.PostgresCluster, want secrets.Credential) (*corev1.Secret, error) {
	password, err := Password(r.random, PasswordLength)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{
		secrets.KeyUsername: []byte(want.Username),
		secrets.KeyPassword: []byte(password),
	}
	if want.App {
		data[secrets.KeyDatabase] = []byte(c.Spec.Bootstrap.Database)
		data[secrets.KeyHost] = []byte(c.ReadWriteServiceName())
		data[secrets.KeyPort] = []byte(strconv.Itoa(PostgresPort))
		data[secrets.KeyURI] = []byte(AppURI(c, want.Username, password))
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      want.Name,
			Namespace: c.Namespace,
			Labels:    secrets.Labels(c),
		},
		Type: corev1.SecretTypeBasicAuth,
		Data: data,
	}
	if err := controllerutil.SetControllerReference(c, s, r.scheme); err != nil {
		return nil, err
	}
	return s, nil
}

// newTokenSecret is Secret name with a random token of each length under its key.
func (r *Reconciler) newTokenSecret(c *dbv1.PostgresCluster, name string, keys map[string]int) (*corev1.Secret, error) {
	data := map[string][]byte{}
	for k, n := range keys {
		token, err := Password(r.random, n)
		if err != nil {
			return nil, err
		}
		data[k] = []byte(token)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: c.Namespace,
			Labels: secrets.Labels(c),
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	return s, controllerutil.SetControllerReference(c, s, r.scheme)
}

// Password returns n characters drawn uniformly from [A-Za-z0-9].
func Password(random io.Reader, n int) (string, error) {
	size := big.NewInt(int64(len(passwordAlphabet)))
	b := make([]byte, n)
	for i := range b {
		j, err := rand.Int(random, size)
		if err != nil {
			return "", fmt.Errorf("generating a password: %w", err)
		}
		b[i] = passwordAlphabet[j.Int64()]
	}
	return string(b), nil
}

// SetupWithManager watches clusters (spec changes only) and the Secrets they own, so a
// deleted Secret is created again.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("credentials").
		For(&dbv1.PostgresCluster{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Secret{}).
		// Clusters are independent, and a reconcile is a few API calls in a row: with
		// one worker, 1,000 clusters created at once waited up to 20 minutes for
		// their Secrets (0.67 s a reconcile on a busy API server).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}
