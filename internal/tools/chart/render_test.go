package chart_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	helmchart "helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/helmmanager"
	"github.com/pgpilot/pgpilot/internal/operator/plan"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/tools/chart"
)

const (
	// chartDir is relative to this package: go test runs in the package's directory.
	chartDir   = "../../../helm-charts/postgrescluster"
	name       = "my-db"
	namespace  = "db"
	agentImage = "registry.example.com/pgpilot/pgpilot:0.1.0"
	// operatorNamespace is where the operator runs (POD_NAMESPACE, watches.yaml).
	operatorNamespace = "pgpilot-system"

	podMonitorAPI = "monitoring.coreos.com/v1/PodMonitor"
)

// quantity compares resource quantities by value.
var quantity = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

// --- values -----------------------------------------------------------------------------

// valuesOption changes the values of one render.
type valuesOption func(map[string]any)

// set sets the value at a dotted path ("storage.size"), creating tables on the way.
func set(path string, value any) valuesOption {
	return func(values map[string]any) {
		keys := strings.Split(path, ".")
		table := values
		for _, key := range keys[:len(keys)-1] {
			next, ok := table[key].(map[string]any)
			if !ok {
				next = map[string]any{}
				table[key] = next
			}
			table = next
		}
		table[keys[len(keys)-1]] = value
	}
}

func withReplicas(n int) valuesOption   { return set("replicas", n) }
func withVersion(v string) valuesOption { return set("version", v) }

// readmeValues are the values the operator passes for the README example (replicas 3,
// version "16"), as changed by opts.
func readmeValues(opts ...valuesOption) map[string]any {
	values := map[string]any{
		"replicas": 3,
		"version":  "16",
		"operator": map[string]any{"agentImage": agentImage, "namespace": operatorNamespace},
	}
	for _, opt := range opts {
		opt(values)
	}
	return values
}

// --- rendering --------------------------------------------------------------------------

// object is one rendered object.
type object struct {
	Kind, Name string
	YAML       string
	Raw        map[string]any
}

// manifest is one render of the chart.
type manifest struct {
	Objects []object
	Text    string
	Notes   string
}

func loadChart(t *testing.T) *helmchart.Chart {
	t.Helper()
	ch, err := chart.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// renderOptions renders values for cluster my-db in namespace db.
func renderOptions(values map[string]any) chart.Options {
	return chart.Options{Name: name, Namespace: namespace, Values: values}
}

func render(t *testing.T, values map[string]any) *manifest {
	t.Helper()
	return renderWith(t, renderOptions(values))
}

func renderWith(t *testing.T, opts chart.Options) *manifest {
	t.Helper()
	rendered, err := chart.Render(loadChart(t), opts)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	m := &manifest{Text: rendered.Manifest(), Notes: rendered.Notes}
	seen := map[string]bool{}
	for _, doc := range rendered.Documents {
		var raw map[string]any
		if err := yaml.Unmarshal([]byte(doc.YAML), &raw); err != nil {
			t.Fatalf("%s does not render YAML: %v\n%s", doc.Template, err, doc.YAML)
		}
		if raw == nil {
			continue
		}
		var meta struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc.YAML), &meta); err != nil {
			t.Fatalf("%s: %v", doc.Template, err)
		}
		key := meta.Kind + "/" + meta.Name
		if seen[key] {
			t.Fatalf("%s is rendered twice", key)
		}
		seen[key] = true
		m.Objects = append(m.Objects, object{Kind: meta.Kind, Name: meta.Name, YAML: doc.YAML, Raw: raw})
	}
	return m
}

func (m *manifest) find(kind, name string) (object, bool) {
	for _, obj := range m.Objects {
		if obj.Kind == kind && obj.Name == name {
			return obj, true
		}
	}
	return object{}, false
}

// decode decodes the object kind/name of m strictly into a T: a field the API does not
// know fails the test.
func decode[T any](t *testing.T, m *manifest, kind, name string) *T {
	t.Helper()
	obj, ok := m.find(kind, name)
	if !ok {
		t.Fatalf("no %s %s rendered; got %v", kind, name, m.names())
	}
	out := new(T)
	if err := yaml.UnmarshalStrict([]byte(obj.YAML), out); err != nil {
		t.Fatalf("decoding %s %s: %v", kind, name, err)
	}
	return out
}

// names are the kind/name of every rendered object, sorted.
func (m *manifest) names() []string {
	names := make([]string, 0, len(m.Objects))
	for _, obj := range m.Objects {
		names = append(names, obj.Kind+"/"+obj.Name)
	}
	sort.Strings(names)
	return names
}

// existing is what the plan observes (plan.Observe) when the API server holds objects:
// cluster my-db's ConfigMap and StatefulSet, and the PostgresBackup the restore tests name,
// in namespace db.
func existing(objects ...runtime.Object) plan.Observed {
	var observed plan.Observed
	for _, obj := range objects {
		switch obj := obj.(type) {
		case *corev1.ConfigMap:
			if obj.Namespace == namespace && obj.Name == dbv1.NamesOf(name).ConfigMap() {
				observed.ConfigMap = obj
			}
		case *appsv1.StatefulSet:
			if obj.Namespace == namespace && obj.Name == dbv1.NamesOf(name).StatefulSet() {
				observed.StatefulSet = obj
			}
		case *dbv1.PostgresBackup:
			if obj.Namespace == namespace && obj.Name == backupName {
				observed.Backup = obj
			}
		}
	}
	return observed
}

// --- expected objects -------------------------------------------------------------------

func selectorLabels(cluster string) map[string]string {
	return map[string]string{
		"db.example.com/cluster": cluster,
		"app.kubernetes.io/name": "postgresql",
	}
}

func commonLabels(cluster string) map[string]string {
	return map[string]string{
		"db.example.com/cluster":       cluster,
		"app.kubernetes.io/name":       "postgresql",
		"app.kubernetes.io/instance":   cluster,
		"app.kubernetes.io/component":  "database",
		"app.kubernetes.io/managed-by": "pgpilot",
		"app.kubernetes.io/part-of":    "pgpilot",
	}
}

// objectLabels are the labels of every rendered object: the pods' labels, with the
// managed-by label Helm sets on every object it installs.
func objectLabels(cluster string) map[string]string {
	labels := commonLabels(cluster)
	labels["app.kubernetes.io/managed-by"] = "Helm"
	return labels
}

func roleSelector(cluster, role string) map[string]string {
	labels := selectorLabels(cluster)
	labels["db.example.com/role"] = role
	return labels
}

func restrictedContainerContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
	}
}

