package plan_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/plan"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

var cluster = plan.Cluster{Name: "my-db", Namespace: "db"}

// valuesOption changes the values of one plan.
type valuesOption func(*plan.Values)

// readme are the values of the README example as the Helm reconciler passes them: the
// spec with values.yaml's defaults and the operator's block.
func readme(opts ...valuesOption) plan.Values {
	v := plan.Values{
		PostgresClusterSpec: dbv1.PostgresClusterSpec{
			Replicas:  3,
			Version:   "16",
			Storage:   dbv1.StorageSpec{Size: ptr.To(resource.MustParse("1Gi"))},
			Bootstrap: dbv1.BootstrapSpec{Database: "app", Owner: "app"},
		},
		Operator: plan.Operator{
			AgentImage:            "registry.example.com/pgpilot:1",
			DefaultPostgresImages: map[string]string{"16": "postgres:16.11", "17": "postgres:17.7"},
		},
	}
	for _, opt := range opts {
		opt(&v)
	}
	return v
}

func fromBackup(from dbv1.FromBackup) valuesOption {
	return func(v *plan.Values) { v.Bootstrap.FromBackup = &from }
}

// decide is the plan of values and observed; nil when it fails with an error containing
// wantErr, as it must when wantErr is set.
func decide(t *testing.T, values plan.Values, observed plan.Observed, wantErr string) *plan.Plan {
	t.Helper()
	p, err := plan.Decide(cluster, values, observed)
	switch {
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("Decide error = %v, want one containing %q", err, wantErr)
	case wantErr != "":
		return nil
	case err != nil:
		t.Fatal(err)
	}
	return p
}

func TestImages(t *testing.T) {
	tests := []struct {
		name      string
		values    plan.Values
		wantImage string
		wantErr   string
	}{
		{name: "the chart's default for the version", values: readme(), wantImage: "postgres:16.11"},
		{
			name: "the operator's image over the chart's",
			values: readme(func(v *plan.Values) {
				v.Operator.PostgresImages = map[string]string{"16": "mirror.example.com/postgres:16.11", "17": ""}
			}),
			wantImage: "mirror.example.com/postgres:16.11",
		},
		{
			name: "spec.image over both",
			values: readme(func(v *plan.Values) {
				v.Image = "postgres:16.11-custom"
				v.Operator.PostgresImages = map[string]string{"16": "mirror.example.com/postgres:16.11"}
			}),
			wantImage: "postgres:16.11-custom",
		},
		{
			name:    "no image for the version",
			values:  readme(func(v *plan.Values) { v.Version = "18" }),
			wantErr: `no PostgreSQL image for version "18": set spec.image, or give the operator RELATED_IMAGE_POSTGRES_18`,
		},
		{
			name:    "no agent image",
			values:  readme(func(v *plan.Values) { v.Operator.AgentImage = "" }),
			wantErr: "operator.agentImage is required",
		},
		{
			name:    "parameters the CRD does not check",
			values:  readme(func(v *plan.Values) { v.PostgreSQL.Parameters = map[string]string{"ARCHIVE_COMMAND": "touch /tmp/x"} }),
			wantErr: "spec.postgresql.parameters: ARCHIVE_COMMAND is managed by pgpilot or runs a shell command",
		},
		{
			name:    "no version",
			values:  readme(func(v *plan.Values) { v.Version = "" }),
			wantErr: "version is required",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decide(t, tt.values, plan.Observed{}, tt.wantErr)
			if p == nil {
				return
			}
			if p.Image != tt.wantImage {
				t.Errorf("image = %q, want %q", p.Image, tt.wantImage)
			}
			if p.AgentImage != tt.values.Operator.AgentImage {
				t.Errorf("agent image = %q, want %q", p.AgentImage, tt.values.Operator.AgentImage)
			}
		})
	}
}

