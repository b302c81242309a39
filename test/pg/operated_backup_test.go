package pg

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/backup"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// withS3 gives the cluster spec.backup on s (creating its credentials Secret), or
// bootstrap.fromBackup from backupName.
func withS3(s *s3Store, retention int32) func(*dbv1.PostgresCluster) {
	return func(pgc *dbv1.PostgresCluster) {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-credentials", Namespace: pgc.Namespace},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": s.srv.AccessKeyID, "AWS_SECRET_ACCESS_KEY": s.srv.SecretAccessKey}}
		if err := k8s.Create(context.Background(), secret); err != nil {
			panic(err)
		}
		pgc.Spec.Backup = &dbv1.BackupSpec{
			Store: dbv1.BackupStore{Path: "prod", S3: &dbv1.S3Store{Endpoint: s.srv.Endpoint, Bucket: s.bucket,
				Credentials: dbv1.S3Credentials{SecretName: "s3-credentials"}}},
			Retention: &dbv1.RetentionSpec{Count: ptr.To(retention)},
		}
	}
}

func (c *cluster) backupObject(name string) (dbv1.PostgresBackup, error) {
	var b dbv1.PostgresBackup
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: name}, &b)
	return b, err
}

// requestBackup creates PostgresBackup name and waits until it is Completed.
func (c *cluster) requestBackup(name string) dbv1.PostgresBackup {
	c.t.Helper()
	b := &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: c.name}}}
	if err := k8s.Create(context.Background(), b); err != nil {
		c.t.Fatal(err)
	}
	var got dbv1.PostgresBackup
	testutil.Eventually(c.t, 2*time.Minute, func() error {
		var err error
		if got, err = c.backupObject(name); err != nil {
			return err
		}
		if got.Status.Phase != dbv1.BackupCompleted {
			return fmt.Errorf("backup %s: %+v", name, got.Status)
		}
		return nil
	})
	return got
}

// The operator end to end: backups requested as PostgresBackups run on a replica, the
// cluster reports archiving and its last backup, retention removes the older backup
// from the store and the API, and a new cluster restored from the kept backup by name
// has the data.
func TestOperatorBacksUpAndRestores(t *testing.T) {
	t.Parallel()
	s := newS3Store(t)
	c := newOperatedCluster(t, 2, withS3(s, 1))
	startOperated(t, c)
	if err := c.writeThroughRW("CREATE TABLE t (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if err := c.writeThroughRW("INSERT INTO t SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	first := c.requestBackup("first")
	if first.Status.Instance != c.instances[1].pod || first.Status.BeginLSN == "" || first.Status.Size == "" ||
		first.Status.Store == nil || first.Status.Store.S3 == nil {
		t.Errorf("the first backup's status: %+v; want it taken on the replica %s", first.Status, c.instances[1].pod)
	}
	if err := c.writeThroughRW("INSERT INTO t SELECT generate_series(101, 150)"); err != nil {
		t.Fatal(err)
	}
	c.requestBackup("second")

	// count: 1 keeps the second only, in the API and in the store.
	testutil.Eventually(t, time.Minute, func() error {
		if _, err := c.backupObject("first"); err == nil {
			return fmt.Errorf("the first backup is still there")
		}
		infos, err := backup.List(context.Background(), s.open(t, "prod/"+c.name))
		if err != nil {
			return err
		}
		if len(infos) != 1 || infos[0].ID != "second" {
			return fmt.Errorf("the store holds %+v", infos)
		}
		return nil
	})
	testutil.Eventually(t, time.Minute, func() error {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return err
		}
		cond := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionContinuousArchiving)
		if pgc.Status.LastBackup != "second" || cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("status: lastBackup %q, ContinuousArchiving %+v", pgc.Status.LastBackup, cond)
		}
		return nil
	})

	// Restored by name, in the same namespace, with a credentials Secret of its own.
	restored := newOperatedClusterIn(t, c.namespace, 1, func(pgc *dbv1.PostgresCluster) {
		pgc.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: "second"}
	})
	rp := restored.instances[0]
	rp.start()
	rp.waitRole(agentapi.RolePrimary, 2, 2*upTimeout)
	rp.waitCount("t", 150, 30*time.Second)
}

// When the store stops taking WAL, the cluster says so with the figures a person needs:
// the ContinuousArchiving condition and an ArchiveFailing event name the segments that
// wait on the primary's volume and their size, the volume's free space and, once the
// volume has been filling for a minute, how long until it is full.
func TestArchiveFailureSaysWhenTheVolumeIsFull(t *testing.T) {
	t.Parallel()
	s := newS3Store(t)
	c := newOperatedCluster(t, 1, withS3(s, 1))
	p := c.instances[0]
	p.onVolume(768 << 20)
	startOperated(t, c)
	if err := c.writeThroughRW("CREATE TABLE w (id int)"); err != nil {
		t.Fatal(err)
	}
	archiving := func() (*dbv1.Condition, error) {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return nil, err
		}
		cond := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionContinuousArchiving)
		if cond == nil {
			return nil, fmt.Errorf("no ContinuousArchiving condition: %+v", pgc.Status.Conditions)
		}
		return cond, nil
	}
	testutil.Eventually(t, time.Minute, func() error {
		cond, err := archiving()
		if err == nil && cond.Status != metav1.ConditionTrue {
			err = fmt.Errorf("archiving before the store stops: %+v", cond)
		}
		return err
	})

	s.srv.Stop()
	// A segment every 4 s: 16 MiB each, 4 MiB/s, for as long as the volume has not been
	// seen filling for a minute by the agent and the operator's next look.
	var last *dbv1.Condition
	deadline := time.Now().Add(3 * time.Minute)
	for i := 0; ; i++ {
		p.mustExec("INSERT INTO w VALUES ($1)", i)
		if err := p.superExec("SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
		if cond, err := archiving(); err == nil {
			last = cond
			if cond.Status == metav1.ConditionFalse && strings.Contains(cond.Message, "the volume is full in about") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ContinuousArchiving does not say when the volume is full: %+v", last)
		}
		time.Sleep(4 * time.Second)
	}
	t.Logf("ContinuousArchiving: %s", last.Message)
	for _, want := range []string{"segments (", "MiB) wait on the primary's volume", " MiB of 768 MiB free", "fix the store"} {
		if !strings.Contains(last.Message, want) {
			t.Errorf("ContinuousArchiving's message %q does not say %q", last.Message, want)
		}
	}
	if msg := c.eventMessage(dbv1.ReasonArchiveFailing); !strings.Contains(msg, "wait on the primary's volume") {
		t.Errorf("the ArchiveFailing event says %q; want the WAL that waits", msg)
	}
}
