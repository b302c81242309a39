// Package secrets is what the operator's controllers agree on about a cluster's
// Secrets: which credentials Secrets a cluster has, their keys, their labels, and what
// makes one unusable. The credentials controller makes them; the certificates, roles
// and status controllers read them.
package secrets

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Secret keys. username and password are those of the kubernetes.io/basic-auth type.
const (
	KeyUsername = corev1.BasicAuthUsernameKey
	KeyPassword = corev1.BasicAuthPasswordKey
	KeyDatabase = "dbname"
	KeyHost     = "host"
	KeyPort     = "port"
	KeyURI      = "uri"
)

// KeyToken is the agent token Secret's key.
const KeyToken = "token"

// Labels are those of every Secret the operator makes for c (credentials and
// certificates): its cache holds only Secrets with the cluster label.
func Labels(c *dbv1.PostgresCluster) map[string]string {
	return map[string]string{
		dbv1.LabelCluster:              c.Name,
		"app.kubernetes.io/managed-by": "pgpilot",
		"app.kubernetes.io/part-of":    "pgpilot",
	}
}

// Credential is one role whose credentials live in a Secret.
type Credential struct {
	// Name of the Secret.
	Name string
	// Username is the PostgreSQL role.
	Username string
	// App marks the application Secret, which also carries connection details.
	App bool
}

// Wanted lists the credentials Secrets of a cluster.
func Wanted(c *dbv1.PostgresCluster) []Credential {
	return []Credential{
		{Name: c.SuperuserSecretName(), Username: dbv1.SuperuserName},
		{Name: c.ReplicationSecretName(), Username: dbv1.ReplicationUser},
		{Name: c.AppSecretName(), Username: c.Spec.Bootstrap.Owner, App: true},
	}
}

// Problem says what makes an existing credentials Secret unusable, or "" when it is fine.
func Problem(s *corev1.Secret) string {
	for _, k := range []string{KeyUsername, KeyPassword} {
		if len(s.Data[k]) == 0 {
			return fmt.Sprintf("Secret %s has no %q key", s.Name, k)
		}
	}
	return ""
}

// Get reads Secret key into s from cached, the manager's cache, and only when the cache
// does not hold it from reader, the API server: every Secret the operator makes is
// labelled (Labels) and so cached, while one a user made beforehand (a chosen password,
// a certificate) is not. A cluster's controllers read its Secrets at every reconcile;
// reading each from the API server cost a GET per Secret per reconcile, eight per
// credentials reconcile, throttled by the client's rate limit behind every other
// cluster's (at 1,000 clusters, 27 minutes before the last had its Secrets). A cached
// copy may be a moment old: a write based on it fails on its resourceVersion and is
// retried, and a Secret not yet in the cache is read from the API server.
func Get(ctx context.Context, cached, reader client.Reader, key client.ObjectKey, s *corev1.Secret) error {
	err := cached.Get(ctx, key, s)
	if !apierrors.IsNotFound(err) {
		return err
	}
	return reader.Get(ctx, key, s)
}