// Every name comes from dbv1.Names, and every instance the spec asks for is named.
func TestNames(t *testing.T) {
	p, err := plan.Decide(cluster, readme(func(v *plan.Values) { v.Replicas = 2 }), plan.Observed{})
	if err != nil {
		t.Fatal(err)
	}
	n := dbv1.NamesOf("my-db")
	want := plan.Names{
		Cluster: "my-db", StatefulSet: n.StatefulSet(), ConfigMap: n.ConfigMap(), PrimaryLease: n.PrimaryLease(),
		ReadWriteService: n.ReadWriteService(), ReadOnlyService: n.ReadOnlyService(), ReadService: n.ReadService(),
		HeadlessService: n.HeadlessService(), SuperuserSecret: n.SuperuserSecret(),
		ReplicationSecret: n.ReplicationSecret(), AppSecret: n.AppSecret(), AgentTokenSecret: n.AgentTokenSecret(),
		ServiceAccount: n.InstanceServiceAccount(), NetworkPolicy: n.NetworkPolicy(), DisruptionBudget: n.DisruptionBudget(),
		Instances:       []string{"my-db-0", "my-db-1"},
		ServerTLSSecret: n.ServerTLSSecret(), ReplicationTLSSecret: n.ReplicationTLSSecret(), SourceTLSSecret: n.SourceTLSSecret(),
		InstanceTLSSecret: n.ServerTLSSecret(), AgentAuthSecret: n.AgentAuthSecret(),
		MetricsTokenSecret: n.MetricsTokenSecret(), CASecret: n.CASecret(),
	}
	if diff := cmp.Diff(want, p.Names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	// spec.tls.serverSecretName replaces the operator's certificate, for PostgreSQL only.
	own, err := plan.Decide(cluster, readme(func(v *plan.Values) { v.TLS.ServerSecretName = "my-cert" }), plan.Observed{})
	if err != nil {
		t.Fatal(err)
	}
	if own.Names.ServerTLSSecret != "my-cert" || own.Names.ReplicationTLSSecret != n.ReplicationTLSSecret() ||
		own.Names.InstanceTLSSecret != n.ServerTLSSecret() {
		t.Errorf("with serverSecretName my-cert: server %q, replication %q", own.Names.ServerTLSSecret, own.Names.ReplicationTLSSecret)
	}
	if p.Config.PrimaryLease != n.PrimaryLease() || p.Config.Services.ReadWrite != n.ReadWriteService() ||
		p.Config.Services.Headless != n.HeadlessService() {
		t.Errorf("config.json names %q, %+v; want the plan's", p.Config.PrimaryLease, p.Config.Services)
	}
}

// A scale-down never removes the primary's pod: it waits, at the instances that run,
// until the primary is one that stays; and it waits while the primary is unknown.
func TestReplicas(t *testing.T) {
	running := func(n int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(n)}}
	}
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
	}
	tests := []struct {
		name     string
		want     int32
		observed plan.Observed
		replicas int
	}{
		{name: "a new cluster", want: 3, observed: plan.Observed{}, replicas: 3},
		{name: "a scale-up", want: 5, observed: plan.Observed{StatefulSet: running(3), PrimaryLease: lease("my-db-2")}, replicas: 5},
		{name: "a scale-down keeping the primary", want: 2, observed: plan.Observed{StatefulSet: running(3), PrimaryLease: lease("my-db-1")}, replicas: 2},
		{name: "a scale-down that would remove the primary", want: 3, observed: plan.Observed{StatefulSet: running(3), PrimaryLease: lease("my-db-2")}, replicas: 1},
		{name: "part of a scale-down that would remove the primary", want: 4, observed: plan.Observed{StatefulSet: running(5), PrimaryLease: lease("my-db-3")}, replicas: 2},
		{name: "a scale-down during a failover", want: 3, observed: plan.Observed{StatefulSet: running(3), PrimaryLease: lease("")}, replicas: 1},
		{name: "a scale-down with no Lease", want: 3, observed: plan.Observed{StatefulSet: running(3)}, replicas: 2},
		{name: "a scale-down with a foreign holder", want: 3, observed: plan.Observed{StatefulSet: running(3), PrimaryLease: lease("other-0")}, replicas: 2},
		{name: "resuming a stopped cluster", want: 3, observed: plan.Observed{StatefulSet: running(0), PrimaryLease: lease("my-db-1")}, replicas: 3},
		{name: "resuming with fewer instances than the primary's ordinal", want: 3, observed: plan.Observed{StatefulSet: running(0), PrimaryLease: lease("my-db-2")}, replicas: 1},
		{name: "resuming with more instances", want: 5, observed: plan.Observed{StatefulSet: running(0), PrimaryLease: lease("my-db-2")}, replicas: 5},
		{name: "resuming with no Lease", want: 2, observed: plan.Observed{StatefulSet: running(0)}, replicas: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := plan.Decide(cluster, readme(func(v *plan.Values) { v.Replicas = int32(tt.replicas) }), tt.observed)
			if err != nil {
				t.Fatal(err)
			}
			if p.Replicas != int(tt.want) || len(p.Names.Instances) != int(tt.want) || p.Config.Replicas != int(tt.want) {
				t.Errorf("replicas %d, instances %v, config.json replicas %d; want %d", p.Replicas, p.Names.Instances, p.Config.Replicas, tt.want)
			}
		})
	}
}

