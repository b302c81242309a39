package failover

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// upgradeReasons map the primary's agent's upgrade phases to the condition's reasons.
var upgradeReasons = map[string]string{
	agentapi.UpgradeChecking:  dbv1.ReasonUpgradeChecking,
	agentapi.UpgradeUpgrading: dbv1.ReasonUpgrading,
	agentapi.UpgradeAnalysing: dbv1.ReasonUpgradeAnalysing,
	agentapi.UpgradeCompleted: dbv1.ReasonUpgradeCompleted,
	agentapi.UpgradeFailed:    dbv1.ReasonUpgradeFailed,
}

// UpgradeReport is where a major version upgrade stands, from the holder's agent: its
// phase, except that a completed upgrade is ReplicasCloning until every one of
// expected runs the new major, ready. Nil when the holder reports no upgrade (an
// agent that restarted since reports none: the last report stands).
func UpgradeReport(holder string, instances []Instance, expected []string) *report.Upgrade {
	i := find(instances, holder)
	if i == nil || !i.Reachable || i.Status.Upgrade == nil {
		return nil
	}
	u := i.Status.Upgrade
	r := &report.Upgrade{From: u.From, To: u.To, Reason: upgradeReasons[u.Phase], Message: u.Message, Since: u.Since, WritesStoppedMillis: u.WritesStoppedMillis}
	if r.Reason == "" {
		return nil
	}
	if r.Reason != dbv1.ReasonUpgradeCompleted {
		return r
	}
	var behind []string
	for _, name := range expected {
		j := find(instances, name)
		if j == nil || !j.Reachable || !j.Status.Ready || strconv.Itoa(j.Status.PostgresVersion/10000) != u.To {
			behind = append(behind, name)
		}
	}
	if len(behind) > 0 {
		slices.Sort(behind)
		r.Reason = dbv1.ReasonUpgradeReplicasCloning
		r.Message = fmt.Sprintf("%s; waiting for %s to clone the upgraded primary", u.Message, strings.Join(behind, ", "))
	}
	return r
}

// recordUpgrade records where a major version upgrade stands, with an event each time
// its reason changes.
func (c *cycle) recordUpgrade(ctx context.Context) error {
	var expected []string
	for i := range c.cluster.Spec.Replicas {
		expected = append(expected, c.cluster.InstanceName(int(i)))
	}
	u := UpgradeReport(primarylease.Parse(c.lease).Holder, c.instances, expected)
	if u == nil {
		return nil
	}
	last := c.reported.Upgrade
	if last != nil && last.Reason == u.Reason && last.Message == u.Message && last.To == u.To {
		return nil
	}
	if last != nil && last.To == u.To && last.Reason == dbv1.ReasonUpgradeCompleted && u.Reason == dbv1.ReasonUpgradeReplicasCloning {
		return nil // completed once on every instance: a standby restarting later is not the upgrade's
	}
	if err := c.record(ctx, report.KeyUpgrade, u); err != nil {
		return fmt.Errorf("recording the major version upgrade: %w", err)
	}
	c.reported.Upgrade = u
	if last == nil || last.Reason != u.Reason || last.To != u.To {
		kind := corev1.EventTypeNormal
		if u.Reason == dbv1.ReasonUpgradeFailed {
			kind = corev1.EventTypeWarning
		}
		c.r.recorder.Eventf(c.cluster, kind, u.Reason, "PostgreSQL %s → %s: %s", u.From, u.To, u.Message)
		if u.Reason == dbv1.ReasonUpgradeReplicasCloning || u.Reason == dbv1.ReasonUpgradeCompleted {
			return c.backUpUpgrade(ctx, u.To)
		}
	}
	return nil
}

// backUpUpgrade asks for a base backup of the upgraded data, once the new major's
// primary runs, when the cluster has a backup store: the older major's base backups
// cannot restore it, and its set-aside data is kept until one exists.
func (c *cycle) backUpUpgrade(ctx context.Context, to string) error {
	if c.cluster.Spec.Backup == nil {
		return nil
	}
	b := &dbv1.PostgresBackup{
		ObjectMeta: metav1.ObjectMeta{Name: UpgradeBackupName(c.cluster.Name, to), Namespace: c.cluster.Namespace,
			Labels: map[string]string{dbv1.LabelCluster: c.cluster.Name}},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: c.cluster.Name}, Method: "basebackup"},
	}
	switch err := c.r.client.Create(ctx, b); {
	case apierrors.IsAlreadyExists(err):
	case err != nil:
		return fmt.Errorf("asking for a base backup of the upgraded data: %w", err)
	default:
		c.log("Asked for a base backup of the upgraded data", "backup", b.Name)
	}
	return nil
}

// UpgradeBackupName is the PostgresBackup taken after cluster's upgrade to major to.
func UpgradeBackupName(cluster, to string) string { return cluster + "-upgraded-" + to }
