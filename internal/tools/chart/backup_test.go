package chart_test

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// Names the backup tests use. The Secrets' contents are never known to a render: the
// chart only names them.
const (
	credentialsSecret = "s3-keys"
	caSecret          = "s3-ca"
	sourceCluster     = "old-db"
	backupName        = "nightly"
	backupID          = "20250601T000000Z"
	targetTime        = "2025-06-01T12:30:00Z"
)

// s3StoreValues is a backup store on S3 with every option set, as values; without a path
// when path is empty.
func s3StoreValues(path string) map[string]any {
	store := map[string]any{
		"s3": map[string]any{
			"endpoint": "https://s3.example.com",
			"bucket":   "pg-backups",
			"region":   "eu-west-1",
			"credentials": map[string]any{
				"secretName":         credentialsSecret,
				"accessKeyIDKey":     "id",
				"secretAccessKeyKey": "secret",
			},
			"tls": map[string]any{"caSecret": map[string]any{"name": caSecret, "key": "bundle.pem"}},
		},
	}
	if path != "" {
		store["path"] = path
	}
	return store
}

// s3StoreConfig is the agent's view of s3StoreValues mounted for role (backup or restore).
func s3StoreConfig(role, prefix string) clusterconfig.Store {
	return clusterconfig.Store{
		S3: &clusterconfig.S3Store{
			Endpoint:       "https://s3.example.com",
			Bucket:         "pg-backups",
			Region:         "eu-west-1",
			CredentialsDir: "/etc/pgpilot/" + role + "-credentials",
			CAFile:         "/etc/pgpilot/" + role + "-ca/ca.crt",
		},
		Prefix: prefix,
	}
}

// s3StoreMounts are the volumes and mounts of s3StoreValues mounted for role.
func s3StoreMounts(role string) ([]corev1.Volume, []corev1.VolumeMount) {
	return []corev1.Volume{
			keyVolume(role+"-credentials", credentialsSecret,
				corev1.KeyToPath{Key: "id", Path: "ACCESS_KEY_ID"},
				corev1.KeyToPath{Key: "secret", Path: "SECRET_ACCESS_KEY"}),
			keyVolume(role+"-ca", caSecret, corev1.KeyToPath{Key: "bundle.pem", Path: "ca.crt"}),
		}, []corev1.VolumeMount{
			{Name: role + "-credentials", MountPath: "/etc/pgpilot/" + role + "-credentials", ReadOnly: true},
			{Name: role + "-ca", MountPath: "/etc/pgpilot/" + role + "-ca", ReadOnly: true},
		}
}

// keyVolume mounts the keys of a Secret as the files items name.
func keyVolume(volume, secret string, items ...corev1.KeyToPath) corev1.Volume {
	v := secretVolume(volume, secret)
	v.Secret.Items = items
	return v
}

func claimVolume(volume, claim string) corev1.Volume {
	return corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}
}

// postgresBackup is PostgresBackup backupName of cluster old-db in namespace ns, in
// phase, taken to s3StoreValues("prod/eu") as the API server returns it (defaults set).
func postgresBackup(ns string, phase dbv1.BackupPhase) *dbv1.PostgresBackup {
	return &dbv1.PostgresBackup{
		TypeMeta:   metav1.TypeMeta{APIVersion: dbv1.GroupVersion.String(), Kind: "PostgresBackup"},
		ObjectMeta: metav1.ObjectMeta{Name: backupName, Namespace: ns},
		Spec:       dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: sourceCluster}, Method: "basebackup"},
		Status: dbv1.PostgresBackupStatus{
			Phase:    phase,
			BackupID: backupID,
			Store: &dbv1.BackupStore{
				Path: "prod/eu",
				S3: &dbv1.S3Store{
					Endpoint: "https://s3.example.com",
					Bucket:   "pg-backups",
					Region:   "eu-west-1",
					Credentials: dbv1.S3Credentials{
						SecretName: credentialsSecret, AccessKeyIDKey: "id", SecretAccessKeyKey: "secret",
					},
					TLS: &dbv1.S3TLS{CASecret: &dbv1.SecretKey{Name: caSecret, Key: "bundle.pem"}},
				},
			},
		},
	}
}