func agentProbe(path string, period, timeout, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("agent"), Scheme: corev1.URISchemeHTTPS},
		},
		PeriodSeconds:    period,
		TimeoutSeconds:   timeout,
		FailureThreshold: failures,
	}
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func secretVolume(volume, secret string) corev1.Volume {
	return corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o440)},
	}}
}

// wantStatefulSet is the StatefulSet of the README example.
func wantStatefulSet() *appsv1.StatefulSet {
	labels := commonLabels(name)
	return &appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: objectLabels(name)},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](3),
			ServiceName:         dbv1.NamesOf(name).HeadlessService(),
			Selector:            &metav1.LabelSelector{MatchLabels: selectorLabels(name)},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
				WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            name + "-instance",
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](60),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:        ptr.To(true),
						RunAsUser:           ptr.To[int64](999),
						RunAsGroup:          ptr.To[int64](999),
						FSGroup:             ptr.To[int64](999),
						FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
						SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					InitContainers: []corev1.Container{{
						Name:            "install-agent",
						Image:           agentImage,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/usr/local/bin/agent", "install", "/pgpilot/agent"},
						SecurityContext: restrictedContainerContext(),
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{
								corev1.ResourceCPU:    resource.MustParse("10m"),
								corev1.ResourceMemory: resource.MustParse("16Mi"),
							},
							Limits: corev1.ResourceList{
								corev1.ResourceCPU:    resource.MustParse("100m"),
								corev1.ResourceMemory: resource.MustParse("64Mi"),
							},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "agent", MountPath: "/pgpilot"}},
					}},
					Containers: []corev1.Container{{
						Name:            "postgres",
						Image:           "postgres:16.11",
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/pgpilot/agent", "run"},
						Ports: []corev1.ContainerPort{
							{Name: "postgresql", ContainerPort: 5432, Protocol: corev1.ProtocolTCP},
							{Name: "agent", ContainerPort: 8008, Protocol: corev1.ProtocolTCP},
						},
						Env: []corev1.EnvVar{
							fieldEnv("POD_NAME", "metadata.name"),
							fieldEnv("POD_NAMESPACE", "metadata.namespace"),
							fieldEnv("POD_IP", "status.podIP"),
							{Name: "CLUSTER_NAME", Value: name},
							{Name: "PG_MAJOR", Value: "16"},
							{Name: "PGDATA", Value: "/var/lib/postgresql/data/pgdata"},
							{Name: "PGPILOT_CONFIG", Value: "/etc/pgpilot/config/config.json"},
							{Name: "PGPILOT_SECRETS", Value: "/etc/pgpilot/secrets"},
						},
						SecurityContext: restrictedContainerContext(),
						StartupProbe:    agentProbe("/healthz", 2, 0, 1800),
						LivenessProbe:   agentProbe("/healthz", 10, 5, 3),
						ReadinessProbe:  agentProbe("/readyz", 5, 3, 3),
						VolumeMounts: []corev1.VolumeMount{
							{Name: "data", MountPath: "/var/lib/postgresql/data"},
							{Name: "agent", MountPath: "/pgpilot", ReadOnly: true},
							{Name: "config", MountPath: "/etc/pgpilot/config", ReadOnly: true},
							{Name: "superuser", MountPath: "/etc/pgpilot/secrets/superuser", ReadOnly: true},
							{Name: "replication", MountPath: "/etc/pgpilot/secrets/replication", ReadOnly: true},
							{Name: "app", MountPath: "/etc/pgpilot/secrets/app", ReadOnly: true},
							{Name: "agent-auth", MountPath: "/etc/pgpilot/agent", ReadOnly: true},
							{Name: "tls-server", MountPath: "/etc/pgpilot/tls/server", ReadOnly: true},
							{Name: "tls-replication", MountPath: "/etc/pgpilot/tls/replication", ReadOnly: true},
							{Name: "tls-instance", MountPath: "/etc/pgpilot/tls/instance", ReadOnly: true},
							{Name: "tls-source", MountPath: "/etc/pgpilot/tls/source", ReadOnly: true},
							{Name: "tmp", MountPath: "/tmp"},
							{Name: "run", MountPath: "/run/postgresql"},
							{Name: "shm", MountPath: "/dev/shm"},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: dbv1.NamesOf(name).ConfigMap()},
						}}},
						secretVolume("superuser", dbv1.NamesOf(name).SuperuserSecret()),
						secretVolume("replication", dbv1.NamesOf(name).ReplicationSecret()),
						secretVolume("app", dbv1.NamesOf(name).AppSecret()),
						secretVolume("agent-auth", dbv1.NamesOf(name).AgentAuthSecret()),
						secretVolume("tls-server", dbv1.NamesOf(name).ServerTLSSecret()),
						secretVolume("tls-replication", dbv1.NamesOf(name).ReplicationTLSSecret()),
						secretVolume("tls-instance", dbv1.NamesOf(name).ServerTLSSecret()),
						{Name: "tls-source", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName: dbv1.NamesOf(name).SourceTLSSecret(), DefaultMode: ptr.To[int32](0o440), Optional: ptr.To(true)}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
					},
					Affinity: defaultAffinity(),
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
				ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: labels},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
					},
				},
			}},
		},
	}
}

func defaultAffinity() *corev1.Affinity {
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				TopologyKey:   "kubernetes.io/hostname",
				LabelSelector: &metav1.LabelSelector{MatchLabels: selectorLabels(name)},
			},
		}},
	}}
}

// --- tests ------------------------------------------------------------------------------

func TestReadmeExample(t *testing.T) {
	m := render(t, readmeValues())

	wantNames := []string{
		"ConfigMap/my-db-config",
		"NetworkPolicy/my-db",
		"PodDisruptionBudget/my-db",
		"Role/my-db-instance",
		"RoleBinding/my-db-instance",
		"Service/my-db-headless",
		"Service/my-db-r",
		"Service/my-db-ro",
		"Service/my-db-rw",
		"ServiceAccount/my-db-instance",
		"StatefulSet/my-db",
	}
	if diff := cmp.Diff(wantNames, m.names()); diff != "" {
		t.Errorf("rendered objects (-want +got):\n%s", diff)
	}

	got := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
	if diff := cmp.Diff(wantStatefulSet(), got, quantity); diff != "" {
		t.Errorf("StatefulSet (-want +got):\n%s", diff)
	}

	sa := decode[corev1.ServiceAccount](t, m, "ServiceAccount", name+"-instance")
	if sa.AutomountServiceAccountToken == nil || !*sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount automountServiceAccountToken = %v, want true", sa.AutomountServiceAccountToken)
	}
	binding := decode[rbacv1.RoleBinding](t, m, "RoleBinding", name+"-instance")
	wantBinding := rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-instance", Namespace: namespace, Labels: objectLabels(name)},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name + "-instance"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name + "-instance", Namespace: namespace}},
	}
	if diff := cmp.Diff(wantBinding, *binding); diff != "" {
		t.Errorf("RoleBinding (-want +got):\n%s", diff)
	}

	for _, want := range []string{name + "-rw.db.svc:5432", "Secret " + dbv1.NamesOf(name).AppSecret()} {
		if !strings.Contains(m.Notes, want) {
			t.Errorf("NOTES.txt does not mention %q:\n%s", want, m.Notes)
		}
	}
}

