// Package certificates keeps each cluster's TLS material: a CA of its own, the server
// certificate its instances serve and the replication role's client certificate, each
// in a Secret the instance pods mount, and with spec.pooler the pooler's server and
// client certificates, which its pods mount; each renewed before it expires.
package certificates

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// Keys of the TLS Secrets: those of the kubernetes.io/tls type, and ca.crt as
// cert-manager writes it.
const (
	KeyCert = corev1.TLSCertKey
	KeyKey  = corev1.TLSPrivateKeyKey
	KeyCA   = "ca.crt"
)

// Reconciler keeps a cluster's CA and certificates.
type Reconciler struct {
	client client.Client
	// reader reads Secrets uncached: a Secret of the cluster's name may predate its label.
	reader   client.Reader
	scheme   *runtime.Scheme
	recorder record.EventRecorder
	clock    clock.PassiveClock
}

// NewReconciler returns a Reconciler.
func NewReconciler(c client.Client, reader client.Reader, scheme *runtime.Scheme, recorder record.EventRecorder, clk clock.PassiveClock) *Reconciler {
	return &Reconciler{client: c, reader: reader, scheme: scheme, recorder: recorder, clock: clk}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile makes whatever is missing of the cluster's CA, its published certificate
// and the two leaf certificates, and issues a leaf again when it is due for renewal,
// no longer fits (another CA, other names) or cannot be read. It comes back when the
// next leaf is due.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	now := r.clock.Now()
	ca, err := r.ensureCA(ctx, &cluster, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	names := cluster.Names()
	if err := r.ensureSecret(ctx, &cluster, names.CASecret(), corev1.SecretTypeOpaque, map[string][]byte{KeyCA: ca.CertPEM}); err != nil {
		return ctrl.Result{}, err
	}
	next := time.Time{}
	type leafSecret struct {
		secret string
		req    pki.Request
	}
	leaves := []leafSecret{
		{names.ServerTLSSecret(), ServerRequest(&cluster)},
		{names.ReplicationTLSSecret(), ReplicationRequest()},
	}
	if cluster.Spec.Pooler != nil {
		leaves = append(leaves,
			leafSecret{names.PoolerTLSSecret(), PoolerRequest(&cluster)},
			leafSecret{names.PoolerClientTLSSecret(), PoolerClientRequest()})
	}
	for _, leaf := range leaves {
		renew, err := r.ensureLeaf(ctx, &cluster, leaf.secret, leaf.req, ca, now)
		if err != nil {
			return ctrl.Result{}, err
		}
		if next.IsZero() || renew.Before(next) {
			next = renew
		}
	}
	r.checkUserSecret(ctx, &cluster)
	wait := max(next.Sub(now), time.Second)
	if cluster.Spec.Replica != nil {
		copied, err := r.copySourceSecret(ctx, &cluster)
		if err != nil {
			return ctrl.Result{}, err
		}
		// The user's Secret is not watched (it is not the cluster's, and the cache
		// holds only those): it is looked at again soon while it is missing or
		// unusable, and its renewals are copied within sourceSecretEvery.
		if copied {
			wait = min(wait, sourceSecretEvery)
		} else {
			wait = min(wait, sourceSecretRetry)
		}
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

// sourceSecretEvery is how often a replica cluster's source Secret is copied again;
// sourceSecretRetry how often it is looked for while missing or unusable.
const (
	sourceSecretEvery = 5 * time.Minute
	sourceSecretRetry = 10 * time.Second
)

// copySourceSecret keeps <cluster>-source-tls a copy of the tls.crt, tls.key and ca.crt
// of spec.replica.source.replicationSecretName. Every instance pod mounts the copy,
// optionally: a Secret named in the pod template would restart every pod when
// spec.replica is added (a demotion) or renamed, and a rolling update cannot move a
// replica cluster's designated primary by a switchover. A missing or unusable Secret
// is told in a Warning event; the copy is then left as it was.
func (r *Reconciler) copySourceSecret(ctx context.Context, c *dbv1.PostgresCluster) (copied bool, err error) {
	name := c.Spec.Replica.Source.ReplicationSecretName
	var s corev1.Secret
	var pair *pki.KeyPair
	err = secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s)
	problem := ""
	switch {
	case apierrors.IsNotFound(err):
		problem = "does not exist"
	case err != nil:
		return false, err
	default:
		pair, problem = secretKeyPair(&s)
	}
	if problem != "" {
		r.recorder.Eventf(c, corev1.EventTypeWarning, dbv1.ReasonCertificateInvalid,
			"Secret %s (spec.replica.source.replicationSecretName) %s: the instances cannot reach the source %s until it is fixed; copy the source's <cluster>-replication-tls Secret",
			name, problem, c.Spec.Replica.Source.Host)
		return false, nil
	}
	if left := pair.Cert.NotAfter.Sub(r.clock.Now()); left < sourceCertWarning {
		r.recorder.Eventf(c, corev1.EventTypeWarning, dbv1.ReasonCertificateInvalid,
			"the source's replication certificate in Secret %s expires in %s: copy the source's renewed <cluster>-replication-tls into it (the source renews its own 30 days before expiry), or the replica cluster stops following %s",
			name, left.Round(time.Hour), c.Spec.Replica.Source.Host)
	}
	err = r.ensureSecret(ctx, c, c.Names().SourceTLSSecret(), corev1.SecretTypeOpaque,
		map[string][]byte{KeyCert: s.Data[KeyCert], KeyKey: s.Data[KeyKey], KeyCA: s.Data[KeyCA]})
	return err == nil, err
}

// sourceCertWarning: a source certificate with less left than this is warned about at
// every copy. The source renews its own with 30 days left, so a copy made since has
// about 90.
const sourceCertWarning = 14 * 24 * time.Hour

// secretKeyPair reads a user's certificate Secret: tls.crt and tls.key that go
// together, and ca.crt. problem says what is wrong, "" when nothing is.
func secretKeyPair(s *corev1.Secret) (pair *pki.KeyPair, problem string) {
	for _, k := range []string{KeyCert, KeyKey, KeyCA} {
		if len(s.Data[k]) == 0 {
			return nil, fmt.Sprintf("has no %s", k)
		}
	}
	pair, err := pki.Parse(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		return nil, "has a tls.crt and tls.key that do not go together: " + err.Error()
	}
	return pair, ""
}

// ServerRequest is the certificate of a cluster's instances: every name of its Services
// (short, namespaced and fully qualified, in the default cluster domain) and of each pod
// behind the headless Service, which replicas verify the primary with.
func ServerRequest(c *dbv1.PostgresCluster) pki.Request {
	n := c.Names()
	return serviceRequest(c.Namespace, n.HeadlessService(), n.ReadWriteService(), n.ReadOnlyService(), n.ReadService())
}

// serviceRequest is a server certificate for services (the first is its common name)
// and headless, by every name a client in the default cluster domain may use, and for
// each pod behind headless.
func serviceRequest(ns, headless string, services ...string) pki.Request {
	var dns []string
	for _, svc := range append(services, headless) {
		dns = append(dns, svc, svc+"."+ns, svc+"."+ns+".svc", svc+"."+ns+".svc.cluster.local")
	}
	pods := headless + "." + ns + ".svc"
	dns = append(dns, "*."+pods, "*."+pods+".cluster.local")
	return pki.Request{CommonName: services[0] + "." + ns + ".svc", DNSNames: dns, Usage: pki.Server}
}

// ReplicationRequest is the replication role's client certificate: pg_hba.conf's cert
// method logs in the role its common name names.
func ReplicationRequest() pki.Request {
	return pki.Request{CommonName: dbv1.ReplicationUser, Usage: pki.Client}
}

// PoolerRequest is the certificate the pooler serves, to its clients (PgBouncer) and to
// the instances' agents and Prometheus (the pooler agent's API): the names of the
// pooler's Services and of each pod behind its headless Service.
func PoolerRequest(c *dbv1.PostgresCluster) pki.Request {
	n := c.Names()
	return serviceRequest(c.Namespace, n.PoolerHeadless(), n.PoolerReadWrite(), n.PoolerReadOnly())
}

// PoolerClientRequest is the pooler's client certificate: PgBouncer logs in to the
// instances as the lookup role with it (pg_hba.conf's cert method), without a password.
func PoolerClientRequest() pki.Request {
	return pki.Request{CommonName: poolerauth.Role, Usage: pki.Client}
}

// ensureCA returns the cluster's CA, making it first when its Secret is missing. A CA
// Secret that cannot be read is reported and left alone: replacing it would make every
// client that trusts it fail, and a person must decide that (by deleting the Secret).
func (r *Reconciler) ensureCA(ctx context.Context, c *dbv1.PostgresCluster, now time.Time) (*pki.KeyPair, error) {
	name := c.Names().CAKeySecret()
	var s corev1.Secret
	err := secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s)
	if err == nil {
		ca, err := pki.Parse(s.Data[KeyCert], s.Data[KeyKey])
		if err != nil {
			r.recorder.Eventf(c, corev1.EventTypeWarning, dbv1.ReasonCertificateInvalid,
				"Secret %s does not hold a usable CA (%v): delete it to have a new CA made, then restart clients that trust the old one", name, err)
			return nil, fmt.Errorf("the CA in Secret %s: %w", name, err)
		}
		return ca, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	ca, err := pki.NewCA(c.Name+"."+c.Namespace+" pgpilot CA", now, 0)
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{KeyCert: ca.CertPEM, KeyKey: ca.KeyPEM}
	if err := r.create(ctx, c, name, corev1.SecretTypeTLS, data); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("the CA Secret %s appeared meanwhile: %w", name, err)
		}
		return nil, err
	}
	r.recorder.Eventf(c, corev1.EventTypeNormal, dbv1.ReasonCertificateIssued, "Made the cluster's CA (Secret %s), valid until %s", name, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	return ca, nil
}

// ensureLeaf keeps Secret name holding a certificate for req issued by ca; it returns
// when that certificate is due for renewal.
func (r *Reconciler) ensureLeaf(ctx context.Context, c *dbv1.PostgresCluster, name string, req pki.Request, ca *pki.KeyPair, now time.Time) (time.Time, error) {
	var s corev1.Secret
	err := secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, err
	}
	exists := err == nil
	why := "it did not exist"
	if exists {
		why = leafProblem(&s, req, ca, now)
		if why == "" {
			leaf, _ := pki.Parse(s.Data[KeyCert], s.Data[KeyKey])
			return pki.RenewAt(leaf.Cert), nil
		}
	}
	leaf, err := pki.Issue(ca, req, now)
	if err != nil {
		return time.Time{}, err
	}
	data := map[string][]byte{KeyCert: leaf.CertPEM, KeyKey: leaf.KeyPEM, KeyCA: ca.CertPEM}
	if exists {
		s.Data = data
		if err := r.client.Update(ctx, &s); err != nil {
			return time.Time{}, fmt.Errorf("renewing the certificate in Secret %s: %w", name, err)
		}
	} else if err := r.create(ctx, c, name, corev1.SecretTypeTLS, data); err != nil {
		return time.Time{}, err
	}
	log.FromContext(ctx).Info("Issued a certificate", "secret", name, "because", why, "notAfter", leaf.Cert.NotAfter)
	r.recorder.Eventf(c, corev1.EventTypeNormal, dbv1.ReasonCertificateIssued, "Issued the certificate in Secret %s (%s), valid until %s",
		name, why, leaf.Cert.NotAfter.UTC().Format(time.RFC3339))
	return pki.RenewAt(leaf.Cert), nil
}