func TestBackupAndRestore(t *testing.T) {
	s3Volumes, s3Mounts := s3StoreMounts("backup")
	s3RestoreVolumes, s3RestoreMounts := s3StoreMounts("restore")
	tests := []struct {
		name string
		// values are added to the README example's.
		values []valuesOption
		// cluster holds what the plan observes.
		cluster     []runtime.Object
		wantBackup  *clusterconfig.Backup
		wantRestore *clusterconfig.Restore
		// wantVolumes and wantMounts are the pod's volumes and the postgres container's
		// mounts after those of a cluster without backups.
		wantVolumes []corev1.Volume
		wantMounts  []corev1.VolumeMount
	}{
		{
			name:        "s3 store with a path, custom keys and a CA",
			values:      []valuesOption{set("backup.store", s3StoreValues("prod/eu"))},
			wantBackup:  &clusterconfig.Backup{Store: s3StoreConfig("backup", "prod/eu/my-db")},
			wantVolumes: s3Volumes,
			wantMounts:  s3Mounts,
		},
		{
			name: "s3 store with the default keys, skipping verification",
			values: []valuesOption{set("backup", map[string]any{"schedule": "@daily", "store": map[string]any{"s3": map[string]any{
				"endpoint":    "http://minio.minio:9000",
				"bucket":      "pgdata",
				"credentials": map[string]any{"secretName": credentialsSecret},
				"tls":         map[string]any{"insecureSkipVerify": true},
			}}})},
			wantBackup: &clusterconfig.Backup{Store: clusterconfig.Store{
				S3: &clusterconfig.S3Store{
					Endpoint:           "http://minio.minio:9000",
					Bucket:             "pgdata",
					CredentialsDir:     "/etc/pgpilot/backup-credentials",
					InsecureSkipVerify: true,
				},
				Prefix: "my-db",
			}},
			wantVolumes: []corev1.Volume{keyVolume("backup-credentials", credentialsSecret,
				corev1.KeyToPath{Key: "AWS_ACCESS_KEY_ID", Path: "ACCESS_KEY_ID"},
				corev1.KeyToPath{Key: "AWS_SECRET_ACCESS_KEY", Path: "SECRET_ACCESS_KEY"})},
			wantMounts: []corev1.VolumeMount{{Name: "backup-credentials", MountPath: "/etc/pgpilot/backup-credentials", ReadOnly: true}},
		},
		{
			name:        "volume store",
			values:      []valuesOption{set("backup.store", map[string]any{"path": "pg", "volume": map[string]any{"claimName": "backups"}})},
			wantBackup:  &clusterconfig.Backup{Store: clusterconfig.Store{Directory: "/var/lib/pgpilot/backup", Prefix: "pg/my-db"}},
			wantVolumes: []corev1.Volume{claimVolume("backup-store", "backups")},
			wantMounts:  []corev1.VolumeMount{{Name: "backup-store", MountPath: "/var/lib/pgpilot/backup"}},
		},
		{
			name: "restore from an s3 store to a point in time",
			values: []valuesOption{set("bootstrap.fromBackup", map[string]any{
				"store": s3StoreValues("prod/eu"), "clusterName": sourceCluster, "targetTime": targetTime,
			})},
			wantRestore: &clusterconfig.Restore{Store: s3StoreConfig("restore", "prod/eu/old-db"), TargetTime: targetTime},
			wantVolumes: s3RestoreVolumes,
			wantMounts:  s3RestoreMounts,
		},
		{
			name: "restore from another claim, to an LSN of a chosen backup",
			values: []valuesOption{set("bootstrap.fromBackup", map[string]any{
				"store":       map[string]any{"volume": map[string]any{"claimName": "old-backups"}},
				"clusterName": sourceCluster, "backupID": backupID, "targetLSN": "0/3000060",
			})},
			wantRestore: &clusterconfig.Restore{
				Store:    clusterconfig.Store{Directory: "/var/lib/pgpilot/restore", Prefix: "old-db"},
				BackupID: backupID, TargetLSN: "0/3000060",
			},
			wantVolumes: []corev1.Volume{claimVolume("restore-store", "old-backups")},
			wantMounts:  []corev1.VolumeMount{{Name: "restore-store", MountPath: "/var/lib/pgpilot/restore", ReadOnly: true}},
		},
		{
			name: "restore from the claim the backups go to mounts it once",
			values: []valuesOption{
				set("backup.store", map[string]any{"path": "pg", "volume": map[string]any{"claimName": "backups"}}),
				set("bootstrap.fromBackup", map[string]any{
					"store":       map[string]any{"path": "pg", "volume": map[string]any{"claimName": "backups"}},
					"clusterName": sourceCluster,
				}),
			},
			wantBackup:  &clusterconfig.Backup{Store: clusterconfig.Store{Directory: "/var/lib/pgpilot/backup", Prefix: "pg/my-db"}},
			wantRestore: &clusterconfig.Restore{Store: clusterconfig.Store{Directory: "/var/lib/pgpilot/backup", Prefix: "pg/old-db"}},
			wantVolumes: []corev1.Volume{claimVolume("backup-store", "backups")},
			wantMounts:  []corev1.VolumeMount{{Name: "backup-store", MountPath: "/var/lib/pgpilot/backup"}},
		},
		{
			name: "backup to s3 and restore from s3 mount both",
			values: []valuesOption{
				set("backup.store", s3StoreValues("")),
				set("bootstrap.fromBackup", map[string]any{"store": s3StoreValues("prod/eu"), "clusterName": sourceCluster}),
			},
			wantBackup:  &clusterconfig.Backup{Store: s3StoreConfig("backup", "my-db")},
			wantRestore: &clusterconfig.Restore{Store: s3StoreConfig("restore", "prod/eu/old-db")},
			wantVolumes: append(append([]corev1.Volume{}, s3Volumes...), s3RestoreVolumes...),
			wantMounts:  append(append([]corev1.VolumeMount{}, s3Mounts...), s3RestoreMounts...),
		},
		{
			name:        "restore from a Completed PostgresBackup",
			values:      []valuesOption{set("bootstrap.fromBackup", map[string]any{"backupName": backupName, "targetTime": targetTime})},
			cluster:     []runtime.Object{postgresBackup(namespace, dbv1.BackupCompleted)},
			wantRestore: &clusterconfig.Restore{Store: s3StoreConfig("restore", "prod/eu/old-db"), BackupID: backupID, TargetTime: targetTime},
			wantVolumes: s3RestoreVolumes,
			wantMounts:  s3RestoreMounts,
		},
		{
			name:        "restore from a Completed PostgresBackup whose backupID is repeated",
			values:      []valuesOption{set("bootstrap.fromBackup", map[string]any{"backupName": backupName, "backupID": backupID})},
			cluster:     []runtime.Object{postgresBackup(namespace, dbv1.BackupCompleted)},
			wantRestore: &clusterconfig.Restore{Store: s3StoreConfig("restore", "prod/eu/old-db"), BackupID: backupID},
			wantVolumes: s3RestoreVolumes,
			wantMounts:  s3RestoreMounts,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := renderOptions(readmeValues(tt.values...))
			opts.Observed = existing(tt.cluster...)
			m := renderWith(t, opts)

			config := wantConfig(3, map[string]string{}, "app", "app")
			config.Backup, config.Restore = tt.wantBackup, tt.wantRestore
			if diff := cmp.Diff(config, decodeConfig(t, m)); diff != "" {
				t.Errorf("config.json (-want +got):\n%s", diff)
			}

			// Only the postgres container mounts the stores; nothing else changes.
			want := wantStatefulSet()
			pod := &want.Spec.Template.Spec
			pod.Volumes = append(pod.Volumes, tt.wantVolumes...)
			pod.Containers[0].VolumeMounts = append(pod.Containers[0].VolumeMounts, tt.wantMounts...)
			got := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
			if diff := cmp.Diff(want, got, quantity); diff != "" {
				t.Errorf("StatefulSet (-want +got):\n%s", diff)
			}
			if violations := restrictedViolations(got.Spec.Template.Spec); len(violations) > 0 {
				t.Errorf("the instance pod breaks the restricted profile:\n%s", strings.Join(violations, "\n"))
			}
		})
	}
}