// A stopped cluster's pods go only once its primary stopped and the failover controller
// recorded it; the instances (names, config.json) stay.
func TestStopped(t *testing.T) {
	hibernation := func(phase, holder string, term int32) *coordinationv1.Lease {
		h, _ := json.Marshal(primarylease.Hibernation{Phase: phase, Holder: holder, Term: term})
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{dbv1.AnnotationHibernation: string(h)}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("my-db-1"), LeaseTransitions: ptr.To[int32](4)},
		}
	}
	sts := &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3)}}
	tests := []struct {
		name     string
		stopped  bool
		lease    *coordinationv1.Lease
		replicas int
	}{
		{"running", false, hibernation("", "", 0), 3},
		{"asked to stop, the primary not stopped yet", true, hibernation(primarylease.Stopping, "my-db-1", 4), 3},
		{"the primary stopped", true, hibernation(primarylease.Stopped, "my-db-1", 4), 0},
		{"stopped in another term (the record is stale)", true, hibernation(primarylease.Stopped, "my-db-1", 3), 3},
		{"resumed before the pods went", false, hibernation(primarylease.Stopped, "my-db-1", 4), 3},
		{"resuming", false, hibernation(primarylease.Resuming, "my-db-1", 4), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decide(t, readme(func(v *plan.Values) { v.Stopped = tt.stopped }), plan.Observed{StatefulSet: sts, PrimaryLease: tt.lease}, "")
			if p.Replicas != tt.replicas || len(p.Names.Instances) != 3 || p.Config.Replicas != 3 {
				t.Errorf("replicas %d (want %d), instances %v, config.json replicas %d (want 3 of each)", p.Replicas, tt.replicas, p.Names.Instances, p.Config.Replicas)
			}
		})
	}
}

// A version other than the data's is never deployed; the data's is.
func TestDataVersion(t *testing.T) {
	observed := plan.Observed{
		StatefulSet:  &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3)}},
		PrimaryLease: &coordinationv1.Lease{},
		Report:       &corev1.ConfigMap{Data: map[string]string{string(report.KeyDataVersion): "16"}},
	}
	decide(t, readme(func(v *plan.Values) { v.Version = "15" }), observed,
		`spec.version 15 cannot be applied: the cluster's data is PostgreSQL 16, and PostgreSQL cannot move data to an older major; set spec.version back to "16"`)
	p := decide(t, readme(func(v *plan.Values) { v.Version = "16" }), observed, "")
	if p.Image != "postgres:16.11" || p.Upgrade != nil {
		t.Errorf("image %q, upgrade %+v for the data's version", p.Image, p.Upgrade)
	}
}

