package failover

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// NextReplica is where a replica cluster (spec) stands after this observation at now,
// from its designated primary (holder): whether it streams from the source and how far
// behind, or, once promoted, when. nil for a cluster of its own. While the Lease names
// no holder, or the holder does not answer, what was recorded stays.
func NextReplica(prev *dbv1.ReplicaStatus, spec *dbv1.ReplicaSpec, holder string, instances []Instance, now time.Time) *dbv1.ReplicaStatus {
	if spec == nil {
		return nil
	}
	next := &dbv1.ReplicaStatus{Source: spec.Source.Host, DesignatedPrimary: holder}
	if prev != nil {
		next.LagSeconds, next.Message, next.Streaming = prev.LagSeconds, prev.Message, prev.Streaming
		next.PromotedAt, next.DemotionToken = prev.PromotedAt, prev.DemotionToken
		if prev.Source != spec.Source.Host || spec.Enabled && prev.PromotedAt != nil {
			// Following another source, or again after a promotion: what was said of
			// the last one no longer holds.
			next.PromotedAt, next.DemotionToken, next.LagSeconds = nil, "", 0
		}
	}
	i := find(instances, holder)
	if holder == "" || i == nil || !i.Reachable {
		if prev != nil && holder == "" {
			next.DesignatedPrimary = prev.DesignatedPrimary
		}
		return next
	}
	st := i.Status
	if st.DemotionToken != "" && spec.Enabled {
		next.DemotionToken = st.DemotionToken
	}
	if !spec.Enabled {
		next.DemotionToken = ""
		next.Streaming = false
		if next.PromotedAt == nil && st.Role == agentapi.RolePrimary {
			at := metav1.NewTime(now.UTC().Truncate(time.Second))
			next.PromotedAt = &at
			next.Message = fmt.Sprintf("promoted: %s is the primary, on what it had received from %s, which it last replayed %d s behind; "+
				"anything the source committed after that is not in this cluster", holder, spec.Source.Host, next.LagSeconds)
			if spec.PromotionToken != "" {
				next.Message = fmt.Sprintf("promoted: %s is the primary, after it replayed all the demoted source %s wrote (promotion token %s): nothing it acknowledged is missing",
					holder, spec.Source.Host, spec.PromotionToken)
			}
		} else if next.PromotedAt == nil {
			next.Message = fmt.Sprintf("promoting %s (spec.replica.enabled is false)", holder)
		}
		return next
	}
	r := st.Receiver
	switch {
	case st.Role != agentapi.RoleReplica || r == nil:
		next.Streaming, next.Message = false, fmt.Sprintf("%s is %s, not streaming from the source", holder, st.Role)
	case r.Upstream != spec.Source.Host:
		next.Streaming, next.Message = false, fmt.Sprintf("%s streams from %q, not yet from the source", holder, r.Upstream)
	default:
		// Said without the receiver's own words, which count the time: the report is
		// written when it changes.
		next.Streaming, next.Message, next.LagSeconds = r.Healthy, "", r.LagMillis/1000
		switch {
		case r.Healthy:
		case r.State == agentapi.ReceiverStreaming:
			next.Message = fmt.Sprintf("%s replays more than spec.postgresql.maxReadLag (%s) behind the source", holder, time.Duration(r.MaxLagMillis)*time.Millisecond)
		default:
			next.Message = fmt.Sprintf("%s's WAL receiver is %s: it does not stream from the source (its agent's status says why)", holder, r.State)
		}
	}
	return next
}