func TestStatefulSetShape(t *testing.T) {
	type shape struct {
		Replicas            int32
		ServiceName         string
		Selector            map[string]string
		PodManagementPolicy appsv1.PodManagementPolicyType
		UpdateStrategy      appsv1.StatefulSetUpdateStrategyType
		WhenDeleted         appsv1.PersistentVolumeClaimRetentionPolicyType
		WhenScaled          appsv1.PersistentVolumeClaimRetentionPolicyType
		PGMajor             string
	}
	want := func(replicas int32, major string) shape {
		return shape{
			Replicas:            replicas,
			ServiceName:         dbv1.NamesOf(name).HeadlessService(),
			Selector:            selectorLabels(name),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.OnDeleteStatefulSetStrategyType,
			WhenDeleted:         appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			WhenScaled:          appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			PGMajor:             major,
		}
	}
	tests := []struct {
		name   string
		values map[string]any
		want   shape
	}{
		{name: "readme example", values: readmeValues(), want: want(3, "16")},
		{name: "single instance", values: readmeValues(withReplicas(1)), want: want(1, "16")},
		{name: "five instances of 17", values: readmeValues(withReplicas(5), withVersion("17")), want: want(5, "17")},
		{name: "chart defaults", values: map[string]any{"operator": map[string]any{"agentImage": agentImage}}, want: want(3, "16")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sts := decode[appsv1.StatefulSet](t, render(t, tt.values), "StatefulSet", name)
			got := shape{
				Replicas:            ptr.Deref(sts.Spec.Replicas, -1),
				ServiceName:         sts.Spec.ServiceName,
				Selector:            sts.Spec.Selector.MatchLabels,
				PodManagementPolicy: sts.Spec.PodManagementPolicy,
				UpdateStrategy:      sts.Spec.UpdateStrategy.Type,
				WhenDeleted:         sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted,
				WhenScaled:          sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenScaled,
			}
			for _, env := range sts.Spec.Template.Spec.Containers[0].Env {
				if env.Name == "PG_MAJOR" {
					got.PGMajor = env.Value
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("StatefulSet (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPostgresImage(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{name: "default for 16", values: readmeValues(), want: "postgres:16.11"},
		{name: "default for 14", values: readmeValues(withVersion("14")), want: "postgres:14.20"},
		{name: "default for 18", values: readmeValues(withVersion("18")), want: "postgres:18.1"},
		{
			name:   "image override wins",
			values: readmeValues(set("image", "mirror.example.com/postgres:16.4"), set("operator.postgresImages.16", "related.example.com/postgres:16.9")),
			want:   "mirror.example.com/postgres:16.4",
		},
		{
			name:   "operator postgresImages win over defaults",
			values: readmeValues(set("operator.postgresImages.16", "related.example.com/postgres:16.9")),
			want:   "related.example.com/postgres:16.9",
		},
		{
			name:   "empty operator postgresImages entry counts as unset",
			values: readmeValues(set("operator.postgresImages.16", "")),
			want:   "postgres:16.11",
		},
		{
			name:   "postgresImages of another version do not apply",
			values: readmeValues(set("operator.postgresImages.17", "related.example.com/postgres:17.2")),
			want:   "postgres:16.11",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sts := decode[appsv1.StatefulSet](t, render(t, tt.values), "StatefulSet", name)
			if got := sts.Spec.Template.Spec.Containers[0].Image; got != tt.want {
				t.Errorf("postgres image = %q, want %q", got, tt.want)
			}
			if got := sts.Spec.Template.Spec.InitContainers[0].Image; got != agentImage {
				t.Errorf("install-agent image = %q, want %q", got, agentImage)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name    string
		opts    chart.Options
		wantErr string
	}{
		{
			name:    "no image for the version",
			opts:    renderOptions(readmeValues(withVersion("17"), set("operator.defaultPostgresImages.17", ""))),
			wantErr: `no PostgreSQL image for version "17"`,
		},
		{
			name:    "no agent image",
			opts:    renderOptions(readmeValues(set("operator.agentImage", ""))),
			wantErr: "operator.agentImage is required",
		},
		{
			name:    "a pooler without PgBouncer's image",
			opts:    renderOptions(readmeValues(set("pooler", map[string]any{}))),
			wantErr: "RELATED_IMAGE_PGBOUNCER",
		},
		{
			name:    "a pooler setting pgpilot owns",
			opts:    renderOptions(readmeValues(set("pooler", map[string]any{"parameters": map[string]any{"auth_type": "trust"}}), set("operator.poolerImage", poolerImage))),
			wantErr: "spec.pooler.parameters: auth_type is set by pgpilot",
		},
		{
			name:    "no version",
			opts:    renderOptions(readmeValues(set("version", nil))),
			wantErr: "version is required",
		},
		{
			name: "Kubernetes older than 1.29",
			opts: func() chart.Options {
				opts := renderOptions(readmeValues())
				opts.KubeVersion = "v1.28.9"
				return opts
			}(),
			wantErr: "kubeVersion",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := chart.Render(loadChart(t), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Render error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// The chart only renders what the operator decided: rendered by Helm alone, without a
// plan, it fails saying where the plan comes from (not with a nil pointer).
func TestRenderWithoutPlanSaysWhy(t *testing.T) {
	ch := loadChart(t)
	values, err := chartutil.ToRenderValues(ch, readmeValues(),
		chartutil.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Render(ch, values)
	if want := "values.plan is missing: the pgpilot operator makes it"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Render without a plan: error = %v, want one containing %q", err, want)
	}
}

func TestServices(t *testing.T) {
	postgresql := corev1.ServicePort{Name: "postgresql", Port: 5432, TargetPort: intstr.FromString("postgresql"), Protocol: corev1.ProtocolTCP}
	agent := corev1.ServicePort{Name: "agent", Port: 8008, TargetPort: intstr.FromString("agent"), Protocol: corev1.ProtocolTCP}
	tests := []struct {
		name string
		want corev1.ServiceSpec
	}{
		{name: dbv1.NamesOf(name).ReadWriteService(), want: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: roleSelector(name, "primary"), Ports: []corev1.ServicePort{postgresql},
			PublishNotReadyAddresses: true,
		}},
		{name: dbv1.NamesOf(name).ReadOnlyService(), want: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: roleSelector(name, "replica"), Ports: []corev1.ServicePort{postgresql},
		}},
		{name: name + "-r", want: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: selectorLabels(name), Ports: []corev1.ServicePort{postgresql},
		}},
		{name: dbv1.NamesOf(name).HeadlessService(), want: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true,
			Selector: selectorLabels(name), Ports: []corev1.ServicePort{postgresql, agent},
		}},
	}
	m := render(t, readmeValues())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := decode[corev1.Service](t, m, "Service", tt.name)
			if diff := cmp.Diff(tt.want, svc.Spec); diff != "" {
				t.Errorf("Service %s spec (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

func TestPodDisruptionBudgets(t *testing.T) {
	// One budget over every instance, the primary included (its stop is a handover), so
	// that a drain evicts the primary instead of waiting forever.
	all := policyv1.PodDisruptionBudgetSpec{
		MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
		Selector:                   &metav1.LabelSelector{MatchLabels: selectorLabels(name)},
		UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
	}
	tests := []struct {
		name     string
		replicas int
		want     map[string]policyv1.PodDisruptionBudgetSpec
	}{
		{name: "three instances", replicas: 3, want: map[string]policyv1.PodDisruptionBudgetSpec{name: all}},
		{name: "two instances", replicas: 2, want: map[string]policyv1.PodDisruptionBudgetSpec{name: all}},
		{name: "one instance", replicas: 1, want: map[string]policyv1.PodDisruptionBudgetSpec{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := render(t, readmeValues(withReplicas(tt.replicas)))
			got := map[string]policyv1.PodDisruptionBudgetSpec{}
			for _, obj := range m.Objects {
				if obj.Kind == "PodDisruptionBudget" {
					pdb := decode[policyv1.PodDisruptionBudget](t, m, obj.Kind, obj.Name)
					if pdb.APIVersion != "policy/v1" {
						t.Errorf("PodDisruptionBudget %s apiVersion = %q, want policy/v1", obj.Name, pdb.APIVersion)
					}
					got[obj.Name] = pdb.Spec
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("PodDisruptionBudgets (-want +got):\n%s", diff)
			}
		})
	}
}

// restrictedViolations lists how a pod breaks the restricted Pod Security Standard, or the
// chart's own rule that every root filesystem is read-only. It checks the pod and every
// container, init containers included.
func restrictedViolations(pod corev1.PodSpec) []string {
	var violations []string
	add := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		add("pod shares a host namespace")
	}
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		add("pod runs as user 0")
	}
	if len(psc.Sysctls) > 0 {
		add("pod sets sysctls")
	}
	podNonRoot := ptr.Deref(psc.RunAsNonRoot, false)
	seccompAllowed := func(p *corev1.SeccompProfile) bool {
		return p.Type == corev1.SeccompProfileTypeRuntimeDefault || p.Type == corev1.SeccompProfileTypeLocalhost
	}
	podSeccomp := psc.SeccompProfile != nil && seccompAllowed(psc.SeccompProfile)
	if psc.SeccompProfile != nil && !podSeccomp {
		add("pod seccomp profile %s", psc.SeccompProfile.Type)
	}
	if psc.AppArmorProfile != nil && psc.AppArmorProfile.Type == corev1.AppArmorProfileTypeUnconfined {
		add("pod AppArmor profile is Unconfined")
	}

	allowedVolumes := map[string]bool{
		"configMap": true, "csi": true, "downwardAPI": true, "emptyDir": true, "ephemeral": true,
		"persistentVolumeClaim": true, "projected": true, "secret": true,
	}
	for _, volume := range pod.Volumes {
		source, err := json.Marshal(volume.VolumeSource)
		if err != nil {
			add("volume %s: %v", volume.Name, err)
			continue
		}
		var kinds map[string]any
		_ = json.Unmarshal(source, &kinds)
		for kind := range kinds {
			if !allowedVolumes[kind] {
				add("volume %s is of type %s", volume.Name, kind)
			}
		}
	}

	containers := append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...)
	for _, c := range containers {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if ptr.Deref(sc.Privileged, false) {
			add("container %s is privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			add("container %s does not set allowPrivilegeEscalation false", c.Name)
		}
		dropsAll := false
		if sc.Capabilities != nil {
			for _, capability := range sc.Capabilities.Drop {
				dropsAll = dropsAll || capability == "ALL"
			}
			for _, capability := range sc.Capabilities.Add {
				if capability != "NET_BIND_SERVICE" {
					add("container %s adds capability %s", c.Name, capability)
				}
			}
		}
		if !dropsAll {
			add("container %s does not drop ALL capabilities", c.Name)
		}
		if !ptr.Deref(sc.RunAsNonRoot, podNonRoot) {
			add("container %s may run as root: runAsNonRoot is not true", c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			add("container %s runs as user 0", c.Name)
		}
		if sc.SeccompProfile != nil && !seccompAllowed(sc.SeccompProfile) || sc.SeccompProfile == nil && !podSeccomp {
			add("container %s has no RuntimeDefault or Localhost seccomp profile", c.Name)
		}
		if sc.AppArmorProfile != nil && sc.AppArmorProfile.Type == corev1.AppArmorProfileTypeUnconfined {
			add("container %s AppArmor profile is Unconfined", c.Name)
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			add("container %s procMount is %s", c.Name, *sc.ProcMount)
		}
		if sc.WindowsOptions != nil && ptr.Deref(sc.WindowsOptions.HostProcess, false) {
			add("container %s is a Windows host process", c.Name)
		}
		if !ptr.Deref(sc.ReadOnlyRootFilesystem, false) {
			add("container %s has a writable root filesystem", c.Name)
		}
		for _, port := range c.Ports {
			if port.HostPort != 0 {
				add("container %s uses host port %d", c.Name, port.HostPort)
			}
		}
	}
	return violations
}

func TestRestrictedPodSecurity(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
	}{
		{name: "readme example", values: readmeValues()},
		{name: "single instance", values: readmeValues(withReplicas(1))},
		{name: "user resources and scheduling", values: readmeValues(
			set("resources", map[string]any{"limits": map[string]any{"memory": "2Gi"}}),
			set("nodeSelector", map[string]any{"disk": "ssd"}),
			set("affinity", map[string]any{"nodeAffinity": map[string]any{}}),
		)},
		{name: "image override", values: readmeValues(set("image", "mirror.example.com/postgres:16.4"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sts := decode[appsv1.StatefulSet](t, render(t, tt.values), "StatefulSet", name)
			if got := restrictedViolations(sts.Spec.Template.Spec); len(got) > 0 {
				t.Errorf("the instance pod breaks the restricted profile:\n%s", strings.Join(got, "\n"))
			}
		})
	}
}

// TestRestrictedViolations checks the checker: each unsafe change to the rendered pod is caught.
func TestRestrictedViolations(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.PodSpec)
	}{
		{name: "init container may escalate", mutate: func(p *corev1.PodSpec) {
			p.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}},
		{name: "init container keeps capabilities", mutate: func(p *corev1.PodSpec) {
			p.InitContainers[0].SecurityContext.Capabilities = nil
		}},
		{name: "container runs as root", mutate: func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.RunAsNonRoot = ptr.To(false)
		}},
		{name: "container root filesystem writable", mutate: func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.ReadOnlyRootFilesystem = nil
		}},
		{name: "no seccomp profile", mutate: func(p *corev1.PodSpec) {
			p.SecurityContext.SeccompProfile = nil
		}},
		{name: "hostPath volume", mutate: func(p *corev1.PodSpec) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}},
		{name: "privileged container", mutate: func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.Privileged = ptr.To(true)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := wantStatefulSet().Spec.Template.Spec
			if got := restrictedViolations(pod); len(got) > 0 {
				t.Fatalf("the expected pod already breaks the profile: %v", got)
			}
			tt.mutate(&pod)
			if got := restrictedViolations(pod); len(got) == 0 {
				t.Errorf("restrictedViolations found nothing")
			}
		})
	}
}

// volumeOrSecretName matches the paths of volume and Secret names: they may mention a
// password without holding one.
var volumeOrSecretName = regexp.MustCompile(`\.(volumes|volumeMounts)\[\d+\]\.name$|\.secret\.secretName$`)

// credentialLeaks lists every key or string value under v that mentions a password, but
// volume and Secret names.
func credentialLeaks(path string, v any) []string {
	var leaks []string
	switch v := v.(type) {
	case map[string]any:
		for key, value := range v {
			if strings.Contains(strings.ToLower(key), "password") {
				leaks = append(leaks, path+"."+key)
			}
			leaks = append(leaks, credentialLeaks(path+"."+key, value)...)
		}
	case []any:
		for i, value := range v {
			leaks = append(leaks, credentialLeaks(fmt.Sprintf("%s[%d]", path, i), value)...)
		}
	case string:
		if !volumeOrSecretName.MatchString(path) && strings.Contains(strings.ToLower(v), "password") {
			leaks = append(leaks, path+" = "+v)
		}
	}
	return leaks
}

func TestNoCredentialsRendered(t *testing.T) {
	tests := []struct {
		name string
		opts chart.Options
	}{
		{name: "readme example", opts: renderOptions(readmeValues())},
		{name: "single instance", opts: renderOptions(readmeValues(withReplicas(1)))},
		{name: "parameters and monitoring", opts: chart.Options{
			Name: name, Namespace: namespace, APIVersions: []string{"monitoring.coreos.com/v1", podMonitorAPI},
			Values: readmeValues(
				set("postgresql.parameters", map[string]any{"work_mem": "64MB"}),
				set("monitoring.enabled", true),
			),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := renderWith(t, tt.opts)
			for _, obj := range m.Objects {
				if obj.Kind == "Secret" {
					t.Errorf("the chart renders Secret %s: the controller owns credentials", obj.Name)
				}
				if leaks := credentialLeaks(obj.Kind+"/"+obj.Name, obj.Raw); len(leaks) > 0 {
					t.Errorf("%s/%s mentions a password:\n%s", obj.Kind, obj.Name, strings.Join(leaks, "\n"))
				}
			}
		})
	}
}

// instanceConfig is config.json, as the agent reads it: its own type, decoded strictly,
// so a key the chart writes and the agent does not know (or the reverse) fails here.
type instanceConfig = clusterconfig.Config

func wantConfig(replicas int, parameters map[string]string, database, owner string) instanceConfig {
	c := instanceConfig{
		ClusterName:     name,
		Version:         "16",
		Replicas:        replicas,
		Parameters:      parameters,
		PrimaryLease:    dbv1.NamesOf(name).PrimaryLease(),
		IdleSlotTimeout: "30m0s",
	}
	c.Bootstrap.Database, c.Bootstrap.Owner = database, owner
	c.MaxReadLag = "30s"
	c.Upgrade.BackupMaxAge = "24h0m0s"
	c.Services.ReadWrite, c.Services.Headless = dbv1.NamesOf(name).ReadWriteService(), dbv1.NamesOf(name).HeadlessService()
	return c
}

func TestConfigJSON(t *testing.T) {
	tricky := map[string]string{
		"application_name":           `it's "quoted"`,
		"log_line_prefix":            "%m [%p]\t%q%u@%d ",
		"search_path":                `"$user", public`,
		"auto_explain.log_format":    `{{ .Release.Name }} {{ fail "x" }}`,
		"shared_preload_libraries":   `pg_stat_statements,auto_explain`,
		"default_text_search_config": "pg_catalog.english — ünïcödé \\ backslash",
		"work_mem":                   "  64MB  ",
	}
	toValues := func(p map[string]string) map[string]any {
		out := map[string]any{}
		for k, v := range p {
			out[k] = v
		}
		return out
	}
	tests := []struct {
		name   string
		values map[string]any
		want   instanceConfig
	}{
		{name: "readme example", values: readmeValues(), want: wantConfig(3, map[string]string{}, "app", "app")},
		{
			name:   "parameters with quotes, tabs and template syntax (line breaks are refused: TestCheckParameters)",
			values: readmeValues(withReplicas(2), set("postgresql.parameters", toValues(tricky))),
			want:   wantConfig(2, tricky, "app", "app"),
		},
		{
			name:   "bootstrap database and owner",
			values: readmeValues(set("bootstrap", map[string]any{"database": "orders", "owner": "shop"})),
			want:   wantConfig(3, map[string]string{}, "orders", "shop"),
		},
		{
			name:   "idle slot timeout",
			values: readmeValues(set("postgresql.idleSlotTimeout", "2h")),
			want: func() instanceConfig {
				c := wantConfig(3, map[string]string{}, "app", "app")
				c.IdleSlotTimeout = "2h0m0s"
				return c
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decodeConfig(t, render(t, tt.values))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config.json (-want +got):\n%s", diff)
			}
		})
	}
}

// decodeConfig decodes config.json of m's ConfigMap strictly into the agent's type, and
// checks that it is the ConfigMap's only key.
func decodeConfig(t *testing.T, m *manifest) instanceConfig {
	t.Helper()
	cm := decode[corev1.ConfigMap](t, m, "ConfigMap", dbv1.NamesOf(name).ConfigMap())
	if diff := cmp.Diff([]string{"config.json"}, keys(cm.Data)); diff != "" {
		t.Errorf("ConfigMap keys (-want +got):\n%s", diff)
	}
	decoder := json.NewDecoder(bytes.NewReader([]byte(cm.Data["config.json"])))
	decoder.DisallowUnknownFields()
	var got instanceConfig
	if err := decoder.Decode(&got); err != nil {
		t.Fatalf("config.json is not the agent's config: %v\n%s", err, cm.Data["config.json"])
	}
	return got
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestPodMonitor(t *testing.T) {
	wantSpec := map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{
			"db.example.com/cluster": name,
			"app.kubernetes.io/name": "postgresql",
		}},
		// TLS with the cluster's CA, and the metrics token (docs/security.md).
		"podMetricsEndpoints": []any{map[string]any{"port": "agent", "path": "/metrics", "scheme": "https",
			"bearerTokenSecret": map[string]any{"name": dbv1.NamesOf(name).MetricsTokenSecret(), "key": "token"},
			"tlsConfig": map[string]any{
				"serverName": dbv1.NamesOf(name).ReadWriteService() + "." + namespace + ".svc",
				"ca":         map[string]any{"secret": map[string]any{"name": dbv1.NamesOf(name).CASecret(), "key": "ca.crt"}},
			},
			"relabelings": []any{map[string]any{
				"sourceLabels": []any{"__meta_kubernetes_pod_label_db_example_com_cluster"}, "targetLabel": "cluster",
			}},
		}},
	}
	tests := []struct {
		name        string
		enabled     bool
		apiVersions []string
		want        bool
	}{
		{name: "enabled with the Prometheus Operator", enabled: true, apiVersions: []string{"monitoring.coreos.com/v1", podMonitorAPI}, want: true},
		{name: "enabled without the Prometheus Operator", enabled: true},
		{name: "disabled with the Prometheus Operator", apiVersions: []string{"monitoring.coreos.com/v1", podMonitorAPI}},
		{name: "disabled without the Prometheus Operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := renderWith(t, chart.Options{
				Name: name, Namespace: namespace, APIVersions: tt.apiVersions,
				Values: readmeValues(set("monitoring.enabled", tt.enabled)),
			})
			obj, got := m.find("PodMonitor", name)
			if got != tt.want {
				t.Fatalf("PodMonitor rendered = %v, want %v", got, tt.want)
			}
			if !got {
				return
			}
			if diff := cmp.Diff("monitoring.coreos.com/v1", obj.Raw["apiVersion"]); diff != "" {
				t.Errorf("PodMonitor apiVersion (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantSpec, obj.Raw["spec"]); diff != "" {
				t.Errorf("PodMonitor spec (-want +got):\n%s", diff)
			}
		})
	}
}

