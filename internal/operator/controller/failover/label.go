package failover

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Label is the role label pod should carry when holder is the primary ("" while the
// Lease names none) and obs is its last observation (nil when none), and whether the
// label must change. The Services select on it, so:
//   - primary only for the holder, once its agent reports it a primary or a running
//     standby, which it promotes as soon as it sees the Lease: labelling it then lets
//     the Service's endpoints and the nodes' proxies catch up while it promotes
//     (clients meanwhile get a read-only error, as they would get no answer otherwise);
//   - a pod labelled primary that no longer holds the Lease becomes fenced, never
//     replica: until its agent has rewound it, it is not a replica of anything;
//   - fenced or unlabelled pods become replica once their agent reports them a ready
//     standby; an unlabelled pod that is not the holder starts as replica;
//   - a pod the user fenced (fenced: the Lease records it) is fenced, whatever its
//     role: it is in no Service while it is.
func Label(pod *corev1.Pod, holder string, obs *Instance, fenced bool) (string, bool) {
	current := pod.Labels[dbv1.LabelRole]
	switch current {
	case dbv1.RolePrimary, dbv1.RoleReplica, dbv1.RoleFenced:
	default:
		current = "" // unknown: someone else's
	}
	var st agentapi.Status
	if obs != nil && obs.Reachable {
		st = obs.Status
	}
	want := current
	switch {
	case fenced:
		want = dbv1.RoleFenced
	case pod.Name == holder && (st.Role == agentapi.RolePrimary || st.Role == agentapi.RoleReplica && st.Running):
		want = dbv1.RolePrimary
	case pod.Name == holder && current == "" && st.Role != agentapi.RoleReplica:
		want = dbv1.RolePrimary // a new cluster's first primary
	case pod.Name == holder:
	case st.Role == agentapi.RoleReplica && st.Ready:
		want = dbv1.RoleReplica
	case current == dbv1.RolePrimary:
		want = dbv1.RoleFenced
	case current == "":
		want = dbv1.RoleReplica
	}
	return want, want != pod.Labels[dbv1.LabelRole]
}

// Relabel is one role label to write: pod Pod gets Role.
type Relabel struct {
	Pod  string
	Role string
}

// Relabels lists the role labels to change, given the Lease's holder ("" for none), the
// instances it records as fenced and the last observations, in the order they must be written: labels that put a pod into
// a Service's endpoints (primary, replica) before those that take one out (fenced).
//
// The order matters at a handover, where one pass moves -rw from the old primary to
// the new one. kube-proxy applies endpoint changes at most once a second (its default
// minimum sync period): had the old primary left first, the Service would have had no
// endpoint for up to that second: every connection opened then failed, and on the node
// itself the first SYN of such a connection never reached the wire and the client
// waited a retransmission, 1 s later (make chaos, graceful-delete: 1.0 to 1.2 s of
// every round). Joining first, the old pod, terminating, is no longer used once the
// new one is there.
func Relabels(pods []corev1.Pod, holder string, fenced []string, instances []Instance) []Relabel {
	var joins, leaves []Relabel
	for i := range pods {
		p := &pods[i]
		role, change := Label(p, holder, find(instances, p.Name), slices.Contains(fenced, p.Name))
		switch {
		case !change:
		case role == dbv1.RoleFenced:
			leaves = append(leaves, Relabel{Pod: p.Name, Role: role})
		default:
			joins = append(joins, Relabel{Pod: p.Name, Role: role})
		}
	}
	return append(joins, leaves...)
}
