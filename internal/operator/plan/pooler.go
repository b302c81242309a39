package plan

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// Pooler is what the chart renders of spec.pooler (docs/pooler.md): a Deployment of
// PgBouncer pods for the read-write pool, and one for the read-only pool with
// ReadOnly, each with its Service and PodDisruptionBudget.
type Pooler struct {
	Names PoolerNames `json:"names"`
	// Image is PgBouncer's image; the agent the init container copies in is
	// Plan.AgentImage.
	Image     string                      `json:"image"`
	Instances int                         `json:"instances"`
	ReadOnly  bool                        `json:"readOnly"`
	Resources corev1.ResourceRequirements `json:"resources"`
}

// PoolerNames are the names of the pooler's objects, from dbv1.Names.
type PoolerNames struct {
	ReadWrite       string `json:"readWrite"`
	ReadOnly        string `json:"readOnly"`
	Headless        string `json:"headless"`
	TLSSecret       string `json:"tlsSecret"`
	ClientTLSSecret string `json:"clientTLSSecret"`
}

// DefaultPoolerResources are the PgBouncer container's when spec.pooler.resources is
// empty: PgBouncer is one single-threaded process that needs little memory (about 2 kB
// per connection and its buffers).
var DefaultPoolerResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")},
}

// planPooler adds spec.pooler to p: the chart's part and config.json's. An error is a
// spec the API server let through that the pooler cannot run with.
func planPooler(p *Plan, cluster string, v Values) error {
	spec := v.Pooler
	if spec == nil {
		return nil
	}
	if why := clusterconfig.CheckPoolerParameters(spec.Parameters); why != "" {
		return fmt.Errorf("spec.pooler.parameters: %s", why)
	}
	if v.Operator.PoolerImage == "" {
		return fmt.Errorf("spec.pooler needs PgBouncer's image: the operator sets operator.poolerImage from RELATED_IMAGE_PGBOUNCER (docs/install.md)")
	}
	n := dbv1.NamesOf(cluster)
	names := PoolerNames{
		ReadWrite:       n.PoolerReadWrite(),
		Headless:        n.PoolerHeadless(),
		TLSSecret:       n.PoolerTLSSecret(),
		ClientTLSSecret: n.PoolerClientTLSSecret(),
	}
	cfg := &clusterconfig.Pooler{
		Mode:                 orDefault(spec.Mode, "transaction"),
		PoolSize:             int(orDefaultInt(spec.PoolSize, 20)),
		MaxClientConnections: int(orDefaultInt(spec.MaxClientConnections, 1000)),
		Parameters:           spec.Parameters,
		ReadWrite:            names.ReadWrite,
		Headless:             names.Headless,
	}
	if spec.ReadOnly {
		names.ReadOnly = n.PoolerReadOnly()
		cfg.ReadOnly = names.ReadOnly
		cfg.ReadOnlyService = n.ReadOnlyService()
	}
	resources := spec.Resources
	if len(resources.Requests) == 0 && len(resources.Limits) == 0 {
		resources = DefaultPoolerResources
	}
	p.Pooler = &Pooler{
		Names:     names,
		Image:     v.Operator.PoolerImage,
		Instances: int(orDefaultInt(spec.Instances, 2)),
		ReadOnly:  spec.ReadOnly,
		Resources: resources,
	}
	p.Config.Pooler = cfg
	return nil
}

func orDefaultInt(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}