// The alert rules come with the PodMonitor, where the Prometheus Operator runs, and
// select only this cluster's instances.
func TestPrometheusRule(t *testing.T) {
	ruleAPI := "monitoring.coreos.com/v1/PrometheusRule"
	always := []string{"PgpilotPrimaryUnavailable", "PgpilotFailoverHappened", "PgpilotReplicationLagHigh", "PgpilotReplicaNotStreaming",
		"PgpilotWALArchiveFailing", "PgpilotWALArchivePendingGrowing", "PgpilotVolumeFillsUpSoon", "PgpilotVolumeAlmostFull",
		"PgpilotXIDWraparoundNear", "PgpilotXIDWraparoundImminent"}
	withSync := append(slices.Clone(always[:2]), append([]string{"PgpilotSynchronousStandbyMissing"}, always[2:]...)...)
	operator := []string{"monitoring.coreos.com/v1", podMonitorAPI, ruleAPI}
	for _, tt := range []struct {
		name        string
		enabled     bool
		apiVersions []string
		values      []valuesOption
		want        bool
		alerts      []string
	}{
		{name: "enabled with the Prometheus Operator", enabled: true, apiVersions: operator, want: true,
			alerts: append(slices.Clone(always), "PgpilotCustomQueryFailing")},
		{name: "synchronous replicas and a backup schedule", enabled: true, apiVersions: operator, want: true,
			values: []valuesOption{set("postgresql.synchronousReplicas", 1), set("backup.schedule", "0 3 * * *"), set("backup.store.volume.claimName", "b")},
			alerts: append(slices.Clone(withSync), "PgpilotBackupOverdue", "PgpilotCustomQueryFailing")},
		{name: "enabled without the Prometheus Operator", enabled: true},
		{name: "disabled with the Prometheus Operator", apiVersions: operator},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := renderWith(t, chart.Options{
				Name: name, Namespace: namespace, APIVersions: tt.apiVersions,
				Values: readmeValues(append(tt.values, set("monitoring.enabled", tt.enabled))...),
			})
			obj, got := m.find("PrometheusRule", name)
			if got != tt.want {
				t.Fatalf("PrometheusRule rendered = %v, want %v", got, tt.want)
			}
			if !got {
				return
			}
			groups := obj.Raw["spec"].(map[string]any)["groups"].([]any)
			var alerts []string
			for _, g := range groups {
				for _, r := range g.(map[string]any)["rules"].([]any) {
					rule := r.(map[string]any)
					alerts = append(alerts, rule["alert"].(string))
					checkRule(t, rule)
				}
			}
			if diff := cmp.Diff(tt.alerts, alerts); diff != "" {
				t.Errorf("alerts (-want +got):\n%s", diff)
			}
		})
	}
}

