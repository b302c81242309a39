package opmetrics

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Only the replica that leads reports the clusters: each replica has them in its cache,
// and a sum over the operator's pods would count every cluster twice.
func TestClusterCollectorReportsWhileElected(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := dbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(&dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "my-db"}}).Build()
	elected := make(chan struct{})
	c := &clusterCollector{reader: reader, elected: elected, log: logr.Discard()}
	count := func() int {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		n, err := testutil.GatherAndCount(reg)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Errorf("a standby replica reported %d series, want none", n)
	}
	close(elected)
	if n := count(); n == 0 {
		t.Error("the leader reported no series for its cluster")
	}
}
