package chart_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// spec.backup.verify renders a CronJob whose pods run agent verify-backup with the
// instances' image, config.json and backup store, on a scratch volume of the instances'
// size and class: restricted, without an API token, never taken for an instance, one
// run at a time, not retried, failed at the timeout.
func TestVerifyCronJob(t *testing.T) {
	if m := render(t, readmeValues(set("backup.store", s3StoreValues("prod/eu")))); len(kinds(m, "CronJob")) > 0 {
		t.Fatalf("without spec.backup.verify: rendered %v", kinds(m, "CronJob"))
	}
	m := render(t, readmeValues(
		set("backup.store", s3StoreValues("prod/eu")),
		set("backup.verify", map[string]any{"schedule": "0 5 * * 0", "timeout": "2h", "amcheck": false}),
		set("storage", map[string]any{"size": "50Gi", "storageClassName": "fast"}),
	))
	cj := decode[batchv1.CronJob](t, m, "CronJob", name+"-verify")
	sts := decode[appsv1.StatefulSet](t, m, "StatefulSet", name)
	job := cj.Spec.JobTemplate.Spec
	pod := job.Template.Spec
	if cj.Spec.Schedule != "0 5 * * 0" || cj.Spec.TimeZone == nil || *cj.Spec.TimeZone != "Etc/UTC" || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("schedule %q in %v, concurrency %s", cj.Spec.Schedule, cj.Spec.TimeZone, cj.Spec.ConcurrencyPolicy)
	}
	if job.BackoffLimit == nil || *job.BackoffLimit != 0 || job.ActiveDeadlineSeconds == nil || *job.ActiveDeadlineSeconds != 7200 {
		t.Errorf("backoffLimit %v, activeDeadlineSeconds %v; want 0 and 7200", job.BackoffLimit, job.ActiveDeadlineSeconds)
	}
	if cj.Spec.JobTemplate.Labels[dbv1.LabelCluster] != name {
		t.Errorf("the Jobs' labels %v lack %s=%s, which the controller finds them by", cj.Spec.JobTemplate.Labels, dbv1.LabelCluster, name)
	}
	if _, ok := job.Template.Labels[dbv1.LabelCluster]; ok {
		t.Errorf("the pods carry %s: the operator would take them for instances", dbv1.LabelCluster)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken || pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("automountServiceAccountToken %v, restartPolicy %s", pod.AutomountServiceAccountToken, pod.RestartPolicy)
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil {
		t.Errorf("pod security context %+v is not restricted", sc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("containers %v", pod.Containers)
	}
	c := pod.Containers[0]
	postgres := sts.Spec.Template.Spec.Containers[0]
	if c.Image != postgres.Image || !slices.Contains(c.Command, "verify-backup") || !slices.Contains(c.Command, "--amcheck=false") {
		t.Errorf("image %s (instances: %s), command %q", c.Image, postgres.Image, c.Command)
	}
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container security context %+v is not restricted", sc)
	}
	// The backup store's mounts are the instances'.
	for _, want := range postgres.VolumeMounts {
		if strings.HasPrefix(want.Name, "backup-") && !slices.Contains(c.VolumeMounts, want) {
			t.Errorf("the verify container lacks the instances' mount %+v", want)
		}
	}
	var scratch *corev1.Volume
	for i, v := range pod.Volumes {
		if v.Name == "scratch" {
			scratch = &pod.Volumes[i]
		}
	}
	if scratch == nil || scratch.Ephemeral == nil {
		t.Fatalf("no ephemeral scratch volume in %+v", pod.Volumes)
	}
	claim := scratch.Ephemeral.VolumeClaimTemplate.Spec
	if got := claim.Resources.Requests[corev1.ResourceStorage]; got.String() != "50Gi" || claim.StorageClassName == nil || *claim.StorageClassName != "fast" {
		t.Errorf("scratch volume %s of class %v, want 50Gi of fast", got.String(), claim.StorageClassName)
	}
}

// A cluster name of the 50 characters the CRD allows still gives a CronJob name of at
// most 52, and different such names give different CronJobs.
func TestVerifyCronJobName(t *testing.T) {
	a, b := strings.Repeat("a", 50), strings.Repeat("a", 49)+"b"
	na, nb := dbv1.NamesOf(a).VerifyCronJob(), dbv1.NamesOf(b).VerifyCronJob()
	if len(na) > 52 || len(nb) > 52 || na == nb {
		t.Errorf("%q and %q", na, nb)
	}
	if got := dbv1.NamesOf("my-db").VerifyCronJob(); got != "my-db-verify" {
		t.Errorf("my-db: %q", got)
	}
}

func kinds(m *manifest, kind string) []string {
	var out []string
	for _, o := range m.Objects {
		if o.Kind == kind {
			out = append(out, o.Name)
		}
	}
	return out
}
