package pg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// A setting that needs a restart is reported pending by every instance once its
// configuration changes, with the running and the new value; a reload-only one is not.
// POST /restart restarts a standby in place (streaming again, the setting applied) and
// is refused on a primary that has standbys.
func TestPendingRestartReportedAndStandbyRestarted(t *testing.T) {
	t.Parallel()
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

// setParameters changes spec.postgresql.parameters and, once the operator has rendered
// them into the ConfigMap, updates the instances' config.json as the kubelet does.
func (c *cluster) setParameters(params map[string]string) {
	c.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var pgc dbv1.PostgresCluster
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
			return err
		}
		pgc.Spec.PostgreSQL.Parameters = params
		return k8s.Update(ctx, &pgc)
	})
	if err != nil {
		c.t.Fatal(err)
	}
	var cm corev1.ConfigMap
	testutil.Eventually(c.t, time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: dbv1.NamesOf(c.name).ConfigMap()}, &cm); err != nil {
			return err
		}
		var cfg struct {
			Parameters map[string]string `json:"parameters"`
		}
		if err := json.Unmarshal([]byte(cm.Data["config.json"]), &cfg); err != nil {
			return err
		}
		if !maps.Equal(cfg.Parameters, params) {
			return fmt.Errorf("the ConfigMap has parameters %v, want %v", cfg.Parameters, params)
		}
		return nil
	})
	path := filepath.Join(c.dir, "config.json")
	mustWrite(c.t, path+".tmp", []byte(c.mountVolumes(cm.Data["config.json"])))
	if err := os.Rename(path+".tmp", path); err != nil {
		c.t.Fatal(err)
	}
}

// condition is the cluster's condition of type t, nil when it has none.
func (c *cluster) condition(t string) *dbv1.Condition {
	var pgc dbv1.PostgresCluster
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: c.namespace, Name: c.name}, &pgc); err != nil {
		return nil
	}
	return dbv1.FindCondition(pgc.Status.Conditions, t)
}

