//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// The S3 server's image (E2E_S3_IMAGE in hack/e2e/run.sh): versitygw, built here.
var s3Image = envOr("E2E_S3_IMAGE", "pgpilot-versitygw:1.8.0")

// A cluster archives WAL to, and is backed up on demand to, an S3-compatible server in
// a pod of its namespace, with the credentials from a Secret the instance pods mount.
// A new cluster restored to a time between two batches of rows has exactly the first.
func TestS3BackupRestoresToAPointInTime(t *testing.T) {
	const bucket = "pgpilot"
	d := newDB(t, 2, func(c *dbv1.PostgresCluster) {
		c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Path: "e2e", S3: &dbv1.S3Store{
			Endpoint:    "http://s3:7070",
			Bucket:      bucket,
			Credentials: dbv1.S3Credentials{SecretName: "s3-credentials"},
		}}}
		c.Spec.PostgreSQL.SuperuserNetworkAccess = true // archiveCurrentWAL
	})
	s3 := startS3(t, d.ns)
	makeBucket(t, s3, bucket)
	d.waitHealthy(2, 10*time.Minute)
	w := d.newTable()
	w.insert(100)

	ctx := context.Background()
	backup := &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "before"},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: d.name}}}
	if err := k8s.Create(ctx, backup); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(backup), backup); err != nil {
			return err
		}
		switch backup.Status.Phase {
		case dbv1.BackupCompleted:
			return nil
		case dbv1.BackupFailed:
			t.Fatalf("backup failed: %s", backup.Status.Error)
		}
		return fmt.Errorf("backup %s", backup.Status.Phase)
	})
	t.Logf("backup %s completed: %s at %s", backup.Name, backup.Status.Size, backup.Status.Location)

	w.insert(50)
	time.Sleep(time.Second)
	target := time.Now()
	time.Sleep(time.Second)
	w.insert(50)
	d.archiveCurrentWAL()

	restored := &db{t: t, ns: d.ns, name: "restored"}
	pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: restored.name},
		Spec: dbv1.PostgresClusterSpec{Replicas: 2, Version: version}}
	pgc.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: backup.Name, TargetTime: &metav1.Time{Time: target}}
	if err := k8s.Create(ctx, pgc); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	restored.waitHealthy(2, 10*time.Minute)
	t.Logf("restored to %s: Healthy %s after creation", target.Format(time.RFC3339), time.Since(start).Round(time.Second))
	n, err := restored.count("rw", "t")
	if err != nil {
		t.Fatal(err)
	}
	if n != 150 {
		t.Errorf("the cluster restored to a time between the batches has %d rows, want 150 (100 in the backup, 50 replayed from archived WAL)", n)
	}
	restored.waitCount("ro", "t", n, time.Minute)
}

// archiveCurrentWAL switches the primary to a new WAL segment, as the superuser, and
// waits until the primary's agent reports the closed segment archived. The cluster
// must let the superuser log in over the network (spec.postgresql.superuserNetworkAccess).
func (d *db) archiveCurrentWAL() {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgc := d.cluster()
	conn, err := d.superuserConn(ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var segment string
	if err := conn.QueryRow(ctx, "SELECT pg_walfile_name(pg_switch_wal())").Scan(&segment); err != nil {
		d.t.Fatal(err)
	}
	testutil.Eventually(d.t, 2*time.Minute, func() error {
		st, err := d.agentStatus(pgc.Status.CurrentPrimary)
		if err != nil {
			return err
		}
		if st.Archiver == nil || st.Archiver.LastArchivedWAL < segment {
			return fmt.Errorf("waiting for %s to be archived: %+v", segment, st.Archiver)
		}
		return nil
	})
}

// superuserConn connects to the primary through -rw as the superuser. The cluster must
// let the superuser log in over the network (spec.postgresql.superuserNetworkAccess).
func (d *db) superuserConn(ctx context.Context) (*pgx.Conn, error) {
	var s corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).ReadWriteService()}, &s); err != nil {
		return nil, err
	}
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: dbv1.NamesOf(d.name).SuperuserSecret()}, &secret); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=postgres user=%s sslmode=require connect_timeout=3", s.Spec.ClusterIP, secret.Data["username"]))
	if err != nil {
		return nil, err
	}
	if cfg.TLSConfig, err = d.verifyFull(ctx, s.Name+"."+d.ns+".svc"); err != nil {
		return nil, err
	}
	cfg.Password = string(secret.Data["password"])
	return pgx.ConnectConfig(ctx, cfg)
}

// startS3 runs versitygw in a pod of namespace ns, behind the Service s3:7070, with a
// root account whose keys are in the Secret s3-credentials (under the key names a
// cluster's S3 store reads by default), and returns a client for it.
func startS3(t *testing.T, ns string) *minio.Client {
	t.Helper()
	ctx := context.Background()
	key, secret := randomHex(t, 10), randomHex(t, 20)
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3-credentials"},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3", Labels: map[string]string{"app": "s3"}},
			Spec: corev1.PodSpec{
				SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{
					Name: "versitygw", Image: s3Image, ImagePullPolicy: corev1.PullIfNotPresent,
					Args: []string{"--port", ":7070", "--region", "us-east-1", "--health", "/health",
						"--iam-dir", "/srv/iam", "--quiet", "posix", "--sidecar", "/srv/meta", "/srv/data"},
					Env: []corev1.EnvVar{
						{Name: "ROOT_ACCESS_KEY", ValueFrom: secretKey("s3-credentials", "AWS_ACCESS_KEY_ID")},
						{Name: "ROOT_SECRET_KEY", ValueFrom: secretKey("s3-credentials", "AWS_SECRET_ACCESS_KEY")},
					},
					Ports: []corev1.ContainerPort{{ContainerPort: 7070}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(7070)}}},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				}},
			}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s3"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "s3"},
				Ports: []corev1.ServicePort{{Port: 7070, TargetPort: intstr.FromInt32(7070)}}}},
	}
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var svc corev1.Service
	testutil.Eventually(t, 2*time.Minute, func() error {
		var p corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s3"}, &p); err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s3"}, &svc)
			}
		}
		return fmt.Errorf("the S3 pod is %s, not ready", p.Status.Phase)
	})
	c, err := minio.New(svc.Spec.ClusterIP+":7070", &minio.Options{
		Creds: credentials.NewStaticV4(key, secret, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func secretKey(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// makeBucket makes bucket in the store startS3 started. Its Service routes to the store a
// moment after the pod is ready, so refusals are waited through; a bucket an attempt made
// before its answer was lost is there already.
func makeBucket(t *testing.T, s3 *minio.Client, bucket string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, func() error {
		err := s3.MakeBucket(context.Background(), bucket, minio.MakeBucketOptions{Region: "us-east-1"})
		if minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
			return nil
		}
		return err
	})
}
