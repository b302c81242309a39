//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// explainWithin is how long a careless spec may take to be explained in the cluster's
// Ready condition: the agent's error is recorded once it lasted 15 s, a pod's problem
// once it lasted 15 s, and the instance must first be tried.
const explainWithin = 2 * time.Minute

// Specs an instance cannot run with are explained where the user looks, each in the
// words of whoever knows: PostgreSQL's own for a parameter it rejects, the kubelet's
// for a container killed for memory, the operator's for requests above limits (which the
// API server would refuse only to the StatefulSet), the scheduler's for a volume claim
// that does not exist.
func TestCarelessSpecsAreExplained(t *testing.T) {
	cases := []struct {
		name   string
		change func(*dbv1.PostgresCluster)
		// want: any of these in the Ready condition's message.
		want []string
	}{
		{"a parameter postgres rejects", func(c *dbv1.PostgresCluster) {
			c.Spec.PostgreSQL.Parameters = map[string]string{"work_mem": "lots"}
		}, []string{`invalid value for parameter "work_mem": "lots"`}},
		{"a 20Mi memory limit", func(c *dbv1.PostgresCluster) {
			c.Spec.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("20Mi")}}
		}, []string{"OOMKilled", "killed"}},
		{"requests above limits", func(c *dbv1.PostgresCluster) {
			c.Spec.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
		}, []string{"spec.resources: requests.cpu 2 is above limits.cpu 1"}},
		{"a backup claim that does not exist", func(c *dbv1.PostgresCluster) {
			c.Spec.Backup = &dbv1.BackupSpec{Store: dbv1.BackupStore{Volume: &dbv1.VolumeStore{ClaimName: "no-such-claim"}}}
		}, []string{`persistentvolumeclaim "no-such-claim" not found`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDB(t, 1, tc.change)
			start := time.Now()
			testutil.Eventually(t, explainWithin, func() error {
				pgc := d.cluster()
				ready := dbv1.FindCondition(pgc.Status.Conditions, dbv1.ConditionReady)
				if ready == nil {
					return fmt.Errorf("no Ready condition")
				}
				for _, w := range tc.want {
					if strings.Contains(ready.Message, w) {
						t.Logf("explained after %s: %s: %s", time.Since(start).Round(time.Second), ready.Reason, ready.Message)
						return nil
					}
				}
				return fmt.Errorf("Ready %s: %q; want one of %q", ready.Reason, ready.Message, tc.want)
			})
		})
	}
}

// A 2Gi memory limit runs with a quarter of it as shared_buffers and three quarters as
// effective_cache_size, without a parameter.
func TestTunedFromTheMemoryLimit(t *testing.T) {
	d := newDB(t, 1, func(c *dbv1.PostgresCluster) {
		c.Spec.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}
	})
	d.waitHealthy(1, 5*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.conn(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for name, want := range map[string]string{"shared_buffers": "512MB", "effective_cache_size": "1536MB", "maintenance_work_mem": "128MB"} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
