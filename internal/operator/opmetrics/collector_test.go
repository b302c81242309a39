package opmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Only the replica that leads reports the clusters: each replica has them in its cache,
// and a sum over the operator's pods would count every cluster twice.
func TestClusterCollectorReportsWhileElected(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := dbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(&dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "my-db"}}).Build()
	elected := make(chan struct{})
	c := &clusterCollector{reader: reader, elected: elected, log: logr.Discard()}
	count := func() int {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		n, err := testutil.GatherAndCount(reg)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Errorf("a standby replica reported %d series, want none", n)
	}
	close(elected)
	if n := count(); n == 0 {
		t.Error("the leader reported no series for its cluster")
	}
}

// A cluster's last restore verification is a series: 1 succeeded, 0 failed, with when it
// finished; none before the first.
func TestVerificationSeries(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := dbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	finished := metav1.NewTime(time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC))
	cluster := func(name string, v *dbv1.BackupVerification) *dbv1.PostgresCluster {
		return &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: name},
			Status: dbv1.PostgresClusterStatus{LastBackupVerification: v}}
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		cluster("good", &dbv1.BackupVerification{Job: "j", Result: dbv1.VerificationSucceeded, FinishedAt: &finished}),
		cluster("bad", &dbv1.BackupVerification{Job: "j", Result: dbv1.VerificationFailed, FinishedAt: &finished}),
		cluster("never", nil),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&clusterCollector{reader: reader, log: logr.Discard()})
	want := `
# HELP pgpilot_backup_verification_succeeded 1 when the last restore verification of the cluster's backups (status.lastBackupVerification) succeeded, 0 when it failed. Absent before the first.
# TYPE pgpilot_backup_verification_succeeded gauge
pgpilot_backup_verification_succeeded{cluster="bad",namespace="db"} 0
pgpilot_backup_verification_succeeded{cluster="good",namespace="db"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgpilot_backup_verification_succeeded"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "pgpilot_backup_verification_last_timestamp_seconds"); err != nil || n != 2 {
		t.Errorf("%d finish times (%v), want 2", n, err)
	}
}