// A newer spec.version upgrades: the pods run its image, and carry the data's
// programs from the image they ran it with (or the operator's for its major).
func TestUpgradeCarriesTheDataMajor(t *testing.T) {
	running := func(containers, inits []corev1.Container) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: containers, InitContainers: inits}}}}
	}
	rep := &corev1.ConfigMap{Data: map[string]string{string(report.KeyDataVersion): "15"}}
	tests := []struct {
		name string
		sts  *appsv1.StatefulSet
		want string
	}{
		{"the image the pods ran the data with", running([]corev1.Container{{Name: "postgres", Image: "registry.local/pg:15-custom"}}, nil), "registry.local/pg:15-custom"},
		{"the image already carried", running([]corev1.Container{{Name: "postgres", Image: "postgres:17.7"}},
			[]corev1.Container{{Name: plan.CarryContainer, Image: "registry.local/pg:15-custom"}}), "registry.local/pg:15-custom"},
		{"rolled already, nothing carried: the operator's", running([]corev1.Container{{Name: "postgres", Image: "postgres:17.7"}}, nil), "postgres:15.15"},
		{"no StatefulSet: the operator's", nil, "postgres:15.15"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(t, readme(func(v *plan.Values) {
				v.Version = "17"
				v.Operator.DefaultPostgresImages["15"] = "postgres:15.15"
			}), plan.Observed{StatefulSet: tc.sts, PrimaryLease: &coordinationv1.Lease{}, Report: rep}, "")
			if p.Image != "postgres:17.7" {
				t.Errorf("image %q, want the new major's", p.Image)
			}
			if p.Upgrade == nil || p.Upgrade.From != "15" || p.Upgrade.To != "17" || p.Upgrade.CarryImage != tc.want {
				t.Errorf("upgrade %+v, want 15 → 17 carrying %s", p.Upgrade, tc.want)
			}
		})
	}
	decide(t, readme(func(v *plan.Values) { v.Version = "17" }), plan.Observed{PrimaryLease: &coordinationv1.Lease{}, Report: rep},
		"spec.version 17 needs the PostgreSQL 15 programs to upgrade the data: the operator has no image for 15")

	// Upgraded: the carrying stays while the pods run the same image, so that the end
	// of the upgrade restarts no pod; a new image drops it.
	done := &corev1.ConfigMap{Data: map[string]string{string(report.KeyDataVersion): "17"}}
	upgraded := running([]corev1.Container{{Name: "postgres", Image: "postgres:17.7"}}, []corev1.Container{{Name: plan.CarryContainer, Image: "pg:15"}})
	p := decide(t, readme(func(v *plan.Values) { v.Version = "17" }), plan.Observed{StatefulSet: upgraded, PrimaryLease: &coordinationv1.Lease{}, Report: done}, "")
	if p.Upgrade == nil || p.Upgrade.CarryImage != "pg:15" || p.Upgrade.From != "" {
		t.Errorf("after the upgrade: %+v, want the carrying kept", p.Upgrade)
	}
	p = decide(t, readme(func(v *plan.Values) {
		v.Version = "17"
		v.Image = "postgres:17.8"
	}), plan.Observed{StatefulSet: upgraded, PrimaryLease: &coordinationv1.Lease{}, Report: done}, "")
	if p.Upgrade != nil {
		t.Errorf("a new image kept the carrying: %+v", p.Upgrade)
	}
}

// statefulSet is the StatefulSet as deployed with a data claim template of size and
// class (nil for the default class).
func statefulSet(size string, class *string) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(size),
			}},
		},
	}}}}
}

