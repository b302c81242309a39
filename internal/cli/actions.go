package cli

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
)

// pollEvery is how often --wait looks.
const pollEvery = time.Second

// switchover asks for a switchover to target, as a person would with the annotation,
// and waits for it when wait > 0.
func (o *Options) switchover(ctx context.Context, name, target string, wait time.Duration) error {
	c, err := o.cluster(ctx, name)
	if err != nil {
		return err
	}
	if !slices.Contains(instances(c), target) {
		return fmt.Errorf("%s is not an instance of %s (%v)", target, name, instances(c))
	}
	if c.Status.CurrentPrimary == target {
		return fmt.Errorf("%s is the primary already", target)
	}
	if pending := c.Annotations[dbv1.AnnotationSwitchoverTo]; pending != "" {
		return fmt.Errorf("a switchover to %s is under way", pending)
	}
	if err := switchover.Request(ctx, o.Client, c, target); err != nil {
		return err
	}
	fmt.Fprintf(o.Streams.Out, "Asked for a switchover of %s to %s\n", name, target)
	if wait <= 0 {
		return nil
	}
	return o.poll(ctx, wait, func(ctx context.Context) (bool, error) {
		c, err := o.cluster(ctx, name)
		if err != nil {
			return false, err
		}
		if _, pending := c.Annotations[dbv1.AnnotationSwitchoverTo]; pending {
			return false, nil
		}
		if c.Status.CurrentPrimary != target {
			return false, fmt.Errorf("the switchover ended with %s as primary: kubectl get events --field-selector involvedObject.name=%s says why", orDash(c.Status.CurrentPrimary), name)
		}
		fmt.Fprintf(o.Streams.Out, "%s is the primary\n", target)
		return true, nil
	})
}

// backup creates a PostgresBackup of the cluster, and waits for it when wait > 0.
func (o *Options) backup(ctx context.Context, name string, wait time.Duration) error {
	c, err := o.cluster(ctx, name)
	if err != nil {
		return err
	}
	if c.Spec.Backup == nil {
		return fmt.Errorf("%s has no spec.backup: there is no store to back up to", name)
	}
	b := &dbv1.PostgresBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, GenerateName: name + "-manual-", Labels: map[string]string{dbv1.LabelCluster: name}},
		Spec:       dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: name}},
	}
	if err := o.Client.Create(ctx, b); err != nil {
		return err
	}
	fmt.Fprintf(o.Streams.Out, "Created PostgresBackup %s\n", b.Name)
	if wait <= 0 {
		return nil
	}
	return o.poll(ctx, wait, func(ctx context.Context) (bool, error) {
		if err := o.Client.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return false, err
		}
		switch b.Status.Phase {
		case dbv1.BackupCompleted:
			fmt.Fprintf(o.Streams.Out, "%s completed: %s from %s\n", b.Name, b.Status.Size, b.Status.Instance)
			return true, nil
		case dbv1.BackupFailed:
			return false, fmt.Errorf("%s failed: %s", b.Name, b.Status.Error)
		}
		return false, nil
	})
}

// restart sets the restart annotation to now; the rolling update does the rest.
func (o *Options) restart(ctx context.Context, name string) error {
	c, err := o.cluster(ctx, name)
	if err != nil {
		return err
	}
	patch := client.MergeFrom(c.DeepCopy())
	now := o.Now().UTC().Format(time.RFC3339)
	metav1.SetMetaDataAnnotation(&c.ObjectMeta, dbv1.AnnotationRestartedAt, now)
	if err := o.Client.Patch(ctx, c, patch); err != nil {
		return err
	}
	fmt.Fprintf(o.Streams.Out, "Restarting %s's instances one at a time (%s=%s); kubectl pgpilot status %s follows it\n", name, dbv1.AnnotationRestartedAt, now, name)
	return nil
}

// psql runs psql in an instance, connected to -rw as the application owner.
func (o *Options) psql(ctx context.Context, name string, args []string) error {
	c, err := o.cluster(ctx, name)
	if err != nil {
		return err
	}
	pod := c.Status.CurrentPrimary
	if pod == "" {
		pod = c.InstanceName(0)
	}
	return o.Kubectl(psqlArgs(c, pod, args)...)
}

// psqlArgs are kubectl exec's arguments for psql in pod: the password is read from the
// file the pod mounts, inside the pod, so it is in no request to the API server.
func psqlArgs(c *dbv1.PostgresCluster, pod string, args []string) []string {
	db := c.Spec.Bootstrap.Database
	if db == "" {
		db = "app"
	}
	conninfo := fmt.Sprintf("host=%s port=5432 dbname=%s sslmode=verify-full sslrootcert=/etc/pgpilot/tls/server/ca.crt",
		c.Names().ReadWriteService(), db)
	script := `PGUSER="$(cat /etc/pgpilot/secrets/app/username)" PGPASSWORD="$(cat /etc/pgpilot/secrets/app/password)" exec psql "$0" "$@"`
	return append([]string{"exec", "-it", pod, "--container=postgres", "--", "sh", "-c", script, conninfo}, args...)
}

// poll checks done every second until it says so, fails, or wait passes.
func (o *Options) poll(ctx context.Context, wait time.Duration, done func(context.Context) (bool, error)) error {
	err := waitPoll(ctx, wait, done)
	if wait > 0 && err != nil && ctx.Err() == nil && isTimeout(err) {
		return fmt.Errorf("not done within %s", wait)
	}
	return err
}

func waitPoll(ctx context.Context, timeout time.Duration, done func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, pollEvery, timeout, true, done)
}

func isTimeout(err error) bool { return wait.Interrupted(err) }
