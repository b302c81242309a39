package claims

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func claim(name, requested, capacity string) Claim {
	c := Claim{Name: name, Requested: resource.MustParse(requested)}
	if capacity != "" {
		c.Capacity = resource.MustParse(capacity)
	}
	return c
}

func TestWant(t *testing.T) {
	spec := dbv1.StorageSpec{Size: ptr.To(resource.MustParse("2Gi"))}
	for _, tc := range []struct {
		name   string
		claims []Claim
		want   string
	}{
		{"the spec's size", []Claim{claim("a", "1Gi", "1Gi"), claim("b", "2Gi", "1Gi")}, "2Gi"},
		{"a claim grown beyond it: the others follow", []Claim{claim("a", "5Gi", "5Gi"), claim("b", "2Gi", "2Gi")}, "5Gi"},
		{"no claims", nil, "2Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Want(spec, tc.claims); got.Cmp(resource.MustParse(tc.want)) != 0 {
				t.Errorf("Want = %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestCondition(t *testing.T) {
	want := resource.MustParse("2Gi")
	resizing := ClaimOf(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data-db-1"},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceStorage: resource.MustParse("2Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			Conditions: []corev1.PersistentVolumeClaimCondition{{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue}}},
	})
	for _, tc := range []struct {
		name   string
		claims []Claim
		status metav1.ConditionStatus
		reason string
		msg    string
	}{
		{"every volume at size", []Claim{claim("data-db-0", "2Gi", "2Gi")}, metav1.ConditionTrue, dbv1.ReasonVolumesAtSize, "every volume has 2Gi"},
		{"one expanding", []Claim{claim("data-db-0", "2Gi", "2Gi"), resizing}, metav1.ConditionFalse, dbv1.ReasonVolumeExpanding,
			"data-db-1 has 1Gi of 2Gi (FileSystemResizePending)"},
		{"one not expanded", []Claim{claim("data-db-0", "1Gi", "1Gi"), resizing}, metav1.ConditionFalse, dbv1.ReasonVolumeExpansionRefused,
			"the volumes must have 2Gi, but data-db-0 requests 1Gi; expansion needs a StorageClass with allowVolumeExpansion: true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Condition(want, tc.claims)
			if c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msg) {
				t.Errorf("got %s %s %q, want %s %s containing %q", c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.msg)
			}
		})
	}
}
