package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/agentapi"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A setting that needs a restart is reported pending by every instance once its
// configuration changes, with the running and the new value; a reload-only one is not.
// POST /restart restarts a standby in place (streaming again, the setting applied) and
// is refused on a primary that has standbys.
func TestPendingRestartReportedAndStandbyRestarted(t *testing.T) {
	c := newCluster(t, 2)
	c.startAll()
	p, r := c.instances[0], c.instances[1]
	before, err := r.status()
	if err != nil {
		t.Fatal(err)
	}
	c.setConfig("parameters", map[string]string{"work_mem": "12MB", "log_min_messages": "warning", "shared_buffers": "24MB"})
	for _, in := range c.instances {
		testutil.Eventually(t, 30*time.Second, func() error {
			st, err := in.status()
			if err != nil {
				return err
			}
			want := []agentapi.PendingSetting{{Name: "shared_buffers", Value: "16MB", Pending: "24MB"}}
			if !slices.Equal(st.PendingRestart, want) {
				return fmt.Errorf("%s: pending %+v, want %+v", in.pod, st.PendingRestart, want)
			}
			return nil
		})
	}
	if got := p.show("work_mem"); got != "12MB" {
		t.Errorf("work_mem on the primary = %s, want 12MB (reloaded)", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.api().Restart(ctx); !errors.Is(err, agentapi.ErrConflict) {
		t.Errorf("restarting the primary of a cluster with a standby: %v, want a conflict", err)
	}
	st, err := r.api().Restart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.StartedAt == nil || !st.StartedAt.After(*before.StartedAt) || len(st.PendingRestart) != 0 {
		t.Errorf("after the restart: started %v (before %v), pending %+v", st.StartedAt, before.StartedAt, st.PendingRestart)
	}
	if got := r.show("shared_buffers"); got != "24MB" {
		t.Errorf("shared_buffers on the standby = %s, want 24MB", got)
	}
	waitStreaming(t, p, r, 30*time.Second)
}

// show is SHOW name on the instance.
func (in *instance) show(name string) string {
	in.c.t.Helper()
	var v string
	in.withConn(func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	})
	return v
}

// waitStreaming waits until primary reports standby streaming from it.
func waitStreaming(t testing.TB, primary, standby *instance, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		st, err := primary.status()
		if err != nil {
			return err
		}
		for _, r := range st.Replicas {
			if r.Name == standby.pod && r.State == "streaming" {
				return nil
			}
		}
		return fmt.Errorf("%s does not stream from %s: %+v", standby.pod, primary.pod, st.Replicas)
	})
}