// leafProblem says why the certificate in s must be issued again, or "".
func leafProblem(s *corev1.Secret, req pki.Request, ca *pki.KeyPair, now time.Time) string {
	leaf, err := pki.Parse(s.Data[KeyCert], s.Data[KeyKey])
	if err != nil {
		return "it could not be read: " + err.Error()
	}
	if !bytes.Equal(s.Data[KeyCA], ca.CertPEM) {
		return "its ca.crt is not the cluster's CA"
	}
	if why := pki.Fits(leaf.Cert, ca.Cert, req, now); why != "" {
		return why
	}
	if !now.Before(pki.RenewAt(leaf.Cert)) {
		return "it expires at " + leaf.Cert.NotAfter.UTC().Format(time.RFC3339)
	}
	return ""
}

// checkUserSecret reports, as a Warning event, what makes the Secret that
// spec.tls.serverSecretName names unusable; the pods wait for it meanwhile.
func (r *Reconciler) checkUserSecret(ctx context.Context, c *dbv1.PostgresCluster) {
	name := c.Spec.TLS.ServerSecretName
	if name == "" {
		return
	}
	var s corev1.Secret
	err := secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s)
	var problem string
	switch {
	case apierrors.IsNotFound(err):
		problem = "does not exist"
	case err != nil:
		return
	default:
		problem = UserSecretProblem(&s, c, r.clock.Now())
	}
	if problem != "" {
		r.recorder.Eventf(c, corev1.EventTypeWarning, dbv1.ReasonCertificateInvalid,
			"Secret %s (spec.tls.serverSecretName) %s; the instances wait for a usable certificate", name, problem)
	}
}

