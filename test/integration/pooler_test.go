package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// poolerImage is what RELATED_IMAGE_PGBOUNCER says during the tests.
const poolerImage = "registry.example.com/pgpilot/pgbouncer:test"

// spec.pooler on a real API server: the operator renders the pooler's Deployment with
// PgBouncer's image, issues its server certificate (its Services and pods) and the
// lookup role's client certificate, and reports the pool in status.pooler; removed
// from the spec, the Deployment goes and status.pooler with it.
func TestPoolerIsRenderedAndReported(t *testing.T) {
	ns := newNamespace(t)
	c := newCluster(ns, "pool")
	c.Spec.Pooler = &dbv1.PoolerSpec{Instances: 2}
	create(t, c)
	n := dbv1.NamesOf("pool")
	var d appsv1.Deployment
	testutil.Eventually(t, timeout, func() error { return get(ns, n.PoolerReadWrite(), &d) })
	if got := d.Spec.Template.Spec.Containers[0].Image; got != poolerImage {
		t.Errorf("the pooler's image is %q, want %q", got, poolerImage)
	}
	secret := func(name string) *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		testutil.Eventually(t, timeout, func() error { return get(ns, name, &s) })
		return &s
	}
	ca := secret(n.CASecret()).Data["ca.crt"]
	server := secret(n.PoolerTLSSecret())
	for _, host := range []string{n.PoolerReadWrite() + "." + ns + ".svc", n.PoolerHeadless() + "." + ns + ".svc", "pool-pooler-rw-abc-1." + n.PoolerHeadless() + "." + ns + ".svc"} {
		if why := pki.VerifyServer(server.Data["tls.crt"], ca, host, time.Now()); why != "" {
			t.Errorf("the pooler's certificate for %s: %s", host, why)
		}
	}
	client := secret(n.PoolerClientTLSSecret())
	leaf, err := pki.Parse(client.Data["tls.crt"], client.Data["tls.key"])
	if err != nil || leaf.Cert.Subject.CommonName != poolerauth.Role {
		t.Fatalf("the pooler's client certificate: %v, %+v", err, leaf)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, "pool", c); err != nil {
			return err
		}
		p := c.Status.Pooler
		// No kubelet here: the Deployment never gets a ready pod.
		if p == nil || p.Instances != 2 || p.ReadyInstances != 0 || p.Message == "" {
			return fmt.Errorf("status.pooler %+v", p)
		}
		return nil
	})

	if err := update(ns, "pool", func(c *dbv1.PostgresCluster) { c.Spec.Pooler = nil }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, n.PoolerReadWrite(), &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the pooler's Deployment is still there (%v)", err)
		}
		if err := get(ns, "pool", c); err != nil {
			return err
		}
		if c.Status.Pooler != nil {
			return fmt.Errorf("status.pooler %+v without spec.pooler", c.Status.Pooler)
		}
		return nil
	})
}

// A pooler setting pgpilot owns is refused by the API server, with what to use
// instead; a value the CRD cannot check is refused by the operator before it renders
// anything, in the Ready condition.
func TestBadPoolerSettingsAreRefused(t *testing.T) {
	ns := newNamespace(t)
	for i, tc := range []struct {
		params map[string]any
		want   string
	}{
		{map[string]any{"auth_type": "trust"}, "pooler parameters set by pgpilot cannot be given"},
		{map[string]any{"pool_mode": "session"}, "pool_mode (use mode)"},
		{map[string]any{"Query_Wait_Timeout": "1"}, "pooler parameters are PgBouncer settings' names"},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": dbv1.GroupVersion.String(), "kind": "PostgresCluster",
			"metadata": map[string]any{"name": fmt.Sprintf("badpool-%d", i), "namespace": ns},
			"spec":     map[string]any{"version": "16", "pooler": map[string]any{"parameters": tc.params}},
		}}
		err := k8s.Create(context.Background(), u)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an Invalid error containing %q", tc.params, err, tc.want)
		}
	}
	c := newCluster(ns, "badvalue")
	c.Spec.Pooler = &dbv1.PoolerSpec{Parameters: map[string]string{"server_reset_query": "DISCARD ALL\nauth_type = trust"}}
	create(t, c)
	testutil.Eventually(t, timeout, func() error {
		if err := get(ns, c.Name, c); err != nil {
			return err
		}
		ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
		if c.Status.Phase != dbv1.PhaseFailed || ready == nil || !strings.Contains(ready.Message, "spec.pooler.parameters: server_reset_query: the value may not hold a line break") {
			return fmt.Errorf("phase %q, Ready %+v", c.Status.Phase, ready)
		}
		return nil
	})
}
