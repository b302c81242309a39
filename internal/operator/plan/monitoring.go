package plan

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/customquery"
)

// customQueriesDir is where the pods mount spec.monitoring.customQueries.
const customQueriesDir = "/etc/pgpilot/queries"

// mountCustomQueries mounts the custom queries' ConfigMap key, when one is named, and
// tells the agents where (config.json). The volume is optional: a missing ConfigMap
// or key never keeps a pod from starting; the agents report it in their metrics.
func mountCustomQueries(p *Plan, src *dbv1.CustomQueriesSource) {
	if src == nil || src.Name == "" {
		return
	}
	key := src.Key
	if key == "" {
		key = customquery.DefaultKey
	}
	p.Volumes = append(p.Volumes, corev1.Volume{Name: "custom-queries", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: src.Name},
			Items:                []corev1.KeyToPath{{Key: key, Path: customquery.DefaultKey}},
			Optional:             ptr.To(true),
			DefaultMode:          ptr.To[int32](0o444),
		},
	}})
	p.VolumeMounts = append(p.VolumeMounts, corev1.VolumeMount{Name: "custom-queries", MountPath: customQueriesDir, ReadOnly: true})
	p.Config.CustomQueries = customQueriesDir + "/" + customquery.DefaultKey
}
