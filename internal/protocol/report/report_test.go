package report_test

// The report's writes run against a real kube-apiserver and etcd (hack/control-plane.sh,
// KUBEBUILDER_ASSETS): server-side apply's field ownership is the API server's.

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
	"github.com/pgpilot/pgpilot/internal/tools/devenv"
)

var k8s client.Client

func TestMain(m *testing.M) {
	root, err := devenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env, err := devenv.StartControlPlane(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane (KUBEBUILDER_ASSETS, hack/control-plane.sh):", err)
		os.Exit(1)
	}
	code := run(m, env)
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M, env *envtest.Environment) int {
	var err error
	if k8s, err = client.New(env.Config, client.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// cluster is a PostgresCluster named name; the report only needs its name, namespace
// and UID.
func cluster(name string) *dbv1.PostgresCluster {
	return &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
}

func read(t *testing.T, c *dbv1.PostgresCluster) report.Report {
	t.Helper()
	r, err := report.Read(context.Background(), k8s, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func write(t *testing.T, c *dbv1.PostgresCluster, key report.Key, v any) {
	t.Helper()
	if err := report.Write(context.Background(), k8s, c, key, v); err != nil {
		t.Fatal(err)
	}
}

func TestAReportNotWrittenIsEmpty(t *testing.T) {
	if diff := cmp.Diff(report.Report{}, read(t, cluster("none"))); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// Every kind of report is written, read back as written, and the ConfigMap carries the
// cluster's label and its owner reference (so it goes with the cluster).
func TestEveryReportReadsBackAsWritten(t *testing.T) {
	c := cluster("every")
	since := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	want := report.Report{
		FailoverBlocked: "no standby has the final position",
		LastFailover:    &dbv1.FailoverRecord{From: "every-0", To: "every-1", Time: metav1.NewTime(since), Duration: "5s", Reason: "every-0 failed"},
		DataVersion:     "17",
		DataGuard:       &report.DataGuard{Refusals: map[string]string{"every-2": "its data is another database's"}, SetAside: map[string][]string{"every-1": {"/data/aside-1"}}},
		Streaming:       report.Streaming{"every-2": {Upstream: "every-1", State: "connecting", Since: since, Reason: "no route to host"}},
		Archiving:       &report.Archiving{OK: false, Message: "archive_command failed"},
		PendingRestart:  &report.PendingRestart{Pending: true, Message: "shared_buffers waits", Instances: map[string][]string{"every-0": {"shared_buffers: 128MB → 256MB"}}},
		Upgrade:         &report.Upgrade{From: "15", To: "17", Reason: dbv1.ReasonUpgrading, Message: "pg_upgrade --copy", Since: since, WritesStoppedMillis: 4200},
		Health:          report.Health{report.HealthConnections: {Message: "95 of 97 taken", Since: since}},
		AgentErrors:     report.AgentErrors{"every-1": {Message: `postgres exited while starting: FATAL:  invalid value for parameter "work_mem": "lots"`, Since: since}},
		BackupVerification: &dbv1.BackupVerification{Job: "every-verify-29", Backup: "nightly-1", Result: dbv1.VerificationFailed,
			StartedAt: &metav1.Time{Time: since}, FinishedAt: &metav1.Time{Time: since.Add(time.Minute)}, Message: "backup nightly-1 in s3://b/every is corrupt"},
		Replica: &dbv1.ReplicaStatus{Source: "src-rw.prod.svc", DesignatedPrimary: "every-0", Streaming: true, LagSeconds: 2},
	}
	write(t, c, report.KeyFailoverBlocked, want.FailoverBlocked)
	write(t, c, report.KeyLastFailover, want.LastFailover)
	write(t, c, report.KeyDataVersion, want.DataVersion)
	write(t, c, report.KeyDataGuard, want.DataGuard)
	write(t, c, report.KeyStreaming, want.Streaming)
	write(t, c, report.KeyArchiving, want.Archiving)
	write(t, c, report.KeyPendingRestart, want.PendingRestart)
	write(t, c, report.KeyUpgrade, want.Upgrade)
	write(t, c, report.KeyAgentErrors, want.AgentErrors)
	write(t, c, report.KeyHealth, want.Health)
	write(t, c, report.KeyBackupVerification, want.BackupVerification)
	write(t, c, report.KeyReplica, want.Replica)
	if diff := cmp.Diff(want, read(t, c)); diff != "" {
		t.Errorf("the report (-want +got):\n%s", diff)
	}

	var cm corev1.ConfigMap
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "every-report"}, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Labels[dbv1.LabelCluster] != "every" {
		t.Errorf("labels %v, want %s=every", cm.Labels, dbv1.LabelCluster)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != c.UID || cm.OwnerReferences[0].Kind != "PostgresCluster" {
		t.Errorf("owner references %+v, want the cluster", cm.OwnerReferences)
	}
	if len(cm.Data) != len(report.Keys) {
		t.Errorf("%d keys %v, want %d", len(cm.Data), cm.Data, len(report.Keys))
	}
}

// Each writer owns its key only: a write, a replacement or a removal of one key leaves
// every other as it was, without reading first.
func TestWritersOwnTheirKeyOnly(t *testing.T) {
	c := cluster("owners")
	write(t, c, report.KeyFailoverBlocked, "db-2 is behind")
	write(t, c, report.KeyArchiving, &report.Archiving{OK: true, Message: "Last archived 000000010000000000000003"})
	write(t, c, report.KeyDataVersion, "15")

	write(t, c, report.KeyFailoverBlocked, "no standby answers")
	write(t, c, report.KeyArchiving, nil)
	got := read(t, c)
	want := report.Report{FailoverBlocked: "no standby answers", DataVersion: "15"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after replacing one key and removing another (-want +got):\n%s", diff)
	}

	for _, empty := range []any{"", (*report.DataGuard)(nil), &report.DataGuard{}, report.Streaming{}, (*dbv1.FailoverRecord)(nil)} {
		write(t, c, report.KeyFailoverBlocked, empty)
		if got := read(t, c); got.FailoverBlocked != "" || got.DataVersion != "15" {
			t.Errorf("after writing %#v: %+v, want no block and the data version kept", empty, got)
		}
	}
}

// A key a person edited by hand is taken back by its writer's next write, and an edit
// that cannot be read is read as nothing recorded.
func TestAnEditedReport(t *testing.T) {
	c := cluster("edited")
	write(t, c, report.KeyDataVersion, "16")
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: "default", Name: "edited-report"}
	if err := k8s.Get(context.Background(), key, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data[string(report.KeyDataVersion)] = "99"
	cm.Data[string(report.KeyDataGuard)] = "{"
	cm.Data[string(report.KeyStreaming)] = "[]"
	if err := k8s.Update(context.Background(), &cm); err != nil {
		t.Fatal(err)
	}
	got := read(t, c)
	if got.DataVersion != "99" || got.DataGuard != nil || got.Streaming != nil {
		t.Errorf("after the edit: %+v, want version 99 and no data guard or streaming", got)
	}
	write(t, c, report.KeyDataVersion, "16")
	if got := read(t, c); got.DataVersion != "16" {
		t.Errorf("data version %q after the writer's next write, want 16", got.DataVersion)
	}
}