// recordReplica records where a replica cluster stands in the report for the status
// controller, with an event when it starts or stops streaming and when it is promoted.
func (c *cycle) recordReplica(ctx context.Context) error {
	prev := c.reported.Replica
	next := NextReplica(prev, c.cluster.Spec.Replica, primarylease.Parse(c.lease).Holder, c.instances, c.r.clock.Now())
	if equality.Semantic.DeepEqual(prev, next) {
		return nil
	}
	switch {
	case next == nil:
	case next.PromotedAt != nil && (prev == nil || prev.PromotedAt == nil):
		c.tell("Replica cluster", []DataGuardEvent{{corev1.EventTypeNormal, dbv1.ReasonReplicaClusterPromoted, next.Message}})
	case next.DemotionToken != "" && (prev == nil || prev.DemotionToken != next.DemotionToken):
		c.tell("Replica cluster", []DataGuardEvent{{corev1.EventTypeNormal, dbv1.ReasonReplicaClusterDemoted, fmt.Sprintf(
			"the primary %s stopped cleanly to follow %s; its demotion token %s goes into the source's spec.replica.promotionToken", next.DesignatedPrimary, next.Source, next.DemotionToken)}})
	case next.PromotedAt == nil && next.Streaming && (prev == nil || !prev.Streaming):
		c.tell("Replica cluster", []DataGuardEvent{{corev1.EventTypeNormal, dbv1.ReasonReplicaClusterStreaming,
			fmt.Sprintf("%s streams from the source %s", next.DesignatedPrimary, next.Source)}})
	case next.PromotedAt == nil && !next.Streaming && prev != nil && prev.Streaming:
		c.tell("Replica cluster", []DataGuardEvent{{corev1.EventTypeWarning, dbv1.ReasonReplicaClusterNotStreaming,
			fmt.Sprintf("the replica cluster does not stream from %s: %s", next.Source, next.Message)}})
	}
	if err := c.record(ctx, report.KeyReplica, next); err != nil {
		return fmt.Errorf("recording where the replica cluster stands: %w", err)
	}
	c.reported.Replica = next
	return nil
}

// refreshReplicaConfig has the kubelet bring a changed spec.replica, and the copy of
// the source's certificate, to the pods at once. A demotion or a promotion is read by the agents from config.json, which the
// kubelet rewrites in a pod's ConfigMap volume only when it syncs the pod: within a
// minute by default (make e2e: a planned switch of roles waited 62 s for it). Any
// change of the pod makes it sync; so once the ConfigMap the chart rendered holds new
// replica settings, each instance pod is annotated with their digest.
func (c *cycle) refreshReplicaConfig(ctx context.Context) error {
	if c.cluster.Spec.Replica == nil {
		return nil
	}
	var cm corev1.ConfigMap
	if err := c.r.client.Get(ctx, client.ObjectKey{Namespace: c.cluster.Namespace, Name: dbv1.NamesOf(c.cluster.Name).ConfigMap()}, &cm); err != nil {
		return client.IgnoreNotFound(err)
	}
	var cfg clusterconfig.Config
	if json.Unmarshal([]byte(cm.Data["config.json"]), &cfg) != nil || cfg.Replica == nil {
		return nil
	}
	// The source certificate's copy too: the kubelet refreshes Secret volumes the same way.
	var copied corev1.Secret
	if err := c.r.client.Get(ctx, client.ObjectKey{Namespace: c.cluster.Namespace, Name: dbv1.NamesOf(c.cluster.Name).SourceTLSSecret()}, &copied); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	b, _ := json.Marshal(struct {
		Replica    *clusterconfig.Replica
		SourceCert string
	}{cfg.Replica, copied.ResourceVersion})
	sum := sha256.Sum256(b)
	want := hex.EncodeToString(sum[:8])
	var errs []error
	for i := range c.pods {
		p := &c.pods[i]
		if p.Annotations[dbv1.AnnotationReplicaConfig] == want || p.DeletionTimestamp != nil {
			continue
		}
		p = p.DeepCopy() // the cache's: change and patch a copy
		patch := client.MergeFrom(p.DeepCopy())
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, dbv1.AnnotationReplicaConfig, want)
		if err := c.r.client.Patch(ctx, p, patch); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("annotating %s for its replica settings: %w", p.Name, err))
			}
			continue
		}
		c.log("Asked the kubelet to refresh the pod's configuration: the replica settings changed", "pod", p.Name,
			"enabled", cfg.Replica.Enabled, "source", cfg.Replica.Host)
	}
	return errors.Join(errs...)
}