// A StatefulSet's claim template is immutable: a new StatefulSet takes the spec's size
// and class, an existing one keeps its own whatever the spec says now.
func TestStorage(t *testing.T) {
	withStorage := func(size string, class *string) valuesOption {
		return func(v *plan.Values) {
			v.Storage = dbv1.StorageSpec{Size: ptr.To(resource.MustParse(size)), StorageClassName: class}
		}
	}
	tests := []struct {
		name     string
		values   plan.Values
		existing *appsv1.StatefulSet
		want     plan.Storage
	}{
		{name: "new, default class", values: readme(), want: plan.Storage{Size: "1Gi"}},
		{name: "new, a class", values: readme(withStorage("20Gi", ptr.To("fast"))), want: plan.Storage{Size: "20Gi", StorageClassName: "fast"}},
		{
			name: "existing, the spec grew", values: readme(withStorage("5Gi", nil)),
			existing: statefulSet("1Gi", nil), want: plan.Storage{Size: "1Gi"},
		},
		{
			name: "existing with a class, the spec names another", values: readme(withStorage("1Gi", ptr.To("slow"))),
			existing: statefulSet("1Gi", ptr.To("fast")), want: plan.Storage{Size: "1Gi", StorageClassName: "fast"},
		},
		{
			name: "existing on the default class, the spec names one", values: readme(withStorage("1Gi", ptr.To("fast"))),
			existing: statefulSet("1Gi", nil), want: plan.Storage{Size: "1Gi"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := plan.Decide(cluster, tt.values, plan.Observed{StatefulSet: tt.existing})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, p.Storage); diff != "" {
				t.Errorf("storage (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	v := readme(func(v *plan.Values) {
		v.PostgreSQL = dbv1.PostgreSQLSpec{
			Parameters:          map[string]string{"work_mem": "8MB"},
			SynchronousReplicas: 1,
			IdleSlotTimeout:     &metav1.Duration{Duration: 0},
			MaxReadLag:          &metav1.Duration{Duration: 10e9}, // 10s
		}
	})
	p, err := plan.Decide(cluster, v, plan.Observed{})
	if err != nil {
		t.Fatal(err)
	}
	want := clusterconfig.Config{
		ClusterName: "my-db", Version: "16", Replicas: 3,
		Parameters: map[string]string{"work_mem": "8MB"}, SynchronousReplicas: 1,
		IdleSlotTimeout: "0s", Bootstrap: clusterconfig.Bootstrap{Database: "app", Owner: "app"},
		PrimaryLease: "my-db-primary", MaxReadLag: "10s",
		Upgrade: clusterconfig.Upgrade{BackupMaxAge: "24h0m0s"},
	}
	want.Services.ReadWrite, want.Services.Headless = "my-db-rw", "my-db-headless"
	if diff := cmp.Diff(want, p.Config); diff != "" {
		t.Errorf("config.json (-want +got):\n%s", diff)
	}
	if got := p.Config.SlotTimeout(); got != 0 {
		t.Errorf("the agent reads idleSlotTimeout 0s as %v, want 0 (no timeout)", got)
	}

	// Unset, the agent's default; no parameters, an empty object rather than null.
	p, err = plan.Decide(cluster, readme(), plan.Observed{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Config.SlotTimeout() != clusterconfig.DefaultIdleSlotTimeout || p.Config.Parameters == nil {
		t.Errorf("defaults: idleSlotTimeout %q, parameters %v", p.Config.IdleSlotTimeout, p.Config.Parameters)
	}
	if p.Config.ReadLagBound() != clusterconfig.DefaultMaxReadLag || p.Config.MaxReadLag != "30s" {
		t.Errorf("defaults: maxReadLag %q", p.Config.MaxReadLag)
	}
}

// backup is PostgresBackup nightly of cluster old-db, in phase, on a volume store.
func backup(phase dbv1.BackupPhase) *dbv1.PostgresBackup {
	return &dbv1.PostgresBackup{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "db"},
		Spec:       dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: "old-db"}},
		Status: dbv1.PostgresBackupStatus{
			Phase: phase, BackupID: "20250601T000000Z",
			Store: &dbv1.BackupStore{Path: "pg", Volume: &dbv1.VolumeStore{ClaimName: "old-backups"}},
		},
	}
}

// deployedConfig is a ConfigMap whose config.json restores from restore.
func deployedConfig(t *testing.T, restore *clusterconfig.Restore) *corev1.ConfigMap {
	t.Helper()
	data, err := json.Marshal(clusterconfig.Config{ClusterName: "my-db", Restore: restore})
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{Data: map[string]string{"config.json": string(data)}}
}

// deployedStatefulSet is a StatefulSet whose postgres container mounts the given
// restore volume at /var/lib/pgpilot/restore, besides one that is not a restore's.
func deployedStatefulSet(restore corev1.Volume) *appsv1.StatefulSet {
	sts := statefulSet("1Gi", nil)
	sts.Spec.Template.Spec = corev1.PodSpec{
		Containers: []corev1.Container{{Name: "postgres", VolumeMounts: []corev1.VolumeMount{
			{Name: "data", MountPath: "/var/lib/postgresql/data"},
			{Name: restore.Name, MountPath: "/var/lib/pgpilot/restore", ReadOnly: true},
		}}},
		Volumes: []corev1.Volume{
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			restore,
		},
	}
	return sts
}

// A restore from a PostgresBackup is resolved at the first plan; once deployed, the
// ConfigMap's restore and the StatefulSet's restore volumes are kept whatever became of
// the PostgresBackup. A restore from a store is planned from the spec every time.
func TestRestore(t *testing.T) {
	fromName := fromBackup(dbv1.FromBackup{BackupName: "nightly", TargetLSN: "0/3000060"})
	restoreClaim := corev1.Volume{Name: "restore-store", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "old-backups"}}}
	handmade := &clusterconfig.Restore{Store: clusterconfig.Store{Directory: "/var/lib/pgpilot/restore", Prefix: "archive/older-db"}, BackupID: "20240101T000000Z"}
	resolved := &clusterconfig.Restore{
		Store:    clusterconfig.Store{Directory: "/var/lib/pgpilot/restore", Prefix: "pg/old-db"},
		BackupID: "20250601T000000Z", TargetLSN: "0/3000060",
	}
	missing := `bootstrap.fromBackup.backupName: PostgresBackup "nightly" does not exist in namespace "db": name a Completed PostgresBackup of this namespace, or restore with bootstrap.fromBackup.store and clusterName`
	tests := []struct {
		name        string
		values      plan.Values
		observed    plan.Observed
		wantRestore *clusterconfig.Restore
		wantVolumes []corev1.Volume
		wantErr     string
	}{
		{
			name: "first plan: the Completed PostgresBackup", values: readme(fromName),
			observed:    plan.Observed{Backup: backup(dbv1.BackupCompleted)},
			wantRestore: resolved, wantVolumes: []corev1.Volume{restoreClaim},
		},
		{
			name: "deployed: the ConfigMap's restore and the StatefulSet's volume, the PostgresBackup gone", values: readme(fromName),
			observed:    plan.Observed{ConfigMap: deployedConfig(t, handmade), StatefulSet: deployedStatefulSet(restoreClaim)},
			wantRestore: handmade, wantVolumes: []corev1.Volume{restoreClaim},
		},
		{
			name: "deployed: the PostgresBackup now Failed is not read", values: readme(fromName),
			observed:    plan.Observed{ConfigMap: deployedConfig(t, handmade), StatefulSet: deployedStatefulSet(restoreClaim), Backup: backup(dbv1.BackupFailed)},
			wantRestore: handmade, wantVolumes: []corev1.Volume{restoreClaim},
		},
		{
			name: "deployed ConfigMap, StatefulSet deleted: the restore without its volumes", values: readme(fromName),
			observed:    plan.Observed{ConfigMap: deployedConfig(t, handmade)},
			wantRestore: handmade, wantVolumes: []corev1.Volume{},
		},
		{
			name: "a ConfigMap without a restore resolves the PostgresBackup", values: readme(fromName),
			observed:    plan.Observed{ConfigMap: deployedConfig(t, nil), Backup: backup(dbv1.BackupCompleted)},
			wantRestore: resolved, wantVolumes: []corev1.Volume{restoreClaim},
		},
		{
			name: "from a store: the spec, whatever the ConfigMap says",
			values: readme(fromBackup(dbv1.FromBackup{
				Store:       &dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "old-backups"}},
				ClusterName: "old-db", TargetTime: &metav1.Time{Time: metav1.Now().Rfc3339Copy().Time},
			})),
			observed:    plan.Observed{ConfigMap: deployedConfig(t, handmade)},
			wantRestore: &clusterconfig.Restore{Store: clusterconfig.Store{Directory: "/var/lib/pgpilot/restore", Prefix: "old-db"}},
			wantVolumes: []corev1.Volume{restoreClaim},
		},
		{name: "no PostgresBackup", values: readme(fromName), wantErr: missing},
		{
			name: "a ConfigMap without a restore and no PostgresBackup", values: readme(fromName),
			observed: plan.Observed{ConfigMap: deployedConfig(t, nil)}, wantErr: missing,
		},
		{
			name: "a StatefulSet but no ConfigMap and no PostgresBackup", values: readme(fromName),
			observed: plan.Observed{StatefulSet: deployedStatefulSet(restoreClaim)}, wantErr: missing,
		},
		{
			name: "Running", values: readme(fromName), observed: plan.Observed{Backup: backup(dbv1.BackupRunning)},
			wantErr: `PostgresBackup "nightly" is Running, not Completed: wait for it to complete or name another backup`,
		},
		{
			name: "no phase yet", values: readme(fromName), observed: plan.Observed{Backup: backup("")},
			wantErr: `PostgresBackup "nightly" is Pending, not Completed`,
		},
		{
			name: "Completed without a store", values: readme(fromName),
			observed: plan.Observed{Backup: func() *dbv1.PostgresBackup { b := backup(dbv1.BackupCompleted); b.Status.Store = nil; return b }()},
			wantErr:  `PostgresBackup "nightly" is Completed but has no status.store`,
		},
		{
			name:     "another backupID",
			values:   readme(fromBackup(dbv1.FromBackup{BackupName: "nightly", BackupID: "20240101T000000Z"})),
			observed: plan.Observed{Backup: backup(dbv1.BackupCompleted)},
			wantErr:  `bootstrap.fromBackup.backupID "20240101T000000Z" is not the backupID "20250601T000000Z" of PostgresBackup "nightly"`,
		},
		{
			name:    "a store without the cluster name",
			values:  readme(fromBackup(dbv1.FromBackup{Store: &dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "b"}}})),
			wantErr: "bootstrap.fromBackup.store needs clusterName",
		},
		{
			name:    "a store with both volume and s3",
			values:  readme(fromBackup(dbv1.FromBackup{ClusterName: "old-db", Store: &dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "b"}, S3: &dbv1.S3Store{}}})),
			wantErr: "bootstrap.fromBackup.store needs exactly one of volume or s3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := decide(t, tt.values, tt.observed, tt.wantErr)
			if p == nil {
				return
			}
			want := tt.wantRestore
			if from := tt.values.Bootstrap.FromBackup; from.TargetTime != nil {
				want.TargetTime = from.TargetTime.UTC().Format("2006-01-02T15:04:05Z")
			}
			if diff := cmp.Diff(want, p.Config.Restore); diff != "" {
				t.Errorf("restore (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantVolumes, p.Volumes); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			if len(p.VolumeMounts) != len(p.Volumes) {
				t.Errorf("%d volumes, %d mounts: %+v", len(p.Volumes), len(p.VolumeMounts), p.VolumeMounts)
			}
		})
	}
}

