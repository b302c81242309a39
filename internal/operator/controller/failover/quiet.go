package failover

import (
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// FullObservationEvery bounds how long a settled cluster's standbys go unasked: a
// quiet cycle asks the holder alone (docs/failover.md, "Quiet cycles").
const FullObservationEvery = 30 * time.Second

// fullObservation is the last cycle that asked every agent of a cluster and found it
// Settled: what a quiet cycle compares the cluster with, and the standbys' statuses it
// carries forward.
type fullObservation struct {
	at time.Time
	// pods are the instance pods by name, as listed then.
	pods map[string]podVersion
	// lease is the Lease at the end of that cycle: a quiet cycle needs it changed by
	// renewals alone.
	lease *coordinationv1.Lease
	// generation and annotations are the cluster's then.
	generation  int64
	annotations map[string]string
	// statuses are what each agent answered.
	statuses map[string]agentapi.Status
}

type podVersion struct {
	uid             types.UID
	resourceVersion string
}

// recordFull keeps this cycle's observation as the cluster's last full one; the caller
// holds r.mu and calls it only for a cycle that asked every agent and found the cluster
// Settled.
func (c *cycle) recordFull(now time.Time) {
	full := &fullObservation{at: now, pods: make(map[string]podVersion, len(c.pods)), lease: c.lease.DeepCopy(),
		generation: c.cluster.Generation, annotations: maps.Clone(c.cluster.Annotations),
		statuses: make(map[string]agentapi.Status, len(c.instances))}
	for i := range c.pods {
		full.pods[c.pods[i].Name] = podVersion{uid: c.pods[i].UID, resourceVersion: c.pods[i].ResourceVersion}
	}
	for _, in := range c.instances {
		full.statuses[in.Name] = in.Status
	}
	c.mem.full = full
}

// quietHolder is the holder to ask alone this cycle, or "" when every agent must be
// asked: the cluster was found Settled by a full observation less than
// FullObservationEvery ago (at now), and nothing the decision reads has changed since
// but what only the agents report. The caller holds r.mu.
func quietHolder(full *fullObservation, settled bool, now time.Time, cluster *dbv1.PostgresCluster, lease *coordinationv1.Lease, pods []corev1.Pod) string {
	if !settled || full == nil || lease == nil || now.Sub(full.at) >= FullObservationEvery || now.Before(full.at) {
		return ""
	}
	if cluster.Generation != full.generation || !maps.Equal(cluster.Annotations, full.annotations) {
		return ""
	}
	if !primarylease.OnlyRenewed(full.lease, lease) {
		return ""
	}
	if len(pods) != len(full.pods) {
		return ""
	}
	for i := range pods {
		v, ok := full.pods[pods[i].Name]
		if !ok || v.uid != pods[i].UID || v.resourceVersion != pods[i].ResourceVersion {
			return ""
		}
	}
	holder := primarylease.Parse(lease).Holder
	if _, ok := full.pods[holder]; !ok {
		return ""
	}
	return holder
}

// vouched is instances with every standby's status carried from full, when the holder's
// fresh answer names each of them streaming from it in its term; nil otherwise. A
// standby that stops streaming leaves pg_stat_replication, and one that falls behind
// maxReadLag turns its pod not ready (I6), which changes the pod.
func vouched(instances []Instance, holder string, term int32, full *fullObservation) []Instance {
	var h *Instance
	for i := range instances {
		if instances[i].Name == holder {
			h = &instances[i]
		}
	}
	if h == nil || !h.Reachable || h.Status.Role != agentapi.RolePrimary || h.Status.Term != term {
		return nil
	}
	streaming := make(map[string]bool, len(h.Status.Replicas))
	for _, r := range h.Status.Replicas {
		if r.State == agentapi.ReceiverStreaming {
			streaming[r.Name] = true
		}
	}
	out := make([]Instance, len(instances))
	for i, in := range instances {
		out[i] = in
		if in.Name == holder {
			continue
		}
		st, ok := full.statuses[in.Name]
		if !ok || !streaming[in.Name] {
			return nil
		}
		out[i].Reachable, out[i].Status = true, st
	}
	return out
}