// checkRule checks that an alert selects only this cluster's series, names the cluster
// even when made by absent() or vector(), and that its annotations are Prometheus
// templates with a runbook.
func checkRule(t *testing.T, rule map[string]any) {
	t.Helper()
	want := fmt.Sprintf(`namespace=%q, cluster=%q`, namespace, name)
	if expr := rule["expr"].(string); !strings.Contains(expr, want) {
		t.Errorf("%s: expr %q does not select this cluster's series (%s)", rule["alert"], expr, want)
	}
	labels := rule["labels"].(map[string]any)
	if labels["namespace"] != namespace || labels["cluster"] != name || labels["severity"] == nil {
		t.Errorf("%s: labels %v, want namespace, cluster and severity", rule["alert"], labels)
	}
	annotations := rule["annotations"].(map[string]any)
	if rb, _ := annotations["runbook"].(string); !strings.HasPrefix(rb, "docs/monitoring.md#"+strings.ToLower(rule["alert"].(string))) &&
		!strings.HasPrefix(rule["alert"].(string), "PgpilotXIDWraparound") {
		t.Errorf("%s: runbook %q", rule["alert"], rb)
	}
	{
		{
			// Annotations are Prometheus's templates: they must parse, with its functions
			// and the variables it defines first.
			for key, text := range annotations {
				const prelude = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}"
				if _, err := template.New(key).Funcs(prometheusTemplateFuncs).Parse(prelude + text.(string)); err != nil {
					t.Errorf("%s: annotation %s is not a Prometheus template: %v", rule["alert"], key, err)
				}
			}
		}
	}
}