// postmasterStarts records, every 100 ms until stop is called, each start time of
// every instance's postmaster its agent reports.
func (c *cluster) postmasterStarts() (stop func() map[string][]time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	seen := map[string][]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, in := range c.instances {
				st, err := in.status()
				if err != nil || st.StartedAt == nil {
					continue
				}
				if s := seen[in.pod]; len(s) == 0 || !s[len(s)-1].Equal(*st.StartedAt) {
					seen[in.pod] = append(s, *st.StartedAt)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() map[string][]time.Time { cancel(); <-done; return seen }
}

// A setting that needs a restart, changed in spec.postgresql.parameters while a writer
// commits through the read-write Service: every instance restarts exactly once and runs
// with the new value, the standbys first and the primary after a switchover (not a
// failover), no acknowledged row is lost, and the PendingRestart condition clears. A
// reload-only setting changed before restarts nothing. Asynchronous and synchronous
// (one standby confirms each commit, so a restarting standby leaves the rule).
func TestRestartSettingRollsStandbysFirstPrimaryBySwitchover(t *testing.T) {
	t.Parallel()
	for _, k := range []int32{0, 1} {
		t.Run(fmt.Sprintf("synchronousReplicas=%d", k), func(t *testing.T) { rollRestartSetting(t, k) })
	}
}

func rollRestartSetting(t *testing.T, synchronous int32) {
	params := map[string]string{"shared_buffers": "16MB", "work_mem": "4MB"}
	c := newOperatedCluster(t, 3, func(p *dbv1.PostgresCluster) {
		p.Spec.PostgreSQL.Parameters = maps.Clone(params)
		p.Spec.PostgreSQL.SynchronousReplicas = synchronous
	})
	startOperated(t, c)
	old := c.instances[0]
	testutil.Eventually(t, time.Minute, func() error {
		if cond := c.condition(dbv1.ConditionPendingRestart); cond == nil || cond.Status != metav1.ConditionFalse {
			return fmt.Errorf("PendingRestart is %+v, want False", cond)
		}
		return nil
	})
	stopWatching := c.postmasterStarts()

	params["work_mem"] = "12MB"
	c.setParameters(maps.Clone(params))
	for _, in := range c.instances {
		testutil.Eventually(t, 30*time.Second, func() error {
			if got := in.show("work_mem"); got != "12MB" {
				return fmt.Errorf("%s: work_mem %s, want 12MB", in.pod, got)
			}
			return nil
		})
	}

	if err := c.writeThroughRW("CREATE TABLE acked (id bigint PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	w := testutil.StartWriter(c.rwTarget, testutil.WriterOptions{Table: "acked", FirstID: 1, Interval: 5 * time.Millisecond,
		PerStatementInterval: 100 * time.Millisecond})
	params["shared_buffers"] = "24MB"
	changed := time.Now()
	c.setParameters(maps.Clone(params))
	testutil.Eventually(t, 3*time.Minute, func() error {
		for _, in := range c.instances {
			if st, err := in.status(); err != nil || !st.Ready || len(st.PendingRestart) > 0 {
				return fmt.Errorf("%s: ready %v, pending %+v, %v", in.pod, st.Ready, st.PendingRestart, err)
			}
			if got := in.show("shared_buffers"); got != "24MB" {
				return fmt.Errorf("%s: shared_buffers %s, want 24MB", in.pod, got)
			}
		}
		if cond := c.condition(dbv1.ConditionPendingRestart); cond == nil || cond.Status != metav1.ConditionFalse {
			return fmt.Errorf("PendingRestart is %+v, want False", cond)
		}
		return nil
	})
	// The pods' readiness follows the agents' by a probe period, and their role labels
	// follow the Lease by a reconcile, so the Service catches up a moment after the
	// agents report the roll done.
	var next *instance
	testutil.Eventually(t, 15*time.Second, func() error {
		if next = c.readWrite(); next == nil || next == old {
			return fmt.Errorf("the read-write Service routes to %v, want a new primary", next)
		}
		return nil
	})
	time.Sleep(time.Second)
	attempts := w.Stop()
	starts := stopWatching()

	check := next.checkAcked(attempts)
	gap := testutil.Unavailability(attempts, changed, time.Now())
	t.Logf("%d of %d attempts acknowledged; %s is primary; writes unavailable for %s at most; postmaster starts %v",
		check.Acked, check.Attempted, next.pod, gap.Duration().Round(time.Millisecond), starts)
	if len(check.Lost) > 0 {
		t.Errorf("%d acknowledged rows lost: %v", len(check.Lost), check.Lost)
	}
	for _, in := range c.instances {
		if n := len(starts[in.pod]); n != 2 {
			t.Errorf("%s: postmaster start times %v, want the first and one restart", in.pod, starts[in.pod])
		}
	}
	if n := len(c.events(dbv1.ReasonRestartingInstance)); n != 2 {
		t.Errorf("%d RestartingInstance events, want one per standby (2)", n)
	}
	if !c.hasEvent(dbv1.ReasonSwitchingOverForRestart) || !c.hasEvent(dbv1.ReasonSwitchedOver) {
		t.Error("the primary was not moved by a switchover")
	}
	for _, reason := range []string{dbv1.ReasonFailoverStarted, dbv1.ReasonPrimaryFailed} {
		for _, e := range c.events(reason) {
			t.Errorf("a failover happened or was warned of: %s event at %s: %s", e.Reason, e.LastTimestamp, e.Message)
		}
	}
	if !c.hasEvent(dbv1.ReasonPendingRestartApplied) {
		t.Error("no PendingRestartApplied event")
	}
}

// The only instance of a cluster restarts in place on POST /restart: there is no
// standby to hand over to. Its data stays, and the setting is in force after.
func TestSingleInstanceRestartsInPlace(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	p := c.instances[0]
	p.start()
	before := p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("CREATE TABLE t AS SELECT 1 AS id")
	// shared_buffers leaves the file: back to the built-in default, in kB.
	c.setConfig("parameters", map[string]string{"max_connections": "90"})
	p.waitPending(agentapi.PendingSetting{Name: "max_connections", Value: "100", Pending: "90"}, agentapi.PendingSetting{Name: "shared_buffers", Value: "16MB", Pending: "131072kB"})
	p.restartInPlace(before)
	if got := p.show("max_connections"); got != "90" {
		t.Errorf("max_connections = %s, want 90", got)
	}
	if got := p.show("shared_buffers"); got != "128MB" {
		t.Errorf("shared_buffers = %s, want the default 128MB", got)
	}
	p.waitCount("t", 1, 10*time.Second)
}

// An instance is tuned from its container's resources (config.json's, from the spec):
// a 2Gi memory limit runs with shared_buffers 512MB and effective_cache_size to
// match; a parameter the user sets wins; new resources wait for a restart as any
// setting of its kind does, and the restart applies them.
func TestTunedFromResources(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	c.setConfig("parameters", map[string]string{"work_mem": "8MB"})
	c.setConfig("resources", tuning.Resources{MemoryBytes: 2 << 30, MemoryLimitBytes: 2 << 30, MilliCPU: 4000})
	p := c.instances[0]
	p.start()
	before := p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	for name, want := range map[string]string{
		"shared_buffers": "512MB", "effective_cache_size": "1536MB", "maintenance_work_mem": "128MB",
		"work_mem":             "8MB", // the user's, not the tuned 3932kB
		"max_parallel_workers": "4", "max_parallel_workers_per_gather": "2", "effective_io_concurrency": "200",
	} {
		if got := p.show(name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}

	c.setConfig("resources", tuning.Resources{MemoryBytes: 4 << 30, MemoryLimitBytes: 4 << 30, MilliCPU: 4000})
	p.waitPending(agentapi.PendingSetting{Name: "shared_buffers", Value: "512MB", Pending: "1024MB"})
	if got := p.show("effective_cache_size"); got != "3GB" {
		t.Errorf("effective_cache_size = %s after the reload, want 3GB", got)
	}
	p.restartInPlace(before)
	if got := p.show("shared_buffers"); got != "1GB" {
		t.Errorf("shared_buffers = %s after the restart, want 1GB", got)
	}
}

// waitPending waits up to 30 s until the instance reports exactly want waiting for a
// restart.
func (in *instance) waitPending(want ...agentapi.PendingSetting) {
	in.c.t.Helper()
	testutil.Eventually(in.c.t, 30*time.Second, func() error {
		st, err := in.status()
		if err != nil {
			return err
		}
		if !slices.Equal(st.PendingRestart, want) {
			return fmt.Errorf("pending %+v, want %+v", st.PendingRestart, want)
		}
		return nil
	})
}

// restartInPlace restarts a single primary through its agent's API and checks that it
// started again, after before's start, with nothing left waiting.
func (in *instance) restartInPlace(before agentapi.Status) {
	in.c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := in.api().Restart(ctx); err != nil {
		in.c.t.Fatal(err)
	}
	after := in.waitRole(agentapi.RolePrimary, 1, upTimeout)
	if !after.StartedAt.After(*before.StartedAt) || len(after.PendingRestart) != 0 {
		in.c.t.Errorf("after the restart: started %v (before %v), pending %+v", after.StartedAt, before.StartedAt, after.PendingRestart)
	}
}

// The agent reports what the operator's health conditions read: the sessions postgres
// admits (max_connections less those reserved for superusers) and its client sessions,
// and the database whose oldest unfrozen transaction ID is oldest, with that age.
func TestStatusReportsConnectionsAndTransactionIDs(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	c.setConfig("parameters", map[string]string{"max_connections": "40", "superuser_reserved_connections": "5"})
	p := c.instances[0]
	p.start()
	p.waitRole(agentapi.RolePrimary, 1, upTimeout)
	p.mustExec("CREATE TABLE burn (id bigint)")
	for range 20 {
		p.mustExec("INSERT INTO burn VALUES (1)") // each its own transaction ID
	}
	st, err := p.status()
	if err != nil {
		t.Fatal(err)
	}
	reserved := 0
	if st.PostgresVersion >= 160000 {
		reserved, _ = strconv.Atoi(p.show("reserved_connections"))
	}
	if want := 40 - 5 - reserved; st.ConnectionLimit != want {
		t.Errorf("connectionLimit %d, want %d", st.ConnectionLimit, want)
	}
	if st.Connections < 1 || st.Connections > st.ConnectionLimit {
		t.Errorf("connections %d of %d", st.Connections, st.ConnectionLimit)
	}
	if st.OldestXIDAge < 20 || st.OldestXIDDatabase == "" {
		t.Errorf("oldest transaction ID: %d in %q; want at least the 20 just used, in a named database", st.OldestXIDAge, st.OldestXIDDatabase)
	}
}

// A setting PostgreSQL rejects on a running cluster (a reload keeps the previous value
// and says so only in its log; a restart would not start) is named in the
// ParametersApplied condition in PostgreSQL's words, with an event, and no instance is
// restarted for the restart setting beside it; fixed, the condition clears. So is a
// shared_buffers beyond the memory an instance has.
func TestRejectedSettingIsToldAndNothingRestarts(t *testing.T) {
	t.Parallel()
	c := newOperatedCluster(t, 2)
	startOperated(t, c)
	applied := func(status metav1.ConditionStatus, parts ...string) func() error {
		return func() error {
			cond := c.condition(dbv1.ConditionParametersApplied)
			if cond == nil || cond.Status != status {
				return fmt.Errorf("ParametersApplied is %+v, want %s", cond, status)
			}
			for _, p := range parts {
				if !strings.Contains(cond.Message, p) {
					return fmt.Errorf("ParametersApplied message %q lacks %q", cond.Message, p)
				}
			}
			return nil
		}
	}
	testutil.Eventually(t, time.Minute, applied(metav1.ConditionTrue))
	stopWatching := c.postmasterStarts()

	c.setParameters(map[string]string{"work_mem": "lots", "shared_buffers": "lots", "maintenance_work_mem": "100MB"})
	testutil.Eventually(t, time.Minute, applied(metav1.ConditionFalse,
		`invalid value for parameter "work_mem": "lots"`, `invalid value for parameter "shared_buffers": "lots"`, c.instances[1].pod+": "))
	if !c.hasEvent(dbv1.ReasonParametersRejected) {
		t.Error("no ParametersRejected event")
	}
	// The valid change beside them is applied; the rejected ones keep their values.
	for _, in := range c.instances {
		testutil.Eventually(t, 30*time.Second, func() error {
			if got := in.show("maintenance_work_mem"); got != "100MB" {
				return fmt.Errorf("%s: maintenance_work_mem %s, want 100MB", in.pod, got)
			}
			return nil
		})
		if got := in.show("work_mem"); got != "4MB" {
			t.Errorf("%s: work_mem %s, want the default 4MB kept", in.pod, got)
		}
	}
	// Long enough for the restart controller to have acted (it looks every 2 s).
	time.Sleep(10 * time.Second)
	for _, in := range c.instances {
		if st, err := in.status(); err != nil || !st.Ready {
			t.Errorf("%s: ready %v (%v) while a setting is rejected", in.pod, st.Ready, err)
		}
	}
	if c.hasEvent(dbv1.ReasonRestartingInstance) {
		t.Error("an instance was restarted with settings it would not start with")
	}

	c.setParameters(map[string]string{"work_mem": "8MB"})
	testutil.Eventually(t, time.Minute, applied(metav1.ConditionTrue))
	if !c.hasEvent(dbv1.ReasonParametersApplied) {
		t.Error("no ParametersApplied event")
	}
	for _, in := range c.instances {
		if got := in.show("work_mem"); got != "8MB" {
			t.Errorf("%s: work_mem %s, want 8MB", in.pod, got)
		}
	}

	// PostgreSQL accepts shared_buffers beyond the machine's memory (and ran with it,
	// overcommitted, until its buffers filled): with no memory limit to refuse it against
	// before rendering, the agents compare it with the memory they have.
	beyond := machineMemoryGB(t) * 2
	c.setParameters(map[string]string{"work_mem": "8MB", "shared_buffers": fmt.Sprintf("%dGB", beyond)})
	testutil.Eventually(t, time.Minute, applied(metav1.ConditionFalse, fmt.Sprintf("shared_buffers %dMB does not fit in the", beyond<<10),
		"postgres would be killed once its buffers fill"))
	time.Sleep(10 * time.Second)
	if c.hasEvent(dbv1.ReasonRestartingInstance) {
		t.Error("an instance was restarted with shared_buffers beyond its memory")
	}
	c.setParameters(map[string]string{"work_mem": "8MB"})
	testutil.Eventually(t, time.Minute, applied(metav1.ConditionTrue))

	for pod, starts := range stopWatching() {
		if len(starts) != 1 {
			t.Errorf("%s: postmaster started at %v, want no restart", pod, starts)
		}
	}
}

// machineMemoryGB is this machine's memory (MemTotal), in whole GiB rounded up.
func machineMemoryGB(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kB, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return (kB + 1<<20 - 1) >> 20
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
