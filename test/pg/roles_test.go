package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// loginAs connects to the instance over TLS (hostssl, SCRAM) as user, to database.
func (in *instance) loginAs(user, password, database string) error {
	return in.queryAs(user, password, database, "SELECT 1", new(int))
}

// queryAs scans the row of query, run over TLS as user in database, into dest.
func (in *instance) queryAs(user, password, database, query string, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=%s user=%s sslmode=require connect_timeout=3", in.ip, database, user))
	if err != nil {
		return err
	}
	cfg.Password = password
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, query).Scan(dest...)
}

// setSecret writes key of Secret name (creating it, labelled with the cluster so the
// controller watches it).
func (c *cluster) setSecret(name, key, value string) {
	c.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var s corev1.Secret
		err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, &s)
		if err != nil {
			return k8s.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace, Labels: map[string]string{dbv1.LabelCluster: c.name}},
				Data:       map[string][]byte{key: []byte(value)},
			})
		}
		s.Data[key] = []byte(value)
		return k8s.Update(ctx, &s)
	})
	if err != nil {
		c.t.Fatal(err)
	}
}

// managed is the status item name of list, or an error saying what the status holds.
func managed(list []dbv1.ManagedStatus, name string) (dbv1.ManagedStatus, error) {
	i := slices.IndexFunc(list, func(m dbv1.ManagedStatus) bool { return m.Name == name })
	if i < 0 {
		return dbv1.ManagedStatus{}, fmt.Errorf("no status item %s in %v", name, list)
	}
	return list[i], nil
}

// Roles and databases of the spec are made on the primary without a restart; a role
// logs in over TLS with its Secret's password, and a changed password works (and the
// old one no longer does) without a restart; pgpilot's own Secrets rotate the same way,
// and a replica keeps streaming through a change of the replication role's password
// (it authenticates by certificate). A database whose owner does not exist fails alone,
// with PostgreSQL's message in its status and an event.
func TestRolesAndDatabasesWithoutRestart(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 2, func(p *dbv1.PostgresCluster) {
		p.Spec.Roles = []dbv1.RoleSpec{
			{Name: "readers", Login: new(bool)},
			{Name: "alice", PasswordSecret: &dbv1.PasswordSecretRef{Name: "alice-pw"}, InRoles: []string{"readers"}},
		}
		p.Spec.Databases = []dbv1.DatabaseSpec{
			{Name: "shop", Owner: "alice", Extensions: []dbv1.ExtensionName{"citext"}},
			{Name: "broken", Owner: "nobody"},
		}
	})
	startOperated(t, c)
	primary, replica := c.instances[0], c.instances[1]
	pid := primary.postmasterPid()
	// Created after the cluster: the role is Failed until the Secret exists, and the
	// Secret's creation (it carries the cluster label) reconciles it.
	c.setSecret("alice-pw", "password", "first-secret")

	// alice logs in as soon as her role and database exist; the database's extension and
	// her membership are the same reconcile's next items.
	testutil.Eventually(t, time.Minute, func() error {
		var citext, member bool
		if err := primary.queryAs("alice", "first-secret", "shop", `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citext'),
			pg_has_role('alice', 'readers', 'MEMBER')`, &citext, &member); err != nil {
			return err
		}
		if !citext || !member {
			return fmt.Errorf("citext in shop: %v, alice a member of readers: %v", citext, member)
		}
		return nil
	})
	ctx := context.Background()

	testutil.Eventually(t, time.Minute, func() error {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return err
		}
		alice, err := managed(pgc.Status.Roles, "alice")
		if err != nil || alice.State != dbv1.ManagedReconciled {
			return fmt.Errorf("alice: %+v %v", alice, err)
		}
		shop, err := managed(pgc.Status.Databases, "shop")
		if err != nil || shop.State != dbv1.ManagedReconciled {
			return fmt.Errorf("shop: %+v %v", shop, err)
		}
		broken, err := managed(pgc.Status.Databases, "broken")
		if err != nil || broken.State != dbv1.ManagedFailed || !strings.Contains(broken.Message, `role "nobody" does not exist`) {
			return fmt.Errorf("broken: %+v %v", broken, err)
		}
		cond := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionRolesReconciled)
		if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "database broken") {
			return fmt.Errorf("RolesReconciled: %+v", cond)
		}
		return nil
	})
	// The event is recorded asynchronously, after the status may be read.
	testutil.Eventually(t, 30*time.Second, func() error {
		if !slices.ContainsFunc(c.events(dbv1.ReasonDatabaseFailed), func(e corev1.Event) bool {
			return strings.Contains(e.Message, `role "nobody" does not exist`)
		}) {
			return fmt.Errorf("no DatabaseFailed event with PostgreSQL's message: %v", c.events(dbv1.ReasonDatabaseFailed))
		}
		return nil
	})

	// Rotate alice's password, the application owner's and the replication role's.
	names := dbv1.NamesOf(c.name)
	rotated := time.Now()
	c.setSecret("alice-pw", "password", "second-secret")
	c.setSecret(names.AppSecret(), "password", "new-app-password")
	c.setSecret(names.ReplicationSecret(), "password", "new-replication-password")
	testutil.Eventually(t, time.Minute, func() error {
		if err := primary.loginAs("alice", "second-secret", "shop"); err != nil {
			return fmt.Errorf("alice's new password: %w", err)
		}
		if err := primary.loginAs("app", "new-app-password", "app"); err != nil {
			return fmt.Errorf("app's new password: %w", err)
		}
		if primary.loginAs("alice", "first-secret", "shop") == nil {
			return errors.New("alice's old password still works")
		}
		return nil
	})
	t.Logf("the new passwords worked %s after the Secrets changed", time.Since(rotated).Round(10*time.Millisecond))
	if got := primary.postmasterPid(); got != pid {
		t.Errorf("postgres restarted: postmaster pid %d, was %d", got, pid)
	}
	// The replica still streams, and gets a write made after the change.
	c.creds.App.Password = "new-app-password"
	primary.mustExec("CREATE TABLE after_rotation (id int)")
	primary.mustExec("INSERT INTO after_rotation VALUES (1)")
	replica.waitCount("after_rotation", 1, 30*time.Second)
	if st, err := replica.status(); err != nil || st.Role != "replica" {
		t.Errorf("the replica: %+v %v", st, err)
	}
}