// prometheusTemplateFuncs are the functions of Prometheus's alert templates the chart
// uses, for parsing only.
var prometheusTemplateFuncs = template.FuncMap{
	"query": func(string) ([]any, error) { return nil, nil }, "first": func([]any) any { return nil },
	"value": func(any) float64 { return 0 }, "humanize1024": func(float64) string { return "" },
	"humanizeDuration": func(float64) string { return "" }, "humanize": func(float64) string { return "" },
	"humanizeTimestamp": func(float64) string { return "" },
}

func TestRole(t *testing.T) {
	rules := func(pods ...string) []rbacv1.PolicyRule {
		return []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{dbv1.NamesOf(name).PrimaryLease()}, Verbs: []string{"get", "watch", "update"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: pods, Verbs: []string{"get"}},
		}
	}
	tests := []struct {
		name     string
		replicas int
		want     []rbacv1.PolicyRule
	}{
		{name: "one instance", replicas: 1, want: rules("my-db-0")},
		{name: "three instances", replicas: 3, want: rules("my-db-0", "my-db-1", "my-db-2")},
		{name: "five instances", replicas: 5, want: rules("my-db-0", "my-db-1", "my-db-2", "my-db-3", "my-db-4")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			role := decode[rbacv1.Role](t, render(t, readmeValues(withReplicas(tt.replicas))), "Role", name+"-instance")
			if diff := cmp.Diff(tt.want, role.Rules); diff != "" {
				t.Errorf("Role rules (-want +got):\n%s", diff)
			}
		})
	}
}

