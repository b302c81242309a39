package helmmanager

import (
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/release"
	helmtime "helm.sh/helm/v3/pkg/time"
	"k8s.io/apimachinery/pkg/types"
)

// A pending revision is orphaned when this process wrote it (its operations have all
// returned when a reconcile begins), or, when an earlier leader did, once it has been
// pending orphanAfter; a revision that is not pending never is.
func TestOrphanedPendingRevisions(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	key := types.NamespacedName{Namespace: "ns", Name: "db"}
	revision := func(version int, status release.Status, age time.Duration) *release.Release {
		return &release.Release{Name: "db", Version: version,
			Info: &release.Info{Status: status, LastDeployed: helmtime.Time{Time: now.Add(-age)}}}
	}
	for _, tc := range []struct {
		name string
		// ours is the latest revision before this process's first operation; -1 when it
		// ran none.
		ours int
		rel  *release.Release
		want bool
	}{
		{"deployed, long ago", -1, revision(2, release.StatusDeployed, time.Hour), false},
		{"failed", -1, revision(2, release.StatusFailed, time.Hour), false},
		{"no release", -1, nil, false},
		{"an earlier leader's, just begun", -1, revision(2, release.StatusPendingUpgrade, time.Second), false},
		{"an earlier leader's, pending for orphanAfter", -1, revision(2, release.StatusPendingUpgrade, orphanAfter), true},
		{"an earlier leader's install", -1, revision(1, release.StatusPendingInstall, 2*orphanAfter), true},
		{"an earlier leader's rollback, just begun", -1, revision(3, release.StatusPendingRollback, time.Second), false},
		{"this process's upgrade, its rollback failed", 1, revision(2, release.StatusPendingUpgrade, time.Second), true},
		{"this process's rollback", 1, revision(3, release.StatusPendingRollback, 0), true},
		{"this process's install", 0, revision(1, release.StatusPendingInstall, 0), true},
		{"before this process's first operation", 2, revision(2, release.StatusPendingUpgrade, time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReleases()
			if tc.ours >= 0 {
				r.operating(key, tc.ours)
				r.operating(key, tc.ours+5) // a later operation: the first one's revision counts
			}
			if got := r.orphaned(key, tc.rel, now); got != tc.want {
				t.Errorf("orphaned = %v, want %v", got, tc.want)
			}
		})
	}
	r := newReleases()
	r.operating(key, 0)
	r.gone(key)
	if r.orphaned(key, revision(1, release.StatusPendingInstall, time.Second), now) {
		t.Error("a deleted resource's new release is taken for this process's")
	}
}
