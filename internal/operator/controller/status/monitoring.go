package status

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// MonitoringAPI is the Prometheus Operator's API group and version: the chart renders
// the PodMonitor and PrometheusRule only where their kinds are served.
const MonitoringAPI = "monitoring.coreos.com/v1"

// MonitoringKinds are the kinds monitoring.enabled needs.
var MonitoringKinds = []string{"PodMonitor", "PrometheusRule"}

// MonitoringAPIs says which of MonitoringKinds the API server serves.
type MonitoringAPIs interface {
	Served(ctx context.Context) (map[string]bool, error)
}

// DiscoveryMonitoringAPIs asks the API server's discovery, at most once a minute: the
// status controller reconciles at every change of a pod or Lease.
type DiscoveryMonitoringAPIs struct {
	Client discovery.DiscoveryInterface
	Now    func() time.Time

	mu     sync.Mutex
	at     time.Time
	served map[string]bool
}

// monitoringCheckPeriod is how long one discovery answer is used.
const monitoringCheckPeriod = time.Minute

// Served implements MonitoringAPIs.
func (d *DiscoveryMonitoringAPIs) Served(context.Context) (map[string]bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.served != nil && d.Now().Sub(d.at) < monitoringCheckPeriod {
		return d.served, nil
	}
	served := map[string]bool{}
	list, err := d.Client.ServerResourcesForGroupVersion(MonitoringAPI)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, err
	default:
		for _, r := range list.APIResources {
			served[r.Kind] = true
		}
	}
	d.served, d.at = served, d.Now()
	return served, nil
}

// monitoringCondition is MonitoringReady for spec.monitoring.enabled: True when every
// kind it renders is served, False naming the missing ones. nil served (unknown) keeps
// the condition as it is.
func monitoringCondition(served map[string]bool, generation int64) dbv1.Condition {
	var missing []string
	for _, k := range MonitoringKinds {
		if !served[k] {
			missing = append(missing, k)
		}
	}
	cond := dbv1.Condition{Type: dbv1.ConditionMonitoringReady, Status: metav1.ConditionTrue, Reason: dbv1.ReasonPrometheusOperatorFound,
		Message:            "The PodMonitor and PrometheusRule are rendered: the Prometheus Operator's API (" + MonitoringAPI + ") serves them",
		ObservedGeneration: generation}
	if len(missing) > 0 {
		slices.Sort(missing)
		cond.Status, cond.Reason = metav1.ConditionFalse, dbv1.ReasonPrometheusOperatorMissing
		cond.Message = "spec.monitoring.enabled, but the API server does not serve " + strings.Join(missing, " and ") + " (" + MonitoringAPI +
			"): nothing of it is rendered, so no Prometheus Operator scrapes the instances or evaluates pgpilot's alerts. Install the Prometheus Operator's CRDs, or scrape the agents and load the alert rules yourself (docs/monitoring.md)"
	}
	return cond
}