// existingStatefulSet is the StatefulSet of cluster my-db as the API server holds it.
func existingStatefulSet(ns, size string, storageClassName *string) *appsv1.StatefulSet {
	sts := wantStatefulSet()
	sts.Namespace = ns
	sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(size)
	sts.Spec.VolumeClaimTemplates[0].Spec.StorageClassName = storageClassName
	sts.Spec.VolumeClaimTemplates[0].Spec.VolumeMode = ptr.To(corev1.PersistentVolumeFilesystem)
	return sts
}

func TestVolumeClaimTemplate(t *testing.T) {
	type claim struct {
		Size             string
		StorageClassName *string
		AccessModes      []corev1.PersistentVolumeAccessMode
	}
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	tests := []struct {
		name     string
		values   map[string]any
		existing []runtime.Object
		want     claim
	}{
		{
			name:   "new cluster takes the default size and class",
			values: readmeValues(),
			want:   claim{Size: "1Gi", AccessModes: rwo},
		},
		{
			name:   "new cluster takes size and class from the values",
			values: readmeValues(set("storage", map[string]any{"size": "20Gi", "storageClassName": "fast"})),
			want:   claim{Size: "20Gi", StorageClassName: ptr.To("fast"), AccessModes: rwo},
		},
		{
			name:     "existing cluster keeps its size when the values grow it",
			values:   readmeValues(set("storage.size", "50Gi")),
			existing: []runtime.Object{existingStatefulSet(namespace, "5Gi", nil)},
			want:     claim{Size: "5Gi", AccessModes: rwo},
		},
		{
			name:     "existing cluster keeps its size and class",
			values:   readmeValues(set("storage", map[string]any{"size": "50Gi", "storageClassName": "fast"})),
			existing: []runtime.Object{existingStatefulSet(namespace, "5Gi", ptr.To("fast"))},
			want:     claim{Size: "5Gi", StorageClassName: ptr.To("fast"), AccessModes: rwo},
		},
		{
			name:     "existing cluster without a class gets none",
			values:   readmeValues(set("storage.storageClassName", "slow")),
			existing: []runtime.Object{existingStatefulSet(namespace, "1Gi", nil)},
			want:     claim{Size: "1Gi", AccessModes: rwo},
		},
		{
			name:     "a StatefulSet of the same name in another namespace is not this cluster's",
			values:   readmeValues(set("storage.size", "50Gi")),
			existing: []runtime.Object{existingStatefulSet("elsewhere", "5Gi", nil)},
			want:     claim{Size: "50Gi", AccessModes: rwo},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := renderOptions(tt.values)
			opts.Observed = existing(tt.existing...)
			sts := decode[appsv1.StatefulSet](t, renderWith(t, opts), "StatefulSet", name)
			if len(sts.Spec.VolumeClaimTemplates) != 1 {
				t.Fatalf("volumeClaimTemplates = %d, want 1", len(sts.Spec.VolumeClaimTemplates))
			}
			vct := sts.Spec.VolumeClaimTemplates[0]
			if vct.Name != "data" {
				t.Errorf("volume claim template name = %q, want data", vct.Name)
			}
			size := vct.Spec.Resources.Requests[corev1.ResourceStorage]
			got := claim{Size: size.String(), StorageClassName: vct.Spec.StorageClassName, AccessModes: vct.Spec.AccessModes}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("volume claim template (-want +got):\n%s", diff)
			}
		})
	}
}

