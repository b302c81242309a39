package helmmanager

import (
	"context"
	"fmt"
	"time"

	helmclient "github.com/operator-framework/helm-operator-plugins/pkg/client"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// A release left pending.
//
// Helm marks the revision an operation writes pending (pending-install,
// pending-upgrade, pending-rollback) when the operation begins, and deployed or failed
// when it ends; it refuses every operation on a release whose latest revision is
// pending ("another operation (install/upgrade/rollback) is in progress"). An operation
// that never ends leaves it so: a process killed mid-way, or an upgrade that failed and
// whose rollback then failed too, as a new operator version's did while OLM swapped the
// two versions' RBAC (its reads forbidden for a moment; docs/install.md).
// helm-operator-plugins v0.8.0 does not recover such a release: every reconcile after
// fails, the cluster is Irreconcilable and nothing of its spec is rendered again.
//
// Only the elected manager runs Helm operations, and the reconciler runs one reconcile
// of a resource at a time, every operation on its release within it: when a reconcile
// begins, no operation of this process is running on the release. A pending revision
// this process wrote (numbered above the latest revision it found before its first
// operation on the release) is orphaned then, and marked failed at once; the reconcile
// goes on to upgrade as after any failed revision. One written by an earlier leader is
// taken to be orphaned once it has been pending orphanAfter: a manager that loses its
// election exits at once, but one frozen (a stopped node, a paused container) can go on
// for a moment when it resumes, before it learns it no longer leads.
const orphanAfter = 30 * time.Second

// orphaned reports whether rel, the latest revision of key's release, is a pending
// revision no operation will end, as of now.
func (r *releases) orphaned(key types.NamespacedName, rel *release.Release, now time.Time) bool {
	if rel == nil || rel.Info == nil || !rel.Info.Status.IsPending() {
		return false
	}
	r.mu.Lock()
	base, wrote := r.ours[key]
	r.mu.Unlock()
	if wrote && rel.Version > base {
		return true
	}
	return now.Sub(rel.Info.LastDeployed.Time) >= orphanAfter
}

// operating records that this process is about to run an operation on key's release,
// whose latest revision is numbered latest (0: none): every revision above the first
// such number is this process's.
func (r *releases) operating(key types.NamespacedName, latest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ours[key]; !ok {
		r.ours[key] = latest
	}
}

// markFailed is how an orphaned revision is marked failed: through the storage driver
// the reconciler's own operations use, in the resource's namespace, with its owner
// reference.
type markFailed func(rel *release.Release) error

func failMarker(ctx context.Context, configs helmclient.ActionConfigGetter, obj client.Object) markFailed {
	return func(rel *release.Release) error {
		cfg, err := configs.ActionConfigFor(ctx, obj)
		if err != nil {
			return err
		}
		was, description := rel.Info.Status, rel.Info.Description
		rel.SetStatus(release.StatusFailed, fmt.Sprintf("%s left by an operation that did not end (marked failed by the operator)", was))
		if err := cfg.Releases.Update(rel); err != nil {
			rel.SetStatus(was, description)
			return fmt.Errorf("marking revision %d of release %s failed: %w", rel.Version, rel.Name, err)
		}
		log.FromContext(ctx).Info("Marked a release revision left pending failed", "release", rel.Name, "revision", rel.Version,
			"was", string(was), "since", rel.Info.LastDeployed.Time.UTC().Format(time.RFC3339))
		return nil
	}
}