// secretReference is the one place a Secret's name may appear: a secret volume's source.
var secretReference = regexp.MustCompile(`\.volumes\[\d+\]\.secret\.secretName$`)

// stringPaths lists the paths of the string values under v that contain s.
func stringPaths(path string, v any, s string) []string {
	var paths []string
	switch v := v.(type) {
	case map[string]any:
		for key, value := range v {
			paths = append(paths, stringPaths(path+"."+key, value, s)...)
		}
	case []any:
		for i, value := range v {
			paths = append(paths, stringPaths(fmt.Sprintf("%s[%d]", path, i), value, s)...)
		}
	case string:
		if strings.Contains(v, s) {
			paths = append(paths, path)
		}
	}
	return paths
}

// The chart never reads the backup Secrets: it renders no Secret, and their names appear
// only as the sources of the postgres container's volumes, not in config.json.
func TestBackupSecretsAreOnlyReferenced(t *testing.T) {
	m := render(t, readmeValues(
		set("backup.store", s3StoreValues("prod/eu")),
		set("bootstrap.fromBackup", map[string]any{"store": s3StoreValues("old"), "clusterName": sourceCluster}),
	))
	for _, secret := range []string{credentialsSecret, caSecret} {
		var got []string
		for _, obj := range m.Objects {
			if obj.Kind == "Secret" {
				t.Errorf("the chart renders Secret %s", obj.Name)
			}
			got = append(got, stringPaths(obj.Kind+"/"+obj.Name, obj.Raw, secret)...)
		}
		sort.Strings(got)
		if len(got) != 2 {
			t.Errorf("Secret %s is referenced %d times, want 2 (backup and restore volumes): %v", secret, len(got), got)
		}
		for _, path := range got {
			if !strings.HasPrefix(path, "StatefulSet/"+name+".") || !secretReference.MatchString(path) {
				t.Errorf("Secret %s is named at %s, which is not a secret volume's source", secret, path)
			}
		}
	}
}

