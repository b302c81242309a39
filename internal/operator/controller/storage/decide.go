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

	"k8s.io/apimachinery/pkg/api/resource"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/claims"
)

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
func AutoGrow(spec dbv1.StorageSpec, want resource.Quantity, claims []claims.Claim, usage []Usage) Grow {
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
