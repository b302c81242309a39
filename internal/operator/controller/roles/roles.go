// Package roles keeps each cluster's spec.roles and spec.databases, and the passwords
// of its credentials Secrets, in its primary's PostgreSQL without a restart: it reads
// the password Secrets and sends the whole desired state to the primary's agent
// (PUT /roles), again at every change of the spec, of a labelled Secret, of the
// primary, and every 5 minutes.
package roles

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/rolestatus"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// Periods of the reconciler.
const (
	// Resync repairs drift (a role changed by hand) and takes up a change of a Secret
	// without the cluster label, which the controller does not watch.
	Resync = 5 * time.Minute
	// Retry is the wait after the primary could not be asked (none yet, a failover).
	Retry = 5 * time.Second
	// callTimeout bounds one PUT /roles.
	callTimeout = 30 * time.Second
)

// Reconciler sends each cluster's roles and databases to its primary.
type Reconciler struct {
	client client.Client
	// reader reads Secrets uncached: a user's password Secret need not carry the
	// cluster label, and the cache holds only those that do.
	reader   client.Reader
	fleet    *fleet.Fleet
	recorder record.EventRecorder
	store    *rolestatus.Store
}

// NewReconciler returns a Reconciler recording outcomes in store. agentURL nil means
// each pod's IP.
func NewReconciler(c client.Client, reader client.Reader, recorder record.EventRecorder, store *rolestatus.Store, agentURL func(*corev1.Pod) string) *Reconciler {
	return &Reconciler{client: c, reader: reader, fleet: fleet.New(c, agentURL), recorder: recorder, store: store}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile reads the password Secrets, sends the desired state to the primary and
// records the outcome for the status controller; failures become Warning events.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var c dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &c); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	previous, known := r.store.Get(req.NamespacedName)
	if !known {
		previous = rolestatus.Outcome{Roles: c.Status.Roles, Databases: c.Status.Databases}
	}
	body, own, err := r.request(ctx, &c)
	if err != nil {
		return reconcile.Result{}, err
	}
	answer, err := r.send(ctx, &c, body)
	if err != nil {
		// Said once per reason: a failover or a cluster still starting retries every
		// Retry, and a line each time told nothing new.
		logger := log.FromContext(ctx)
		if err.Error() == previous.Problem {
			logger = logger.V(1)
		}
		logger.Info("Could not reconcile roles and databases yet", "reason", err.Error())
		previous.Generation, previous.Problem = c.Generation, err.Error()
		r.store.Set(&c, previous)
		return reconcile.Result{RequeueAfter: Retry}, nil
	}
	now := rolestatus.Outcome{
		Generation: c.Generation,
		Roles:      rolestatus.Items(names(c.Spec.Roles), answer.Roles, own, previous.Roles),
		Databases:  rolestatus.Items(dbNames(c.Spec.Databases), answer.Databases, nil, previous.Databases),
		Passwords:  passwordProblems(answer.Passwords),
	}
	for _, f := range rolestatus.Newly(previous.Roles, now.Roles) {
		r.recorder.Eventf(&c, corev1.EventTypeWarning, dbv1.ReasonRoleFailed, "Role %s: %s", f.Name, f.Message)
	}
	for _, f := range rolestatus.Newly(previous.Databases, now.Databases) {
		r.recorder.Eventf(&c, corev1.EventTypeWarning, dbv1.ReasonDatabaseFailed, "Database %s: %s", f.Name, f.Message)
	}
	if now.Passwords != "" && now.Passwords != previous.Passwords {
		r.recorder.Eventf(&c, corev1.EventTypeWarning, dbv1.ReasonRoleFailed, "%s", now.Passwords)
	}
	r.store.Set(&c, now)
	return reconcile.Result{RequeueAfter: Resync}, nil
}

// request is the desired state, with each role's problem reading its password Secret
// (the role is reconciled all the same, its password kept).
func (r *Reconciler) request(ctx context.Context, c *dbv1.PostgresCluster) (agentapi.RolesRequest, map[string]string, error) {
	var req agentapi.RolesRequest
	own := map[string]string{}
	for _, spec := range c.Spec.Roles {
		role := agentapi.Role{Name: spec.Name, Absent: spec.Ensure.IsAbsent(), Login: spec.IsLogin(), CreateDB: spec.CreateDB,
			CreateRole: spec.CreateRole, Inherit: spec.IsInherit(), ConnectionLimit: spec.Limit(), InRoles: spec.InRoles}
		if ref := spec.PasswordSecret; ref != nil && !role.Absent {
			pw, err := r.secretKey(ctx, c.Namespace, ref.Name, ref.SecretKey())
			switch {
			case err == nil:
				role.Password = &pw
			case isUnusable(err):
				role.KeepPassword, own[spec.Name] = true, err.Error()
			default:
				return req, nil, err
			}
		}
		req.Roles = append(req.Roles, role)
	}
	for _, spec := range c.Spec.Databases {
		db := agentapi.Database{Name: spec.Name, Absent: spec.Ensure.IsAbsent(), Owner: spec.Owner}
		for _, e := range spec.Extensions {
			db.Extensions = append(db.Extensions, string(e))
		}
		req.Databases = append(req.Databases, db)
	}
	for _, want := range secrets.Wanted(c) {
		user, errU := r.secretKey(ctx, c.Namespace, want.Name, secrets.KeyUsername)
		pw, errP := r.secretKey(ctx, c.Namespace, want.Name, secrets.KeyPassword)
		if err := errors.Join(errU, errP); err != nil {
			if isUnusable(err) {
				continue // the status controller reports it (CredentialsReady)
			}
			return req, nil, err
		}
		req.Passwords = append(req.Passwords, agentapi.Password{Role: user, Password: pw})
	}
	return req, own, nil
}

