// Package claims reads the instances' data volume claims: what each requests and has,
// the size they must all request, and the StorageResized condition. The storage
// controller grows them; the status controller shows where they stand.
package claims

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Claim is one instance's data volume claim.
type Claim struct {
	Name string
	// Requested is the claim's request; Capacity what the volume has (zero before it
	// is bound).
	Requested, Capacity resource.Quantity
	// Resizing is the claim's Resizing or FileSystemResizePending condition, "" when
	// none.
	Resizing string
}

// ClaimOf reads a PersistentVolumeClaim.
func ClaimOf(pvc *corev1.PersistentVolumeClaim) Claim {
	c := Claim{Name: pvc.Name, Requested: pvc.Spec.Resources.Requests[corev1.ResourceStorage], Capacity: pvc.Status.Capacity[corev1.ResourceStorage]}
	for _, cond := range pvc.Status.Conditions {
		if cond.Status == corev1.ConditionTrue &&
			(cond.Type == corev1.PersistentVolumeClaimResizing || cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending) {
			c.Resizing = string(cond.Type)
			if cond.Message != "" {
				c.Resizing += ": " + cond.Message
			}
		}
	}
	return c
}

// Want is the size every claim of the cluster must request: the spec's, or the largest
// any claim requests already (a volume never shrinks, and the instances hold the same
// data, so a volume grown automatically, or by hand, makes the others follow).
func Want(spec dbv1.StorageSpec, claims []Claim) resource.Quantity {
	var want resource.Quantity
	if spec.Size != nil {
		want = spec.Size.DeepCopy()
	}
	for _, c := range claims {
		if c.Requested.Cmp(want) > 0 {
			want = c.Requested.DeepCopy()
		}
	}
	return want
}

// Condition is the StorageResized condition for claims that must request want. It is
// computed from the claims alone: the API server's message for a refused expansion is
// in the storage controller's event.
func Condition(want resource.Quantity, claims []Claim) dbv1.Condition {
	var short, growing []string
	for _, c := range claims {
		switch {
		case c.Requested.Cmp(want) < 0:
			short = append(short, fmt.Sprintf("%s requests %s", c.Name, c.Requested.String()))
		case !c.Capacity.IsZero() && c.Capacity.Cmp(c.Requested) < 0:
			msg := fmt.Sprintf("%s has %s of %s", c.Name, c.Capacity.String(), c.Requested.String())
			if c.Resizing != "" {
				msg += " (" + c.Resizing + ")"
			}
			growing = append(growing, msg)
		}
	}
	switch {
	case len(short) > 0:
		return dbv1.Condition{Type: dbv1.ConditionStorageResized, Status: metav1.ConditionFalse, Reason: dbv1.ReasonVolumeExpansionRefused,
			Message: fmt.Sprintf("the volumes must have %s, but %s; expansion needs a StorageClass with allowVolumeExpansion: true", want.String(), strings.Join(short, "; "))}
	case len(growing) > 0:
		return dbv1.Condition{Type: dbv1.ConditionStorageResized, Status: metav1.ConditionFalse, Reason: dbv1.ReasonVolumeExpanding,
			Message: fmt.Sprintf("expanding the volumes to %s: %s", want.String(), strings.Join(growing, "; "))}
	}
	return dbv1.Condition{Type: dbv1.ConditionStorageResized, Status: metav1.ConditionTrue, Reason: dbv1.ReasonVolumesAtSize,
		Message: fmt.Sprintf("every volume has %s", want.String())}
}

// InstanceClaims are the data volume claims of the instances the StatefulSet runs (not
// those kept from instances scaled away), by ordinal; missing ones are left out.
func InstanceClaims(ctx context.Context, c client.Reader, cluster *dbv1.PostgresCluster) ([]corev1.PersistentVolumeClaim, error) {
	var sts appsv1.StatefulSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.Names().StatefulSet()}, &sts); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	var list corev1.PersistentVolumeClaimList
	if err := c.List(ctx, &list, client.InNamespace(cluster.Namespace), client.MatchingLabels{dbv1.LabelCluster: cluster.Name}); err != nil {
		return nil, err
	}
	byName := map[string]corev1.PersistentVolumeClaim{}
	for _, p := range list.Items {
		byName[p.Name] = p
	}
	replicas := 0
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	var out []corev1.PersistentVolumeClaim
	for i := range replicas {
		if p, ok := byName[cluster.VolumeClaimName(i)]; ok {
			out = append(out, p)
		}
	}
	return out, nil
}
