package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
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
	testutil.Eventually(t, timeout, func() error {
		var sts appsv1.StatefulSet
		if err := get(ns, "dr", &sts); err != nil {
			return err
		}
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == "tls-source" && v.Secret != nil && v.Secret.SecretName == "src-replication" {
				return nil
			}
		}
		return fmt.Errorf("the StatefulSet mounts no source certificate: %+v", sts.Spec.Template.Spec.Volumes)
	})
	var cm corev1.ConfigMap
	if err := get(ns, dbv1.NamesOf("dr").ConfigMap(), &cm); err != nil {
		t.Fatal(err)
	}
	var cfg clusterconfig.Config
	if err := json.Unmarshal([]byte(cm.Data["config.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if r := cfg.Replica; r == nil || !r.Enabled || r.Host != "src-rw.prod.svc" || r.Port != 5432 {
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