// unusable is a Secret that is missing or lacks the key: the spec's problem, not a
// reason to retry at once.
type unusable string

func (u unusable) Error() string { return string(u) }

func isUnusable(err error) bool { var u unusable; return errors.As(err, &u) }

// secretKey reads one key of a Secret: from the cache when it is labelled (pgpilot's
// own), else from the API server.
func (r *Reconciler) secretKey(ctx context.Context, ns, name, key string) (string, error) {
	var s corev1.Secret
	k := client.ObjectKey{Namespace: ns, Name: name}
	err := r.client.Get(ctx, k, &s)
	if apierrors.IsNotFound(err) {
		err = r.reader.Get(ctx, k, &s)
	}
	switch {
	case apierrors.IsNotFound(err):
		return "", unusable(fmt.Sprintf("Secret %s does not exist", name))
	case err != nil:
		return "", err
	case len(s.Data[key]) == 0:
		return "", unusable(fmt.Sprintf("Secret %s has no key %q", name, key))
	}
	return strings.TrimRight(string(s.Data[key]), "\r\n"), nil
}

// send asks the primary named by the Lease to apply req.
func (r *Reconciler) send(ctx context.Context, c *dbv1.PostgresCluster, req agentapi.RolesRequest) (agentapi.RolesResult, error) {
	var lease coordinationv1.Lease
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.PrimaryLeaseName()}, &lease); err != nil {
		return agentapi.RolesResult{}, fmt.Errorf("no primary yet: %w", err)
	}
	holder := primarylease.Parse(&lease).Holder
	if holder == "" {
		return agentapi.RolesResult{}, errors.New("no primary: a failover or handover is under way")
	}
	var pod corev1.Pod
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: holder}, &pod); err != nil {
		return agentapi.RolesResult{}, fmt.Errorf("the primary's pod %s: %w", holder, err)
	}
	access, err := r.fleet.Access(ctx, c)
	if err != nil {
		return agentapi.RolesResult{}, fmt.Errorf("reaching the agents: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	res, err := r.fleet.Client(&pod, access).ApplyRoles(cctx, req)
	if err != nil {
		return res, fmt.Errorf("the primary %s: %w", holder, err)
	}
	return res, nil
}

func passwordProblems(results []agentapi.ItemResult) string {
	var out []string
	for _, p := range results {
		if p.Error != "" {
			out = append(out, fmt.Sprintf("the password of %s from its Secret could not be set: %s", p.Name, p.Error))
		}
	}
	return strings.Join(out, "; ")
}

func names(roles []dbv1.RoleSpec) []string {
	var out []string
	for _, r := range roles {
		out = append(out, r.Name)
	}
	return out
}

func dbNames(dbs []dbv1.DatabaseSpec) []string {
	var out []string
	for _, d := range dbs {
		out = append(out, d.Name)
	}
	return out
}

// SetupWithManager watches clusters (spec changes), the Secrets the cache holds (those
// labelled with a cluster: pgpilot's credentials, and users' password Secrets given
// the label) mapped to every cluster of their namespace that names them, and the
// primary Lease's holder.
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	return ctrl.ControllerManagedBy(mgr).
		Named("roles").
		For(&dbv1.PostgresCluster{}, ctrl.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.clustersNaming)).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf), ctrl.WithPredicates(holderChanged())).
		// Clusters are independent, and each reconcile waits for an agent.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// clustersNaming are the clusters of the Secret's namespace that read it.
func (r *Reconciler) clustersNaming(ctx context.Context, o client.Object) []reconcile.Request {
	var list dbv1.PostgresClusterList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{IndexSecrets: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "Failed to list the clusters a Secret may belong to", "secret", o.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// IndexSecrets is the cache's index of clusters by the Secrets they read (SecretsRead),
// through which a Secret's change finds its clusters. Listing every cluster of the
// namespace instead copied each one at every Secret event: at 1,000 clusters, a fifth of
// the controller's CPU while idle, working off the create wave's events.
const IndexSecrets = "db.example.com/secrets"

// Index adds IndexSecrets to the cache whose indexer this is; before it starts.
func Index(ctx context.Context, indexer client.FieldIndexer) error {
	return indexer.IndexField(ctx, &dbv1.PostgresCluster{}, IndexSecrets, func(o client.Object) []string {
		c, ok := o.(*dbv1.PostgresCluster)
		if !ok {
			return nil
		}
		return SecretsRead(c)
	})
}

// SecretsRead are the Secrets the cluster reads: its roles' password Secrets and its
// credentials Secrets.
func SecretsRead(c *dbv1.PostgresCluster) []string {
	var names []string
	for _, r := range c.Spec.Roles {
		if r.PasswordSecret != nil {
			names = append(names, r.PasswordSecret.Name)
		}
	}
	for _, w := range secrets.Wanted(c) {
		names = append(names, w.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// holderChanged passes a Lease's creation and the updates that change its holder, not
// the renewals (one a second).
func holderChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, okO := e.ObjectOld.(*coordinationv1.Lease)
			n, okN := e.ObjectNew.(*coordinationv1.Lease)
			return okO && okN && primarylease.Parse(o).Holder != primarylease.Parse(n).Holder
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
