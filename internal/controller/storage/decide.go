// Package storage grows the instances' volumes: to spec.storage.size when it grows, and
// by spec.storage.autoGrow before they fill up. A StatefulSet's claim template cannot
// change, so every claim is expanded in place, online, including the claims of
// instances added later (made from the template at the size the cluster was created
// with).
package storage

import (
	"fmt"
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// Usage is how full one instance's volume is, as its agent measures the file system.
type Usage struct {
	Instance         string
	Bytes, FreeBytes int64
}

// Grow is the automatic growth decision: the size to request instead of want, and why;
// a zero size when the volumes stay as they are (with a reason when they should grow
// but cannot).
type Grow struct {
	Size   resource.Quantity
	Reason string
	// AtMax: a volume is past the threshold and the volumes are at maxSize already.
	AtMax bool
}

// minIncrement is the least a volume grows by at a time.
var minIncrement = resource.MustParse("1Gi")

// AutoGrow decides whether the volumes grow: when one instance's file system is used
// above the threshold, by increment percent of want (at least 1Gi), up to maxSize. It
// does not while a claim is still being expanded, nor when a file system does not yet
// show its claim's capacity (it would measure the old size and grow twice).
func AutoGrow(spec dbv1.StorageSpec, want resource.Quantity, claims []Claim, usage []Usage) Grow {
	g := spec.AutoGrow
	if g == nil {
		return Grow{}
	}
	for _, c := range claims {
		if c.Capacity.Cmp(c.Requested) < 0 || c.Resizing != "" {
			return Grow{}
		}
	}
	threshold := float64(orDefault(g.Threshold, 80))
	var full []string
	for _, u := range usage {
		if u.Bytes <= 0 {
			continue
		}
		// A file system smaller than 90 % of the request it was grown to has not
		// been resized yet.
		if float64(u.Bytes) < 0.9*float64(want.Value()) {
			return Grow{}
		}
		if used := 100 * float64(u.Bytes-u.FreeBytes) / float64(u.Bytes); used > threshold {
			full = append(full, fmt.Sprintf("%s %.0f%% used", u.Instance, used))
		}
	}
	if len(full) == 0 {
		return Grow{}
	}
	sort.Strings(full)
	if want.Cmp(g.MaxSize) >= 0 {
		return Grow{AtMax: true, Reason: fmt.Sprintf("%s (above %.0f%%), and the volumes are at autoGrow.maxSize %s already",
			strings.Join(full, ", "), threshold, g.MaxSize.String())}
	}
	step := int64(math.Ceil(float64(want.Value()) * float64(orDefault(g.Increment, 25)) / 100))
	step = max(step, minIncrement.Value())
	const gi = 1 << 30
	next := min((want.Value()+step+gi-1)/gi*gi, g.MaxSize.Value())
	size := *resource.NewQuantity(next, resource.BinarySI)
	return Grow{Size: size, Reason: fmt.Sprintf("%s (above %.0f%%): growing the volumes from %s to %s (autoGrow.maxSize %s)",
		strings.Join(full, ", "), threshold, want.String(), size.String(), g.MaxSize.String())}
}

func orDefault(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
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