func TestScheduling(t *testing.T) {
	userAffinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpIn, Values: []string{"ssd"}}},
		}}},
	}}
	type scheduling struct {
		Affinity     *corev1.Affinity
		Tolerations  []corev1.Toleration
		NodeSelector map[string]string
		Resources    corev1.ResourceRequirements
	}
	tests := []struct {
		name   string
		values map[string]any
		want   scheduling
	}{
		{
			name:   "defaults: instances prefer different nodes",
			values: readmeValues(),
			want:   scheduling{Affinity: defaultAffinity()},
		},
		{
			name: "user affinity replaces the default",
			values: readmeValues(set("affinity", map[string]any{"nodeAffinity": map[string]any{
				"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
					map[string]any{"matchExpressions": []any{map[string]any{"key": "disk", "operator": "In", "values": []any{"ssd"}}}},
				}},
			}})),
			want: scheduling{Affinity: userAffinity},
		},
		{
			name: "tolerations, nodeSelector and resources",
			values: readmeValues(
				set("tolerations", []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}}),
				set("nodeSelector", map[string]any{"kubernetes.io/arch": "amd64"}),
				set("resources", map[string]any{
					"requests": map[string]any{"cpu": "500m", "memory": "1Gi"},
					"limits":   map[string]any{"memory": "1Gi"},
				}),
			),
			want: scheduling{
				Affinity:     defaultAffinity(),
				Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "db", Effect: corev1.TaintEffectNoSchedule}},
				NodeSelector: map[string]string{"kubernetes.io/arch": "amd64"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := render(t, tt.values)
			pod := decode[appsv1.StatefulSet](t, m, "StatefulSet", name).Spec.Template.Spec
			got := scheduling{
				Affinity:     pod.Affinity,
				Tolerations:  pod.Tolerations,
				NodeSelector: pod.NodeSelector,
				Resources:    pod.Containers[0].Resources,
			}
			if diff := cmp.Diff(tt.want, got, quantity); diff != "" {
				t.Errorf("scheduling (-want +got):\n%s", diff)
			}
			// Empty values are left out, not rendered as empty or null fields.
			obj, _ := m.find("StatefulSet", name)
			podSpec := dig(obj.Raw, "spec", "template", "spec")
			postgres := dig(podSpec, "containers", 0)
			absent := map[string]bool{
				"tolerations":  tt.want.Tolerations == nil && hasKey(podSpec, "tolerations"),
				"nodeSelector": tt.want.NodeSelector == nil && hasKey(podSpec, "nodeSelector"),
				"resources":    tt.want.Resources.Requests == nil && tt.want.Resources.Limits == nil && hasKey(postgres, "resources"),
			}
			for field, rendered := range absent {
				if rendered {
					t.Errorf("%s is rendered for an empty value", field)
				}
			}
		})
	}
}

// dig walks raw YAML by map keys and list indexes; nil when the path does not exist.
func dig(v any, path ...any) any {
	for _, step := range path {
		switch step := step.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[step]
		case int:
			l, _ := v.([]any)
			if step >= len(l) {
				return nil
			}
			v = l[step]
		}
	}
	return v
}

func hasKey(v any, key string) bool {
	m, _ := v.(map[string]any)
	_, ok := m[key]
	return ok
}

func TestLabels(t *testing.T) {
	m := renderWith(t, chart.Options{
		Name: name, Namespace: namespace, APIVersions: []string{"monitoring.coreos.com/v1", podMonitorAPI},
		Values: readmeValues(set("monitoring.enabled", true)),
	})
	cached := helmmanager.CacheOptions().DefaultLabelSelector
	for _, obj := range m.Objects {
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(obj.YAML), &meta); err != nil {
			t.Fatal(err)
		}
		want := objectLabels(name)
		if obj.Kind == "ConfigMap" && obj.Name == name+"-dashboard" {
			want["grafana_dashboard"] = "1" // what Grafana's dashboard sidecar looks for
		}
		if diff := cmp.Diff(want, meta.Metadata.Labels); diff != "" {
			t.Errorf("%s/%s labels (-want +got):\n%s", obj.Kind, obj.Name, diff)
		}
		if !cached.Matches(labels.Set(meta.Metadata.Labels)) {
			t.Errorf("%s/%s is outside the Helm manager's cache (%s): its drift would go unnoticed", obj.Kind, obj.Name, cached)
		}
		if meta.Metadata.Namespace != namespace {
			t.Errorf("%s/%s namespace = %q, want %q", obj.Kind, obj.Name, meta.Metadata.Namespace, namespace)
		}
	}
	sts := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
	if diff := cmp.Diff(commonLabels(name), sts.Spec.Template.Labels); diff != "" {
		t.Errorf("pod labels (-want +got); the role label is the controller's:\n%s", diff)
	}
	if diff := cmp.Diff(commonLabels(name), sts.Spec.VolumeClaimTemplates[0].Labels); diff != "" {
		t.Errorf("volume labels (-want +got):\n%s", diff)
	}
}

// TestRenderIsStable: the operator compares a dry-run render with the deployed release, so
// the same values must always render the same manifest.
func TestRenderIsStable(t *testing.T) {
	values := func() map[string]any {
		return readmeValues(set("postgresql.parameters", map[string]any{"a": "1", "b": "2", "c": "3", "max_connections": "200"}))
	}
	first := render(t, values()).Text
	for i := 0; i < 5; i++ {
		if diff := cmp.Diff(first, render(t, values()).Text); diff != "" {
			t.Fatalf("render %d differs from the first (-first +now):\n%s", i+2, diff)
		}
	}
}

// During a major version upgrade the pods run the new major's image, with an init
// container of the data's image that carries its programs into the agent's volume,
// under the restricted profile like the rest of the pod.
func TestUpgradeCarriesTheOldMajor(t *testing.T) {
	opts := renderOptions(readmeValues(withVersion("17"), set("operator.postgresImages.15", "mirror.example.com/postgres:15.15")))
	opts.Observed = plan.Observed{Report: &corev1.ConfigMap{Data: map[string]string{"dataVersion": "15"}}}
	sts := decode[appsv1.StatefulSet](t, renderWith(t, opts), "StatefulSet", name)
	spec := sts.Spec.Template.Spec
	if got := spec.Containers[0].Image; got != "postgres:17.7" {
		t.Errorf("postgres image %q, want the new major's", got)
	}
	var carry *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == plan.CarryContainer {
			carry = &spec.InitContainers[i]
		}
	}
	if carry == nil || carry.Image != "mirror.example.com/postgres:15.15" ||
		!slices.Equal(carry.Command, []string{"/pgpilot/agent", "carry", "/pgpilot/carried"}) || len(carry.VolumeMounts) != 1 || carry.VolumeMounts[0].MountPath != "/pgpilot" {
		t.Fatalf("carry init container %+v", carry)
	}
	if spec.InitContainers[0].Name != "install-agent" {
		t.Errorf("the agent is not installed before it carries: %s first", spec.InitContainers[0].Name)
	}
	if got := restrictedViolations(spec); len(got) > 0 {
		t.Errorf("the upgrading pod breaks the restricted profile:\n%s", strings.Join(got, "\n"))
	}
	// Once the data is 17, no carrying.
	opts.Observed.Report.Data["dataVersion"] = "17"
	sts = decode[appsv1.StatefulSet](t, renderWith(t, opts), "StatefulSet", name)
	if n := len(sts.Spec.Template.Spec.InitContainers); n != 1 {
		t.Errorf("%d init containers once the data is 17", n)
	}
}
