package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/controller/certificates"
	"github.com/pgpilot/pgpilot/internal/operator/pki"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/test/testutil"
)

func asReplica(enabled bool) clusterOption {
	return func(c *dbv1.PostgresCluster) {
		c.Spec.Replica = &dbv1.ReplicaSpec{Enabled: enabled,
			Source: dbv1.ReplicaSource{Host: "src-rw.prod.svc", ReplicationSecretName: "src-replication"}}
	}
}

// A replica cluster renders the source's certificate mounted and the source in
// config.json. The API refuses removing spec.replica and a malformed source or token;
// the plan refuses a new cluster that would both restore and follow a source.
func TestReplicaClusterSpec(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCluster(ns, "dr", asReplica(true)))
	// Every cluster's pods mount the copy of the source's certificate, optionally: a
	// demotion then changes no pod template.
	testutil.Eventually(t, timeout, func() error {
		var sts appsv1.StatefulSet
		if err := get(ns, "dr", &sts); err != nil {
			return err
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == "tls-source" && v.Secret != nil && v.Secret.SecretName == "dr-source-tls" && v.Secret.Optional != nil && *v.Secret.Optional {
				return nil
			}
		}
		return fmt.Errorf("the StatefulSet mounts no optional source certificate: %+v", sts.Spec.Template.Spec.Volumes)
	})
	// The user's copy of the source's replication certificate is copied for the pods.
	ca, err := pki.NewCA("src test CA", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.Issue(ca, certificates.ReplicationRequest(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src-replication"},
		Data: map[string][]byte{"tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM, "ca.crt": ca.CertPEM, "other": []byte("not copied")}})
	// A spec change has the certificates controller look again (it also does every 5 minutes).
	if err := update(ns, "dr", func(c *dbv1.PostgresCluster) { c.Spec.Replica.Source.Port = 5433 }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error {
		var copied corev1.Secret
		if err := get(ns, "dr-source-tls", &copied); err != nil {
			return err
		}
		if !bytes.Equal(copied.Data["tls.key"], leaf.KeyPEM) || !bytes.Equal(copied.Data["ca.crt"], ca.CertPEM) || len(copied.Data) != 3 {
			return fmt.Errorf("the copy holds %d keys", len(copied.Data))
		}
		return nil
	})
	// A copy about to expire is warned about.
	short := certificates.ReplicationRequest()
	short.Validity = 24 * time.Hour
	soon, err := pki.Issue(ca, short, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Update(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src-replication"},
		Data: map[string][]byte{"tls.crt": soon.CertPEM, "tls.key": soon.KeyPEM, "ca.crt": ca.CertPEM}}); err != nil {
		t.Fatal(err)
	}
	if err := update(ns, "dr", func(c *dbv1.PostgresCluster) { c.Spec.Replica.Source.Port = 5434 }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, timeout, func() error { return event(ns, "dr", dbv1.ReasonCertificateInvalid, "expires in") })

	var cm corev1.ConfigMap
	if err := get(ns, dbv1.NamesOf("dr").ConfigMap(), &cm); err != nil {
		t.Fatal(err)
	}
	var cfg clusterconfig.Config
	if err := json.Unmarshal([]byte(cm.Data["config.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if r := cfg.Replica; r == nil || !r.Enabled || r.Host != "src-rw.prod.svc" {
		t.Errorf("config.json's replica: %+v", r)
	}

	refused := func(err error, want string) {
		t.Helper()
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an Invalid error containing %q", err, want)
		}
	}
	refused(update(ns, "dr", func(c *dbv1.PostgresCluster) { c.Spec.Replica = nil }), "replica cannot be removed")
	// Promoted, then demoted again (a switch of roles back): both are allowed.
	if err := update(ns, "dr", func(c *dbv1.PostgresCluster) {
		c.Spec.Replica.Enabled = false
		c.Spec.Replica.PromotionToken = "7716692280013944060:1:0/6000028"
	}); err != nil {
		t.Fatalf("promoting: %v", err)
	}
	if err := update(ns, "dr", func(c *dbv1.PostgresCluster) { c.Spec.Replica.Enabled = true }); err != nil {
		t.Fatalf("demoting: %v", err)
	}
	refused(update(ns, "dr", func(c *dbv1.PostgresCluster) { c.Spec.Replica.PromotionToken = "0/6000028" }), "spec.replica.promotionToken")

	// A running cluster may be demoted.
	create(t, newCluster(ns, "own"))
	if err := update(ns, "own", func(c *dbv1.PostgresCluster) { asReplica(true)(c) }); err != nil {
		t.Fatalf("demoting a cluster: %v", err)
	}

	bad := newCluster(ns, "bad-host", func(c *dbv1.PostgresCluster) {
		asReplica(true)(c)
		c.Spec.Replica.Source.Host = "http://src"
	})
	refused(k8s.Create(context.Background(), bad), "spec.replica.source.host")

	// A new cluster cannot be both a replica and a restore: said in Ready, nothing rendered.
	create(t, newCluster(ns, "both", asReplica(true), func(c *dbv1.PostgresCluster) {
		c.Spec.Bootstrap.FromBackup = &dbv1.FromBackup{BackupName: "nightly"}
	}))
	testutil.Eventually(t, timeout, func() error {
		var c dbv1.PostgresCluster
		if err := get(ns, "both", &c); err != nil {
			return err
		}
		ready := dbv1.FindCondition(c.Status.Conditions, dbv1.ConditionReady)
		if c.Status.Phase != dbv1.PhaseFailed || ready == nil || !strings.Contains(ready.Message, "replica and bootstrap.fromBackup cannot both be set") {
			return fmt.Errorf("phase %q, Ready %+v", c.Status.Phase, ready)
		}
		return nil
	})
	if err := get(ns, "both", &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("the StatefulSet of a replica restored from a backup was rendered (%v)", err)
	}
}
