// Package clusterpods finds the instance pods of a cluster and the cluster of a pod.
package clusterpods

import (
	"context"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// List returns the cluster's instance pods sorted by name.
func List(ctx context.Context, c client.Reader, cluster *dbv1.PostgresCluster) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{dbv1.LabelCluster: cluster.Name}); err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items, nil
}

// ClusterOf maps an object labelled with a cluster to a request for that cluster.
func ClusterOf(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[dbv1.LabelCluster]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// IsReady reports whether the pod's Ready condition is True.
func IsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