// The agents tune from the postgres container's resources, each limit else its request;
// a parameter that cannot fit them is refused with the reason.
func TestResources(t *testing.T) {
	withResources := func(limits, requests corev1.ResourceList, params map[string]string) valuesOption {
		return func(v *plan.Values) {
			v.Resources = corev1.ResourceRequirements{Limits: limits, Requests: requests}
			v.PostgreSQL.Parameters = params
		}
	}
	list := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	p := decide(t, readme(withResources(list("memory", "2Gi"), list("memory", "1Gi", "cpu", "1500m"), nil)), plan.Observed{}, "")
	if got, want := p.Config.Resources, (tuning.Resources{MemoryBytes: 2 << 30, MemoryLimitBytes: 2 << 30, MilliCPU: 1500}); got != want {
		t.Errorf("resources %+v, want %+v", got, want)
	}
	p = decide(t, readme(withResources(nil, list("memory", "1Gi"), map[string]string{"shared_buffers": "200GB"})), plan.Observed{}, "")
	if got, want := p.Config.Resources, (tuning.Resources{MemoryBytes: 1 << 30}); got != want {
		t.Errorf("a request alone: resources %+v, want %+v", got, want)
	}
	decide(t, readme(withResources(list("memory", "2Gi"), nil, map[string]string{"shared_buffers": "200GB"})), plan.Observed{},
		"shared_buffers 200GB does not fit in the memory limit 2048MB")
	decide(t, readme(withResources(nil, nil, map[string]string{"max_connections": "3"})), plan.Observed{}, "set at least 12")
	decide(t, readme(withResources(list("cpu", "1", "memory", "1Gi"), list("cpu", "2", "memory", "1Gi"), nil)), plan.Observed{},
		"spec.resources: requests.cpu 2 is above limits.cpu 1: Kubernetes creates no pod")
	decide(t, readme(withResources(list("cpu", "2"), list("cpu", "2000m", "memory", "3Gi"), nil)), plan.Observed{}, "")
}
