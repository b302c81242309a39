package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestParseReplication(t *testing.T) {
	for _, tc := range []struct {
		name     string
		out      string
		timeline int64
		standbys map[string]Replication
		wantErr  bool
	}{
		{name: "none", out: "timeline|3\n", timeline: 3, standbys: map[string]Replication{}},
		{
			name: "two standbys, one listed twice", timeline: 2,
			out: "timeline|2\nreplica|db-1|streaming|sync|0|0.001\nreplica|db-2|catchup|async|1048576|2.5\nreplica|db-2|streaming|async|10|0\n",
			standbys: map[string]Replication{
				"db-1": {State: "streaming", SyncState: "sync", ReplayLagSeconds: 0.001},
				"db-2": {State: "catchup", SyncState: "async", LagBytes: 1048576, ReplayLagSeconds: 2.5},
			},
		},
		{name: "garbage", out: "psql: error\n", wantErr: true},
		{name: "bad number", out: "replica|db-1|streaming|sync|x|0\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, standbys, err := parseReplication(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if tl != tc.timeline {
				t.Errorf("timeline %d, want %d", tl, tc.timeline)
			}
			if diff := cmp.Diff(tc.standbys, standbys); diff != "" {
				t.Errorf("standbys (-want +got):\n%s", diff)
			}
		})
	}
}

func observed() Observed {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	c := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"}}
	c.Spec.Replicas, c.Spec.Version = 3, "15"
	c.Status = dbv1.PostgresClusterStatus{Phase: dbv1.PhaseDegraded, CurrentPrimary: "db-1", ReadyInstances: 2,
		LastFailover: &dbv1.FailoverRecord{From: "db-0", To: "db-1", Time: metav1.NewTime(now.Add(-time.Hour)), Duration: "3.2s", Reason: "db-0 was not ready"},
		Conditions: []dbv1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "InstancesNotReady", Message: "2 of 3 instances are ready"},
			{Type: "Deployed", Status: metav1.ConditionTrue, Reason: "InstallSuccessful", Message: "PostgreSQL cluster db.\n\nRead-write: db-rw"}},
		Instances: []dbv1.InstanceStatus{{Name: "db-2", Message: "keeps exiting: its postgres container last exited with code 137 (OOMKilled)"}}}
	pod := func(name, role string, ready bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{dbv1.LabelRole: role}}, Spec: corev1.PodSpec{NodeName: "n1"}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "postgres", RestartCount: 2}}
		return p
	}
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }
	return Observed{
		Cluster: c,
		Pods:    []corev1.Pod{pod("db-10", "replica", true), pod("db-2", "replica", false), pod("db-1", "primary", true), pod("db-0", "replica", true)},
		Backups: []dbv1.PostgresBackup{
			{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Status: dbv1.PostgresBackupStatus{Phase: dbv1.BackupCompleted, StartedAt: at(-50 * time.Hour), StoppedAt: at(-49 * time.Hour), SizeBytes: 1}},
			{ObjectMeta: metav1.ObjectMeta{Name: "new"}, Status: dbv1.PostgresBackupStatus{Phase: dbv1.BackupCompleted, StartedAt: at(-2*time.Hour - time.Minute), StoppedAt: at(-2 * time.Hour), SizeBytes: 12 << 20}},
			{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Status: dbv1.PostgresBackupStatus{Phase: dbv1.BackupFailed}},
		},
		Replication: "timeline|4\nreplica|db-0|streaming|async|4096|0.25\nreplica|db-10|streaming|async|0|0\n",
	}
}

