// Package plan makes the decisions the postgrescluster chart cannot make in a template:
// the names of a cluster's objects, the PostgreSQL image, the config.json its agents
// read, the backup and restore stores its pods mount, and the volume claim template an
// existing StatefulSet keeps. The Helm reconciler makes a plan through
// helm-operator-plugins' value translator (Translator) and hands it to the chart as
// .Values.plan; the templates only render it.
//
// Making a plan is split in two: Observe reads what already exists in the cluster's
// namespace, Decide is a pure function of the values and what was observed.
package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

// Plan is what the chart renders besides the values: .Values.plan.
type Plan struct {
	Names Names `json:"names"`
	// Replicas is how many pods the StatefulSet runs: spec.replicas, unless fewer would
	// remove the primary before it handed over (Replicas); none once a stopped cluster's
	// primary has stopped (Stopped). Names.Instances and Config keep the instances
	// while they are stopped.
	Replicas int `json:"replicas"`
	// Image is the PostgreSQL container's image; AgentImage the operator's, which holds the
	// agent the init container copies into the pod.
	Image      string `json:"image"`
	AgentImage string `json:"agentImage"`
	// Config is config.json, what every agent of the cluster reads.
	Config clusterconfig.Config `json:"config"`
	// Volumes and VolumeMounts are the backup and restore stores the postgres container
	// mounts, after the volumes every instance has.
	Volumes      []corev1.Volume      `json:"volumes"`
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
	// Storage is the StatefulSet's volume claim template.
	Storage Storage `json:"storage"`
	// NetworkPolicy is who may connect to the instances; nil renders no NetworkPolicy.
	NetworkPolicy *NetworkPolicy `json:"networkPolicy,omitempty"`
	// PodAnnotations go on the pod template: a change restarts every instance, in the
	// rolling update's order.
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`
	// Upgrade is a major version upgrade under way: the data is older than
	// spec.version. Nil otherwise.
	Upgrade *Upgrade `json:"upgrade,omitempty"`
	// Pooler is spec.pooler's PgBouncer pods; nil without one.
	Pooler *Pooler `json:"pooler,omitempty"`
	// Verify is spec.backup.verify's CronJob; nil without it.
	Verify *Verify `json:"verify,omitempty"`
}

// Upgrade is what the pods need while their data is an older major than their image
// (docs/operations.md, "Major version upgrades"): an init container of the data's
// image carries its PostgreSQL programs into the pod, so that the agent runs the data
// on them until its primary runs pg_upgrade with both. It stays after the upgrade
// until the image changes (keptCarry), with From empty.
type Upgrade struct {
	// From is the data's major version ("" once upgraded); To is spec.version.
	From string `json:"from"`
	To   string `json:"to"`
	// CarryImage is an image of the From major: the one the pods ran it with.
	CarryImage string `json:"carryImage"`
}

// Names are the names of the cluster's objects, from dbv1.Names.
type Names struct {
	Cluster           string `json:"cluster"`
	StatefulSet       string `json:"statefulSet"`
	ConfigMap         string `json:"configMap"`
	PrimaryLease      string `json:"primaryLease"`
	ReadWriteService  string `json:"readWriteService"`
	ReadOnlyService   string `json:"readOnlyService"`
	ReadService       string `json:"readService"`
	HeadlessService   string `json:"headlessService"`
	SuperuserSecret   string `json:"superuserSecret"`
	ReplicationSecret string `json:"replicationSecret"`
	AppSecret         string `json:"appSecret"`
	AgentTokenSecret  string `json:"agentTokenSecret"`
	// ServerTLSSecret is the certificate PostgreSQL serves: spec.tls.serverSecretName,
	// or the one the operator issues.
	ServerTLSSecret      string `json:"serverTLSSecret"`
	ReplicationTLSSecret string `json:"replicationTLSSecret"`
	// SourceTLSSecret is the operator's copy of a replica cluster's source certificate
	// (spec.replica.source.replicationSecretName), which every pod mounts optionally: a
	// demotion then restarts no pod.
	SourceTLSSecret string `json:"sourceTLSSecret"`
	// InstanceTLSSecret is the certificate the operator issues, which the agent API
	// serves whatever PostgreSQL does.
	InstanceTLSSecret string `json:"instanceTLSSecret"`
	// AgentAuthSecret holds the agent API's credentials the pods mount;
	// MetricsTokenSecret the token Prometheus scrapes with; CASecret the CA that
	// verifies the agent API's certificate.
	AgentAuthSecret    string `json:"agentAuthSecret"`
	MetricsTokenSecret string `json:"metricsTokenSecret"`
	CASecret           string `json:"caSecret"`
	ServiceAccount     string `json:"serviceAccount"`
	NetworkPolicy      string `json:"networkPolicy"`
	DisruptionBudget   string `json:"disruptionBudget"`
	// Instances are the pod names of the plan's replicas, by ordinal.
	Instances []string `json:"instances"`
}

// Storage is the size and class of each instance's data volume.
type Storage struct {
	Size string `json:"size"`
	// StorageClassName is empty for the cluster's default class.
	StorageClassName string `json:"storageClassName,omitempty"`
}

// Values are the chart's values as the Helm reconciler passes them: the PostgresCluster's
// spec coalesced with values.yaml, and the operator block of watches.yaml.
type Values struct {
	dbv1.PostgresClusterSpec
	Operator Operator `json:"operator"`
}

// Operator is what the operator adds to the values through watches.yaml overrideValues,
// from its RELATED_IMAGE_* environment and its pod's namespace.
type Operator struct {
	// Namespace is the operator's namespace (POD_NAMESPACE); empty when it runs outside
	// a pod.
	Namespace  string `json:"namespace"`
	AgentImage string `json:"agentImage"`
	// PoolerImage is PgBouncer's (RELATED_IMAGE_PGBOUNCER), for spec.pooler.
	PoolerImage string `json:"poolerImage"`
	// PostgresImages are the operator's images by major version; DefaultPostgresImages
	// the chart's, used where the operator has none.
	PostgresImages        map[string]string `json:"postgresImages"`
	DefaultPostgresImages map[string]string `json:"defaultPostgresImages"`
}

// Cluster is the PostgresCluster a plan is made for.
type Cluster struct {
	Name, Namespace string
	// RestartedAt is the cluster's dbv1.AnnotationRestartedAt, "" when none.
	RestartedAt string
}

// Observed is what a plan depends on besides the values: objects already in the
// cluster's namespace. The zero value is a cluster that was never deployed.
type Observed struct {
	// ConfigMap is the deployed config.json's ConfigMap.
	ConfigMap *corev1.ConfigMap
	// StatefulSet is the deployed StatefulSet.
	StatefulSet *appsv1.StatefulSet
	// Backup is the PostgresBackup bootstrap.fromBackup.backupName names, when it
	// exists and the ConfigMap holds no restore yet.
	Backup *dbv1.PostgresBackup
	// PrimaryLease is the cluster's primary Lease: who the primary is.
	PrimaryLease *coordinationv1.Lease
	// Report is the cluster's report: the major version of its data.
	Report *corev1.ConfigMap
}

// Decide makes the plan of cluster from its values and what exists. An error is a spec
// the chart cannot render, said so that the user knows what to change.
func Decide(cluster Cluster, v Values, observed Observed) (*Plan, error) {
	if err := v.PostgreSQL.CheckParameters(); err != nil {
		return nil, err
	}
	if err := checkResources(v.Resources); err != nil {
		return nil, err
	}
	if err := tuning.Check(resourcesOf(v.Resources), v.PostgreSQL.Parameters); err != nil {
		return nil, err
	}
	if v.Version == "" {
		return nil, fmt.Errorf(`version is required: the PostgreSQL major version, e.g. "16"`)
	}
	from, err := checkVersion(v.Version, observed)
	if err != nil {
		return nil, err
	}
	image, err := postgresImage(v)
	if err != nil {
		return nil, err
	}
	var upgrade *Upgrade
	if from != "" {
		upgrade = &Upgrade{From: from, To: v.Version, CarryImage: carryImage(v, from, observed.StatefulSet)}
		if upgrade.CarryImage == "" {
			return nil, fmt.Errorf("spec.version %s needs the PostgreSQL %s programs to upgrade the data: the operator has no image for %s (RELATED_IMAGE_POSTGRES_%s, docs/install.md)", v.Version, from, from, from)
		}
	} else {
		upgrade = keptCarry(v.Version, image, observed.StatefulSet)
	}
	if v.Operator.AgentImage == "" {
		return nil, fmt.Errorf("operator.agentImage is required: the operator sets it from RELATED_IMAGE_AGENT")
	}
	instances := Replicas(cluster, int(v.Replicas), observed)
	replicas := instances
	if Stopped(v, observed) {
		replicas = 0
	}
	p := &Plan{
		Names:        namesOf(cluster.Name, instances, v.TLS),
		Replicas:     replicas,
		Image:        image,
		AgentImage:   v.Operator.AgentImage,
		Config:       clusterConfig(cluster.Name, v, instances),
		Volumes:      []corev1.Volume{},
		VolumeMounts: []corev1.VolumeMount{},
		Storage:      storage(v.Storage, observed.StatefulSet),
		Upgrade:      upgrade,
	}
	p.NetworkPolicy = networkPolicy(v)
	backupClaim := ""
	if b := v.Backup; b != nil {
		store, err := mountStore(p, b.Store, "backup.store", cluster.Name, backupRole, false)
		if err != nil {
			return nil, err
		}
		p.Config.Backup = &clusterconfig.Backup{Store: store, Compression: b.Compression}
		planVerify(p, cluster.Name, b)
		if b.Store.Volume != nil {
			backupClaim = b.Store.Volume.ClaimName
		}
	}
	if r := v.Replica; r != nil {
		if v.Bootstrap.FromBackup != nil && observed.StatefulSet == nil {
			return nil, fmt.Errorf("replica and bootstrap.fromBackup cannot both be set on a new cluster: a replica cluster clones its source; remove one of them")
		}
		planReplica(p, *r)
	}
	if from := v.Bootstrap.FromBackup; from != nil {
		if err := planRestore(p, cluster, from, backupClaim, observed); err != nil {
			return nil, err
		}
	}
	mountCustomQueries(p, v.Monitoring.CustomQueries)
	if err := planPooler(p, cluster.Name, v); err != nil {
		return nil, err
	}
	if cluster.RestartedAt != "" {
		p.PodAnnotations = map[string]string{dbv1.AnnotationRestartedAt: cluster.RestartedAt}
	}
	return p, nil
}

func namesOf(cluster string, replicas int, tls dbv1.TLSSpec) Names {
	n := dbv1.NamesOf(cluster)
	instances := make([]string, replicas)
	for i := range instances {
		instances[i] = n.Instance(i)
	}
	return Names{
		Cluster:              n.Cluster,
		StatefulSet:          n.StatefulSet(),
		ConfigMap:            n.ConfigMap(),
		PrimaryLease:         n.PrimaryLease(),
		ReadWriteService:     n.ReadWriteService(),
		ReadOnlyService:      n.ReadOnlyService(),
		ReadService:          n.ReadService(),
		HeadlessService:      n.HeadlessService(),
		SuperuserSecret:      n.SuperuserSecret(),
		ReplicationSecret:    n.ReplicationSecret(),
		AppSecret:            n.AppSecret(),
		AgentTokenSecret:     n.AgentTokenSecret(),
		ServerTLSSecret:      orDefault(tls.ServerSecretName, n.ServerTLSSecret()),
		ReplicationTLSSecret: n.ReplicationTLSSecret(),
		SourceTLSSecret:      n.SourceTLSSecret(),
		InstanceTLSSecret:    n.ServerTLSSecret(),
		AgentAuthSecret:      n.AgentAuthSecret(),
		MetricsTokenSecret:   n.MetricsTokenSecret(),
		CASecret:             n.CASecret(),
		ServiceAccount:       n.InstanceServiceAccount(),
		NetworkPolicy:        n.NetworkPolicy(),
		DisruptionBudget:     n.DisruptionBudget(),
		Instances:            instances,
	}
}

// Replicas is how many instances cluster has when the spec asks for want: want, but
// never so few that the StatefulSet would delete the primary's pod (the highest
// ordinals go first). A scale-down that would remove the primary waits here, at the
// instances that run, until the controller has switched over to an instance that stays
// (failover.ScaleDownTarget); so does any scale-down while no instance holds the
// primary Lease (a failover under way), or before the Lease can be read. A cluster
// that was stopped (a StatefulSet of none) resumes with its primary among them
// whatever want says: the primary keeps its role through a hibernation.
func Replicas(cluster Cluster, want int, observed Observed) int {
	sts := observed.StatefulSet
	if sts == nil || sts.Spec.Replicas == nil {
		return want
	}
	running := int(*sts.Spec.Replicas)
	if want >= running && running > 0 {
		return want
	}
	keep, known := holderOrdinal(cluster, observed)
	switch {
	case running == 0 && known:
		return max(want, keep+1)
	case running == 0:
		return want
	case !known:
		return running
	}
	return min(running, max(want, keep+1))
}

// holderOrdinal is the ordinal of the instance the primary Lease names, when it names
// one of cluster's.
func holderOrdinal(cluster Cluster, observed Observed) (int, bool) {
	if observed.PrimaryLease == nil {
		return 0, false
	}
	holder := primarylease.Parse(observed.PrimaryLease).Holder
	return dbv1.NamesOf(cluster.Name).Ordinal(holder)
}

// Stopped reports whether the StatefulSet runs no pod: spec.stopped, and the failover
// controller recorded on the Lease that the primary stopped and the standbys have its
// final WAL (docs/operations.md, "Hibernation"). Until then the pods stay, so that the
// primary stops first and alone.
func Stopped(v Values, observed Observed) bool {
	if !v.Stopped || observed.PrimaryLease == nil {
		return false
	}
	r := primarylease.Parse(observed.PrimaryLease)
	return r.Hibernation.Holds(r.Holder, r.Term) && r.Hibernation.Phase == primarylease.Stopped
}

// checkVersion refuses a spec.version older than the major version of the cluster's
// data, as the cluster's report records it: PostgreSQL cannot downgrade data. A newer
// one is an upgrade from the data's major, which it returns ("" when there is none).
// The CRD refuses a downgrade already; this holds a cluster whose CRD or status
// predates the rule.
func checkVersion(version string, observed Observed) (string, error) {
	data := report.Parse(observed.Report).DataVersion
	if data == "" || data == version {
		return "", nil
	}
	want, err1 := strconv.Atoi(version)
	have, err2 := strconv.Atoi(data)
	if err1 != nil || err2 != nil {
		return "", fmt.Errorf("spec.version %q or the data's version %q is not a major version number", version, data)
	}
	if want < have {
		return "", fmt.Errorf("spec.version %s cannot be applied: the cluster's data is PostgreSQL %s, and PostgreSQL cannot move data to an older major; set spec.version back to %q (no instance was changed)", version, data, data)
	}
	return data, nil
}

// carryImage is an image of the data's major, from, for an upgrade: the one the
// StatefulSet carries it with already, or runs it with (the image before the upgrade
// began, which may be the user's spec.image), else the operator's for that major.
func carryImage(v Values, from string, sts *appsv1.StatefulSet) string {
	if sts != nil {
		spec := sts.Spec.Template.Spec
		for _, c := range spec.InitContainers {
			if c.Name == CarryContainer {
				return c.Image
			}
		}
		for _, c := range spec.Containers {
			if c.Name == "postgres" && c.Image != "" && !sameMajorImage(v, c.Image) {
				return c.Image
			}
		}
	}
	for _, image := range []string{v.Operator.PostgresImages[from], v.Operator.DefaultPostgresImages[from]} {
		if image != "" {
			return image
		}
	}
	return ""
}

// keptCarry keeps an upgrade's carry-postgres init container once the upgrade is over,
// for as long as the pods run the same image: dropping it would restart every pod (and
// switch over) only to remove a copy nothing uses any more, in the middle of the
// statistics rebuild and the standbys' clones. The next change of the image drops it.
func keptCarry(version, image string, sts *appsv1.StatefulSet) *Upgrade {
	if sts == nil {
		return nil
	}
	spec := sts.Spec.Template.Spec
	running := ""
	for _, c := range spec.Containers {
		if c.Name == "postgres" {
			running = c.Image
		}
	}
	if running != image {
		return nil
	}
	for _, c := range spec.InitContainers {
		if c.Name == CarryContainer {
			return &Upgrade{To: version, CarryImage: c.Image}
		}
	}
	return nil
}

// sameMajorImage reports whether image is the one spec.version selects: a StatefulSet
// already rolled to the new image says nothing of the old one.
func sameMajorImage(v Values, image string) bool {
	want, err := postgresImage(v)
	return err == nil && want == image
}

// CarryContainer is the init container that carries the data's PostgreSQL programs
// into the pod during an upgrade (`agent carry`).
const CarryContainer = "carry-postgres"

// postgresImage is the first of spec.image, the operator's image for the version and the
// chart's default for it.
func postgresImage(v Values) (string, error) {
	for _, image := range []string{v.Image, v.Operator.PostgresImages[v.Version], v.Operator.DefaultPostgresImages[v.Version]} {
		if image != "" {
			return image, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL image for version %q: set spec.image, or give the operator RELATED_IMAGE_POSTGRES_%s", v.Version, v.Version)
}

func clusterConfig(cluster string, v Values, replicas int) clusterconfig.Config {
	n := dbv1.NamesOf(cluster)
	c := clusterconfig.Config{
		ClusterName:            cluster,
		Version:                v.Version,
		Replicas:               replicas,
		Parameters:             v.PostgreSQL.Parameters,
		SynchronousReplicas:    int(v.PostgreSQL.SynchronousReplicas),
		IdleSlotTimeout:        clusterconfig.DefaultIdleSlotTimeout.String(),
		MaxReadLag:             clusterconfig.DefaultMaxReadLag.String(),
		Bootstrap:              clusterconfig.Bootstrap{Database: v.Bootstrap.Database, Owner: v.Bootstrap.Owner},
		PrimaryLease:           n.PrimaryLease(),
		SuperuserNetworkAccess: v.PostgreSQL.SuperuserNetworkAccess,
		AllowUnsafeDurability:  v.PostgreSQL.AllowUnsafeDurability,
	}
	if b := v.PostgreSQL.LossBudget; b != nil && v.PostgreSQL.SynchronousReplicas == 0 && replicas > 1 {
		bytes := max(b.Value(), 0)
		c.LossBudget = &bytes
	}
	if c.Parameters == nil {
		c.Parameters = map[string]string{}
	}
	if t := v.PostgreSQL.IdleSlotTimeout; t != nil {
		c.IdleSlotTimeout = t.Duration.String()
	}
	if t := v.PostgreSQL.MaxReadLag; t != nil && t.Duration > 0 {
		c.MaxReadLag = t.Duration.String()
	}
	c.Resources = resourcesOf(v.Resources)
	c.Services.ReadWrite = n.ReadWriteService()
	c.Services.Headless = n.HeadlessService()
	c.Upgrade = clusterconfig.Upgrade{BackupMaxAge: clusterconfig.DefaultUpgradeBackupMaxAge.String(), WithoutBackup: v.Upgrade.WithoutBackup}
	if a := v.Upgrade.BackupMaxAge; a != nil && a.Duration > 0 {
		c.Upgrade.BackupMaxAge = a.Duration.String()
	}
	return c
}

// storage is the volume claim template: the spec's for a new StatefulSet; an existing
// one keeps the size and class it was created with, as the template is immutable and a
// Helm upgrade would fail on it. Volumes grow by resizing each claim, not the template.
func storage(spec dbv1.StorageSpec, existing *appsv1.StatefulSet) Storage {
	var s Storage
	if spec.Size != nil {
		s.Size = spec.Size.String()
	}
	if spec.StorageClassName != nil {
		s.StorageClassName = *spec.StorageClassName
	}
	if existing == nil {
		return s
	}
	for _, claim := range existing.Spec.VolumeClaimTemplates {
		if claim.Name != dataVolume {
			continue
		}
		if size, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			s.Size = size.String()
		}
		s.StorageClassName = ptr.Deref(claim.Spec.StorageClassName, "")
	}
	return s
}

// dataVolume is the StatefulSet's volume claim template (dbv1.Names.VolumeClaim).
const dataVolume = "data"

// What a store is mounted for: it names its volumes and where they are mounted.
const (
	backupRole  = "backup"
	restoreRole = "restore"
)

// mountStore adds the volumes store needs to p, mounted for role, and returns where the
// agent finds it. field names the store in errors; cluster is the cluster whose
// directory in the store is used. A shared store is a volume already mounted as the
// backup store (a restore from the claim the backups go to).
func mountStore(p *Plan, store dbv1.BackupStore, field, cluster, role string, shared bool) (clusterconfig.Store, error) {
	config := clusterconfig.Store{Prefix: path.Join(store.Path, cluster)}
	switch {
	case store.S3 != nil && store.Volume == nil:
		s3, err := mountS3(p, *store.S3, field, role)
		if err != nil {
			return config, err
		}
		config.S3 = s3
	case store.Volume != nil && store.S3 == nil:
		if store.Volume.ClaimName == "" {
			return config, fmt.Errorf("%s.volume.claimName is required", field)
		}
		if shared {
			config.Directory = storeDirectory(backupRole)
			return config, nil
		}
		config.Directory = storeDirectory(role)
		name := role + "-store"
		p.Volumes = append(p.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: store.Volume.ClaimName},
		}})
		// Backups write to their store; a restore only reads the source's.
		p.VolumeMounts = append(p.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: config.Directory, ReadOnly: role == restoreRole})
	default:
		return config, fmt.Errorf("%s needs exactly one of volume or s3", field)
	}
	return config, nil
}

// planReplica makes the cluster follow spec.replica's source: the agents find it in
// config.json.
func planReplica(p *Plan, r dbv1.ReplicaSpec) {
	port := int(r.Source.Port)
	if port == 0 {
		port = 5432
	}
	p.Config.Replica = &clusterconfig.Replica{Enabled: r.Enabled, Host: r.Source.Host, Port: port, PromotionToken: r.PromotionToken}
}

func storeDirectory(role string) string { return "/var/lib/pgpilot/" + role }

// mountS3 mounts the keys of an S3 store's Secrets as the files the agent reads: the
// pod names the Secrets, the plan never reads them.
func mountS3(p *Plan, s3 dbv1.S3Store, field, role string) (*clusterconfig.S3Store, error) {
	switch {
	case s3.Endpoint == "":
		return nil, fmt.Errorf("%s.s3.endpoint is required", field)
	case s3.Bucket == "":
		return nil, fmt.Errorf("%s.s3.bucket is required", field)
	case s3.Credentials.SecretName == "":
		return nil, fmt.Errorf("%s.s3.credentials.secretName is required", field)
	}
	config := &clusterconfig.S3Store{
		Endpoint:       s3.Endpoint,
		Bucket:         s3.Bucket,
		Region:         s3.Region,
		CredentialsDir: "/etc/pgpilot/" + role + "-credentials",
	}
	mountSecret(p, role+"-credentials", config.CredentialsDir, s3.Credentials.SecretName,
		corev1.KeyToPath{Key: orDefault(s3.Credentials.AccessKeyIDKey, "AWS_ACCESS_KEY_ID"), Path: "ACCESS_KEY_ID"},
		corev1.KeyToPath{Key: orDefault(s3.Credentials.SecretAccessKeyKey, "AWS_SECRET_ACCESS_KEY"), Path: "SECRET_ACCESS_KEY"})
	if s3.TLS == nil {
		return config, nil
	}
	config.InsecureSkipVerify = s3.TLS.InsecureSkipVerify
	if ca := s3.TLS.CASecret; ca != nil {
		if ca.Name == "" {
			return nil, fmt.Errorf("%s.s3.tls.caSecret.name is required", field)
		}
		dir := "/etc/pgpilot/" + role + "-ca"
		config.CAFile = dir + "/ca.crt"
		mountSecret(p, role+"-ca", dir, ca.Name, corev1.KeyToPath{Key: orDefault(ca.Key, "ca.crt"), Path: "ca.crt"})
	}
	return config, nil
}

// secretMode lets the postgres user (the pod's fsGroup) read a mounted Secret, no one
// else.
const secretMode int32 = 0o440

func mountSecret(p *Plan, name, dir, secret string, items ...corev1.KeyToPath) {
	p.Volumes = append(p.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: secret, Items: items, DefaultMode: ptr.To(secretMode)},
	}})
	p.VolumeMounts = append(p.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: dir, ReadOnly: true})
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// planRestore adds the restore of spec.bootstrap.fromBackup to p.
//
// fromBackup only matters when the cluster is created, but the plan is made again on
// every reconcile. A restore from backupName is resolved once: a cluster already
// deployed with it keeps what it was deployed with (the ConfigMap's restore block and
// the StatefulSet's restore volumes), so the PostgresBackup may be deleted or change
// afterwards. fromBackup.store cannot change: it is always planned from the values.
func planRestore(p *Plan, cluster Cluster, from *dbv1.FromBackup, backupClaim string, observed Observed) error {
	if from.BackupName != "" {
		if restore := deployedRestore(observed.ConfigMap); restore != nil {
			p.Config.Restore = restore
			keepRestoreVolumes(p, observed.StatefulSet)
			return nil
		}
	}
	source, err := restoreSource(cluster, from, observed.Backup)
	if err != nil {
		return err
	}
	// A restore from the claim the backups go to reads it where the backups mount it.
	shared := backupClaim != "" && source.store.Volume != nil && source.store.Volume.ClaimName == backupClaim
	store, err := mountStore(p, source.store, source.field, source.clusterName, restoreRole, shared)
	if err != nil {
		return err
	}
	restore := &clusterconfig.Restore{Store: store, BackupID: source.backupID, TargetLSN: from.TargetLSN}
	if from.TargetTime != nil {
		restore.TargetTime = from.TargetTime.UTC().Format(time.RFC3339)
	}
	p.Config.Restore = restore
	return nil
}

// deployedRestore is the restore block of the deployed config.json, nil when there is
// none (the cluster's first render resolves the PostgresBackup).
func deployedRestore(cm *corev1.ConfigMap) *clusterconfig.Restore {
	if cm == nil || cm.Data[configFile] == "" {
		return nil
	}
	var config clusterconfig.Config
	if err := json.Unmarshal([]byte(cm.Data[configFile]), &config); err != nil {
		return nil
	}
	return config.Restore
}

// configFile is the ConfigMap's key the agents read.
const configFile = "config.json"

// keepRestoreVolumes adds the restore volumes (restore-*) the deployed StatefulSet's
// postgres container mounts: until its recovery ends, a restarted first primary reads
// the source's archive again. A StatefulSet deleted while its ConfigMap stays is planned
// again without them: neither the PostgresBackup's store nor its Secrets are known any
// more.
func keepRestoreVolumes(p *Plan, sts *appsv1.StatefulSet) {
	if sts == nil {
		return
	}
	pod := sts.Spec.Template.Spec
	mounts := map[string]corev1.VolumeMount{}
	for _, c := range pod.Containers {
		if c.Name == postgresContainer {
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = m
			}
		}
	}
	for _, v := range pod.Volumes {
		m, mounted := mounts[v.Name]
		if !mounted || !isRestoreVolume(v) {
			continue
		}
		p.Volumes = append(p.Volumes, v)
		p.VolumeMounts = append(p.VolumeMounts, corev1.VolumeMount{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly})
	}
}

// postgresContainer is the instance pod's container that runs the agent and PostgreSQL.
const postgresContainer = "postgres"

func isRestoreVolume(v corev1.Volume) bool {
	return strings.HasPrefix(v.Name, restoreRole+"-") && (v.PersistentVolumeClaim != nil || v.Secret != nil)
}

// restoreFrom is where a new cluster restores from.
type restoreFrom struct {
	store dbv1.BackupStore
	// clusterName is the cluster whose backups the store holds.
	clusterName string
	// backupID is the base backup to start from; empty picks one.
	backupID string
	// field names the store in errors.
	field string
}

// restoreSource is the source fromBackup names: a Completed PostgresBackup of the
// namespace (backup, nil when it does not exist), or a store and a cluster name.
func restoreSource(cluster Cluster, from *dbv1.FromBackup, backup *dbv1.PostgresBackup) (restoreFrom, error) {
	if from.BackupName == "" {
		if from.Store == nil {
			return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup needs backupName or store")
		}
		if from.ClusterName == "" {
			return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup.store needs clusterName: the name of the cluster whose backups are in the store")
		}
		return restoreFrom{store: *from.Store, clusterName: from.ClusterName, backupID: from.BackupID, field: "bootstrap.fromBackup.store"}, nil
	}
	name := from.BackupName
	if backup == nil {
		return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup.backupName: PostgresBackup %q does not exist in namespace %q: name a Completed PostgresBackup of this namespace, or restore with bootstrap.fromBackup.store and clusterName", name, cluster.Namespace)
	}
	phase := backup.Status.Phase
	if phase == "" {
		phase = dbv1.BackupPending
	}
	if phase != dbv1.BackupCompleted {
		return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup.backupName: PostgresBackup %q is %s, not Completed: wait for it to complete or name another backup", name, phase)
	}
	if backup.Status.Store == nil {
		return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup.backupName: PostgresBackup %q is Completed but has no status.store: name another backup", name)
	}
	if from.BackupID != "" && from.BackupID != backup.Status.BackupID {
		return restoreFrom{}, fmt.Errorf("bootstrap.fromBackup.backupID %q is not the backupID %q of PostgresBackup %q: leave backupID out when naming a backup", from.BackupID, backup.Status.BackupID, name)
	}
	return restoreFrom{
		store:       *backup.Status.Store,
		clusterName: backup.Spec.Cluster.Name,
		backupID:    backup.Status.BackupID,
		field:       fmt.Sprintf("PostgresBackup %q status.store", name),
	}, nil
}

// checkResources refuses requests above their limits, which the API server would refuse
// only when the StatefulSet creates a pod, leaving the cluster without one.
func checkResources(r corev1.ResourceRequirements) error {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(r.Requests)) {
		request := r.Requests[name]
		limit, ok := r.Limits[name]
		if ok && request.Cmp(limit) > 0 {
			problems = append(problems, fmt.Sprintf("requests.%s %s is above limits.%s %s", name, request.String(), name, limit.String()))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("spec.resources: %s: Kubernetes creates no pod whose request is above its limit; lower the request or raise the limit",
			strings.Join(problems, "; "))
	}
	return nil
}

// resourcesOf are the postgres container's resources as the settings are tuned from
// them: each limit, else its request.
func resourcesOf(r corev1.ResourceRequirements) tuning.Resources {
	pick := func(name corev1.ResourceName) (limit, either resource.Quantity) {
		if q, ok := r.Limits[name]; ok {
			return q, q
		}
		return resource.Quantity{}, r.Requests[name]
	}
	memLimit, mem := pick(corev1.ResourceMemory)
	_, cpu := pick(corev1.ResourceCPU)
	return tuning.Resources{MemoryBytes: mem.Value(), MilliCPU: cpu.MilliValue(), MemoryLimitBytes: memLimit.Value()}
}