// deployed is what the API server holds once m is deployed, for the plan to observe: its
// ConfigMap and StatefulSet.
func deployed(t *testing.T, m *manifest) []runtime.Object {
	t.Helper()
	return []runtime.Object{
		decode[corev1.ConfigMap](t, m, "ConfigMap", dbv1.NamesOf(name).ConfigMap()),
		decode[appsv1.StatefulSet](t, m, "StatefulSet", name),
	}
}

// fromBackup restores only when the cluster is created, but the chart is rendered again on
// every reconcile: once deployed, a cluster restored from a PostgresBackup renders the same
// whatever becomes of that PostgresBackup.
func TestRestoreFromBackupNameOnceDeployed(t *testing.T) {
	fromBackupName := set("bootstrap.fromBackup", map[string]any{"backupName": backupName, "targetTime": targetTime})
	onClaim := func(phase dbv1.BackupPhase, claim string) *dbv1.PostgresBackup {
		b := postgresBackup(namespace, phase)
		b.Status.Store = &dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: claim}}
		return b
	}
	moved := postgresBackup(namespace, dbv1.BackupCompleted)
	moved.Status.Store.S3.Bucket, moved.Status.BackupID = "elsewhere", "20990101T000000Z"
	tests := []struct {
		name   string
		values []valuesOption
		// created is the PostgresBackup the cluster was created from.
		created *dbv1.PostgresBackup
		// now are the PostgresBackups there are after the cluster was deployed.
		now []runtime.Object
	}{
		{
			name:    "s3 store, PostgresBackup deleted",
			values:  []valuesOption{fromBackupName, set("backup.store", s3StoreValues(""))},
			created: postgresBackup(namespace, dbv1.BackupCompleted),
		},
		{
			name:    "s3 store, PostgresBackup Failed",
			values:  []valuesOption{fromBackupName},
			created: postgresBackup(namespace, dbv1.BackupCompleted),
			now:     []runtime.Object{postgresBackup(namespace, dbv1.BackupFailed)},
		},
		{
			name:    "s3 store, PostgresBackup with another store and backupID",
			values:  []valuesOption{fromBackupName},
			created: postgresBackup(namespace, dbv1.BackupCompleted),
			now:     []runtime.Object{moved},
		},
		{
			name:    "another claim, PostgresBackup deleted",
			values:  []valuesOption{fromBackupName},
			created: onClaim(dbv1.BackupCompleted, "old-backups"),
		},
		{
			name:    "another claim, PostgresBackup now on the backups' claim",
			values:  []valuesOption{fromBackupName, set("backup.store", map[string]any{"volume": map[string]any{"claimName": "backups"}})},
			created: onClaim(dbv1.BackupCompleted, "old-backups"),
			now:     []runtime.Object{onClaim(dbv1.BackupCompleted, "backups")},
		},
		{
			name:    "the backups' claim, PostgresBackup deleted",
			values:  []valuesOption{fromBackupName, set("backup.store", map[string]any{"volume": map[string]any{"claimName": "backups"}})},
			created: onClaim(dbv1.BackupCompleted, "backups"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := renderOptions(readmeValues(tt.values...))
			opts.Observed = existing(tt.created)
			first := renderWith(t, opts)
			if decodeConfig(t, first).Restore == nil {
				t.Fatal("the first render has no restore block")
			}

			opts.Observed = existing(append(deployed(t, first), tt.now...)...)
			again := renderWith(t, opts)
			if diff := cmp.Diff(first.Text, again.Text); diff != "" {
				t.Errorf("the deployed cluster renders differently (-first +again):\n%s", diff)
			}

			// The cluster can still be changed: scaled here.
			opts.Values = readmeValues(append(tt.values, withReplicas(5))...)
			scaled := renderWith(t, opts)
			if diff := cmp.Diff(decodeConfig(t, first).Restore, decodeConfig(t, scaled).Restore); diff != "" {
				t.Errorf("restore block after scaling (-first +scaled):\n%s", diff)
			}
			want := decode[appsv1.StatefulSet](t, first, "StatefulSet", name).Spec.Template
			got := decode[appsv1.StatefulSet](t, scaled, "StatefulSet", name).Spec.Template
			if diff := cmp.Diff(want, got, quantity); diff != "" {
				t.Errorf("pod template after scaling (-first +scaled):\n%s", diff)
			}
		})
	}
}
