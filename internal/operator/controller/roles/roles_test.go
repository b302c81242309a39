package roles_test

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/roles"
	"github.com/pgpilot/pgpilot/internal/operator/secrets"
)

func TestSecretsReadNamesRolePasswordsAndCredentials(t *testing.T) {
	c := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"},
		Spec: dbv1.PostgresClusterSpec{Replicas: 3, Version: "16", Roles: []dbv1.RoleSpec{
			{Name: "reporting", PasswordSecret: &dbv1.PasswordSecretRef{Name: "reporting-password"}},
			{Name: "etl"},
		}}}
	got := roles.SecretsRead(c)
	if !slices.Contains(got, "reporting-password") {
		t.Errorf("SecretsRead = %v, lacks the role's password Secret", got)
	}
	for _, w := range secrets.Wanted(c) {
		if !slices.Contains(got, w.Name) {
			t.Errorf("SecretsRead = %v, lacks credentials Secret %s", got, w.Name)
		}
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("SecretsRead = %v, not sorted and unique", got)
	}
}