// UserSecretProblem says what makes a user's server certificate Secret unusable for c:
// a missing key, a certificate that does not match its key, or one that ca.crt does
// not verify for the names clients and replicas connect to (the -rw Service and a pod
// behind the headless Service).
func UserSecretProblem(s *corev1.Secret, c *dbv1.PostgresCluster, now time.Time) string {
	if _, problem := secretKeyPair(s); problem != "" {
		return problem
	}
	n := c.Names()
	for _, host := range []string{
		n.ReadWriteService() + "." + c.Namespace + ".svc",
		n.Instance(0) + "." + n.HeadlessService() + "." + c.Namespace + ".svc",
	} {
		if why := pki.VerifyServer(s.Data[KeyCert], s.Data[KeyCA], host, now); why != "" {
			return why
		}
	}
	return ""
}

// create makes Secret name for c.
func (r *Reconciler) create(ctx context.Context, c *dbv1.PostgresCluster, name string, typ corev1.SecretType, data map[string][]byte) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.Namespace, Labels: secrets.Labels(c)},
		Type:       typ,
		Data:       data,
	}
	if err := controllerutil.SetControllerReference(c, s, r.scheme); err != nil {
		return err
	}
	if err := r.client.Create(ctx, s); err != nil {
		return fmt.Errorf("creating Secret %s: %w", name, err)
	}
	return nil
}

// ensureSecret creates Secret name with data, or sets its data to data.
func (r *Reconciler) ensureSecret(ctx context.Context, c *dbv1.PostgresCluster, name string, typ corev1.SecretType, data map[string][]byte) error {
	var s corev1.Secret
	err := secrets.Get(ctx, r.client, r.reader, client.ObjectKey{Namespace: c.Namespace, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return r.create(ctx, c, name, typ, data)
	}
	if err != nil {
		return err
	}
	same := len(s.Data) == len(data)
	for k, v := range data {
		same = same && bytes.Equal(s.Data[k], v)
	}
	if same {
		return nil
	}
	s.Data = data
	return r.client.Update(ctx, &s)
}

// SetupWithManager watches clusters (spec changes) and the Secrets they own, so a
// deleted or edited Secret is made again.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("certificates").
		For(&dbv1.PostgresCluster{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Secret{}).
		// Clusters are independent (as credentials').
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}