func TestStatus(t *testing.T) {
	st := Summarize(observed())
	var names []string
	for _, in := range st.Instances {
		names = append(names, in.Name)
	}
	if diff := cmp.Diff([]string{"db-0", "db-1", "db-2", "db-10"}, names); diff != "" {
		t.Errorf("instances by ordinal (-want +got):\n%s", diff)
	}
	if st.Timeline != 4 || st.LastBackup == nil || st.LastBackup.Name != "new" || st.LastBackup.Duration != time.Minute {
		t.Errorf("timeline %d, last backup %+v", st.Timeline, st.LastBackup)
	}
	var out bytes.Buffer
	if err := printStatus(&out, st, time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "Read-write") {
		t.Errorf("a condition's message printed beyond its first line:\n%s", out.String())
	}
	for _, want := range []string{
		"Deployed   True    InstallSuccessful  PostgreSQL cluster db.",
		"Cluster db in ns: Degraded, PostgreSQL 15, 2 of 3 instances ready",
		"Primary:       db-1 (timeline 4)",
		"Last failover: db-0 → db-1, 1h0m0s ago, took 3.2s: db-0 was not ready",
		"Last backup:   new, 2h0m0s ago, 12 MiB in 1m0s (backups: 2 completed, 1 failed, 0 running)",
		"db-0      replica  true   2         n1    streaming (async)  4.0 KiB  0.250s",
		"db-1      primary  true   2         n1    -                  -        -",
		"db-2      replica  false  2         n1    not streaming      -        -",
		"Ready      False   InstancesNotReady  2 of 3 instances are ready",
		"db-2 keeps exiting: its postgres container last exited with code 137 (OOMKilled)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}

	// The primary could not be asked: said once, and no standby is called not streaming.
	o := observed()
	o.ReplicationErr = errors.New("pods/exec is forbidden")
	out.Reset()
	if err := printStatus(&out, Summarize(o), time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Replication:   unknown (pods/exec is forbidden)") || strings.Contains(out.String(), "not streaming") {
		t.Errorf("status without replication:\n%s", out.String())
	}
}

func TestKubectlArguments(t *testing.T) {
	c := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: "db"}}
	c.Spec.Replicas = 7
	c.Spec.Bootstrap.Database = "shop"
	if diff := cmp.Diff([]string{"logs", "--container=postgres", "--tail=-1", "--selector=db.example.com/cluster=db", "--prefix", "--max-log-requests=7", "--follow"},
		logsArgs(c, nil, true, 0, -1)); diff != "" {
		t.Errorf("logs of every instance (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"logs", "--container=postgres", "--tail=10", "db-2", "--since=5m0s"}, logsArgs(c, []string{"db-2"}, false, 5*time.Minute, 10)); diff != "" {
		t.Errorf("logs of one (-want +got):\n%s", diff)
	}
	got := psqlArgs(c, "db-0", []string{"-c", "SELECT 1"})
	want := []string{"exec", "-it", "db-0", "--container=postgres", "--", "sh", "-c",
		`PGUSER="$(cat /etc/pgpilot/secrets/app/username)" PGPASSWORD="$(cat /etc/pgpilot/secrets/app/password)" exec psql "$0" "$@"`,
		"host=db-rw port=5432 dbname=shop sslmode=verify-full sslrootcert=/etc/pgpilot/tls/server/ca.crt", "-c", "SELECT 1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("psql (-want +got):\n%s", diff)
	}

	flags := genericclioptions.NewConfigFlags(false)
	kc, ctx := "/k/config", "prod"
	flags.KubeConfig, flags.Context = &kc, &ctx
	o := &Options{Flags: flags, Namespace: "ns"}
	if diff := cmp.Diff([]string{"--kubeconfig=/k/config", "--context=prod", "--namespace=ns"}, o.kubectlFlags()); diff != "" {
		t.Errorf("kubectl flags (-want +got):\n%s", diff)
	}
}

// A cluster with a pooler says where clients connect and how many pooler pods serve.
func TestStatusShowsThePooler(t *testing.T) {
	o := observed()
	var out bytes.Buffer
	if err := printStatus(&out, Summarize(o), time.Now()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "Pooler:") {
		t.Errorf("a pooler shown without spec.pooler:\n%s", out.String())
	}
	o.Cluster.Spec.Pooler = &dbv1.PoolerSpec{Instances: 2}
	o.Cluster.Status.Pooler = &dbv1.PoolerStatus{Instances: 2, ReadyInstances: 1, Message: "1 of 2 pooler pods are ready"}
	out.Reset()
	if err := printStatus(&out, Summarize(o), time.Now()); err != nil {
		t.Fatal(err)
	}
	if want := "Pooler:        db-pooler-rw, 1 of 2 pods ready (1 of 2 pooler pods are ready)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
}

// The last restore verification is shown with its result, age, backup and message.
func TestStatusShowsTheLastVerification(t *testing.T) {
	o := observed()
	now := time.Now()
	finished := metav1.NewTime(now.Add(-3 * time.Hour))
	o.Cluster.Status.LastBackupVerification = &dbv1.BackupVerification{Job: "db-verify-1", Backup: "new",
		Result: dbv1.VerificationFailed, FinishedAt: &finished, Message: "backup new in s3://b/db is corrupt"}
	var out bytes.Buffer
	if err := printStatus(&out, Summarize(o), now); err != nil {
		t.Fatal(err)
	}
	if want := "Verified:      Failed, 3h0m0s ago, backup new: backup new in s3://b/db is corrupt\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
}

// A replica cluster's line says what it follows and how far behind, or its promotion.
func TestStatusShowsTheReplicaCluster(t *testing.T) {
	o := observed()
	now := time.Now()
	o.Cluster.Status.Replica = &dbv1.ReplicaStatus{Source: "src-rw.prod.svc", DesignatedPrimary: "db-0", Streaming: true, LagSeconds: 2}
	var out bytes.Buffer
	if err := printStatus(&out, Summarize(o), now); err != nil {
		t.Fatal(err)
	}
	if want := "Replica of:    src-rw.prod.svc, db-0 streams from it, 2 s behind\n"; !strings.Contains(out.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, out.String())
	}
}
