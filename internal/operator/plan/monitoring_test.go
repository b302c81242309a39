package plan

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestMountCustomQueries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		src    *dbv1.CustomQueriesSource
		key    string
		mounts bool
	}{
		{name: "none"},
		{name: "default key", src: &dbv1.CustomQueriesSource{Name: "my-queries"}, key: "queries.yaml", mounts: true},
		{name: "own key", src: &dbv1.CustomQueriesSource{Name: "my-queries", Key: "pg.yaml"}, key: "pg.yaml", mounts: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{}
			mountCustomQueries(p, tc.src)
			if !tc.mounts {
				if len(p.Volumes) != 0 || p.Config.CustomQueries != "" {
					t.Errorf("mounted %v, config %q", p.Volumes, p.Config.CustomQueries)
				}
				return
			}
			want := []corev1.Volume{{Name: "custom-queries", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "my-queries"},
				Items:                []corev1.KeyToPath{{Key: tc.key, Path: "queries.yaml"}},
				Optional:             ptr.To(true), DefaultMode: ptr.To[int32](0o444),
			}}}}
			if diff := cmp.Diff(want, p.Volumes); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]corev1.VolumeMount{{Name: "custom-queries", MountPath: "/etc/pgpilot/queries", ReadOnly: true}}, p.VolumeMounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if p.Config.CustomQueries != "/etc/pgpilot/queries/queries.yaml" {
				t.Errorf("config.json customQueries = %q", p.Config.CustomQueries)
			}
		})
	}
}
