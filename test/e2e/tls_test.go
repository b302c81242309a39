//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// An application pod with the published CA connects with sslmode=verify-full through
// -rw and -ro by their DNS names, and one with sslmode=disable is refused. A server
// certificate with one minute left is renewed by the operator and served by every
// instance without a restart, while writes go on.
func TestTLS(t *testing.T) {
	d := newDB(t, 2)
	d.waitHealthy(2, 10*time.Minute)
	d.waitStreaming(1, time.Minute)
	n := dbv1.NamesOf(d.name)

	conninfo := func(svc, mode string) string {
		return fmt.Sprintf("host=%s.%s.svc port=5432 dbname=app user=app sslmode=%s sslrootcert=/ca/ca.crt connect_timeout=5", svc, d.ns, mode)
	}
	script := strings.Join([]string{
		fmt.Sprintf(`psql "%s" -Atc "SELECT 'rw', ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"`, conninfo(n.ReadWriteService(), "verify-full")),
		fmt.Sprintf(`psql "%s" -Atc "SELECT 'ro', pg_is_in_recovery()"`, conninfo(n.ReadOnlyService(), "verify-full")),
		fmt.Sprintf(`if psql "%s" -Atc "SELECT 1"; then echo PLAINTEXT-ACCEPTED; fi`, conninfo(n.ReadWriteService(), "disable")),
	}, "; ")
	out := d.runPsql(script)
	for _, want := range []string{"rw|t", "ro|t", "no encryption"} {
		if !strings.Contains(out, want) {
			t.Errorf("the client pod's output has no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "PLAINTEXT-ACCEPTED") {
		t.Errorf("a connection with sslmode=disable was accepted:\n%s", out)
	}

	// Rotation: the server certificate gets one minute left.
	ctx := context.Background()
	w := d.newTable()
	w.insert(10)
	started := d.postmasterStarts()
	var caKey, server corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.CAKeySecret()}, &caKey); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.Parse(caKey.Data["tls.crt"], caKey.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	pgc := d.cluster()
	req := certificates.ServerRequest(&pgc)
	req.Validity = time.Minute
	short, err := pki.Issue(ca, req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.ServerTLSSecret()}, &server); err != nil {
		t.Fatal(err)
	}
	server.Data["tls.crt"], server.Data["tls.key"] = short.CertPEM, short.KeyPEM
	if err := k8s.Update(ctx, &server); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	var renewed *pki.KeyPair
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.ServerTLSSecret()}, &server); err != nil {
			return err
		}
		if renewed, err = pki.Parse(server.Data["tls.crt"], server.Data["tls.key"]); err != nil {
			return err
		}
		if renewed.Cert.NotAfter.Before(time.Now().Add(24 * time.Hour)) {
			return fmt.Errorf("not renewed yet: valid until %s", renewed.Cert.NotAfter)
		}
		return nil
	})
	t.Logf("renewed by the operator %s after the certificate got a minute left", time.Since(rotated).Round(time.Second))
	failed := 0
	testutil.Eventually(t, 3*time.Minute, func() error {
		if err := w.try(); err != nil {
			failed++
		}
		for _, svc := range []string{"rw", "ro"} {
			serial, err := d.servedSerial(svc)
			if err != nil {
				return err
			}
			if serial != renewed.Cert.SerialNumber.String() {
				return fmt.Errorf("-%s serves serial %s, not the renewed %s", svc, serial, renewed.Cert.SerialNumber)
			}
		}
		return nil
	})
	t.Logf("the renewed certificate served through -rw and -ro %s after the renewal", time.Since(rotated).Round(time.Second))
	if failed > 0 {
		t.Errorf("%d writes through -rw failed while the certificate was renewed", failed)
	}
	if now := d.postmasterStarts(); now != started {
		t.Errorf("postmasters started at %v before the renewal, %v after: an instance restarted", started, now)
	}
	w.check()
}

// runPsql runs script in a pod of the cluster's namespace from the PostgreSQL image,
// with the published CA mounted at /ca and the application's password in PGPASSWORD,
// and returns its output.
func (d *db) runPsql(script string) string {
	d.t.Helper()
	ctx := context.Background()
	n := dbv1.NamesOf(d.name)
	var sts appsv1.StatefulSet
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: n.StatefulSet()}, &sts); err != nil {
		d.t.Fatal(err)
	}
	image := ""
	for _, c := range sts.Spec.Template.Spec.Containers {
		if c.Name == "postgres" {
			image = c.Image
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "psql"},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](999),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "psql", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{{Name: "PGPASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: n.AppSecret()}, Key: "password"}}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "ca", MountPath: "/ca", ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
			Volumes: []corev1.Volume{{Name: "ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: n.CASecret()}}}},
		}}
	if err := k8s.Create(ctx, pod); err != nil {
		d.t.Fatal(err)
	}
	testutil.Eventually(d.t, 2*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: "psql"}, pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("the psql pod is %s", pod.Status.Phase)
		}
		return nil
	})
	b, err := clientset.CoreV1().Pods(d.ns).GetLogs("psql", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		d.t.Fatal(err)
	}
	return string(b)
}

// servedSerial is the serial number of the certificate served through Service svc.
func (d *db) servedSerial(svc string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, svc)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	tc, ok := conn.PgConn().Conn().(*tls.Conn)
	if !ok {
		return "", fmt.Errorf("the connection through -%s is not TLS", svc)
	}
	return tc.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// postmasterStarts are pg_postmaster_start_time() of the instances behind -rw and -ro.
func (d *db) postmasterStarts() [2]time.Time {
	d.t.Helper()
	var out [2]time.Time
	for i, svc := range []string{"rw", "ro"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := d.conn(ctx, svc)
		if err != nil {
			cancel()
			d.t.Fatal(err)
		}
		err = conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&out[i])
		conn.Close(context.Background())
		cancel()
		if err != nil {
			d.t.Fatal(err)
		}
	}
	return out
}
