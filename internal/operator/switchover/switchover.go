// Package switchover is how the operator's controllers move the primary on purpose: a
// controller that needs the primary elsewhere (a rolling update, a restart, a
// scale-down) asks for a switchover with Request, the way a person does, and the
// failover controller carries it out once Check allows it.
package switchover

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Request asks for a switchover of cluster to target the way a person does,
// with the annotation the failover controller carries out (and removes when done or refused).
// The controllers that need the primary elsewhere (rolling updates, restarts,
// scale-downs) all go through it.
func Request(ctx context.Context, c client.Client, cluster *dbv1.PostgresCluster, target string) error {
	patch := client.MergeFrom(cluster.DeepCopy())
	metav1.SetMetaDataAnnotation(&cluster.ObjectMeta, dbv1.AnnotationSwitchoverTo, target)
	return c.Patch(ctx, cluster, patch)
}

// MaxLag is how far behind the primary a switchover target may be: a replica
// further behind would make writes wait while it catches up.
const MaxLag = 16 << 20

// Check says why target cannot take over from a healthy holder now, "" when
// it can.
func Check(holder, target string, instances []fleet.Instance) string {
	if target == holder {
		return fmt.Sprintf("%s is already the primary", target)
	}
	primary, candidate := find(instances, holder), find(instances, target)
	switch {
	case candidate == nil:
		return fmt.Sprintf("%s is not an instance of this cluster", target)
	case primary == nil || !primary.Reachable || primary.Status.Role != agentapi.RolePrimary || !primary.Status.Ready:
		return fmt.Sprintf("the primary %s is not healthy; a failover, not a switchover, will replace it", holder)
	case !candidate.Reachable:
		return fmt.Sprintf("%s's agent does not answer", target)
	case candidate.Terminating:
		return fmt.Sprintf("%s is being deleted", target)
	case candidate.Status.Role != agentapi.RoleReplica || !candidate.Status.Ready:
		return fmt.Sprintf("%s is %s, not a ready replica", target, candidate.Status.Role)
	}
	write, err1 := agentapi.ParseLSN(primary.Status.WriteLSN)
	received, err2 := agentapi.ParseLSN(candidate.Status.Position)
	if err1 != nil || err2 != nil {
		return fmt.Sprintf("cannot compare %s's WAL position with the primary's", target)
	}
	if write > received && write-received > MaxLag {
		return fmt.Sprintf("%s is %d bytes behind the primary (at most %d for a switchover)", target, write-received, MaxLag)
	}
	return ""
}

func find(instances []fleet.Instance, name string) *fleet.Instance {
	for i := range instances {
		if instances[i].Name == name {
			return &instances[i]
		}
	}
	return nil
}
