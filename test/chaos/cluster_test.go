//go:build chaos

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/test/testutil"
)

// instances is the size of every cluster of the suite.
const instances = 3

// mode is a replication mode the faults are run in.
type mode struct {
	name string
	// synchronousReplicas is spec.postgresql.synchronousReplicas.
	synchronousReplicas int32
	// localCommit: before every round the application owner runs ALTER DATABASE app
	// SET synchronous_commit = local (it owns the database, so PostgreSQL lets it), and
	// the round adds the writer whose sessions SET synchronous_commit = local
	// (testutil.WriterLocal).
	localCommit bool
	// lossBudget is spec.postgresql.lossBudget in bytes; 0 leaves it unset.
	lossBudget int64
	// pooler: the cluster has spec.pooler, and the writers go through <name>-pooler-rw
	// (PgBouncer, transaction pooling) instead of -rw; the probe still asks every
	// instance directly.
	pooler bool
}

var modes = []mode{
	{name: "async"},
	{name: "async-budget", lossBudget: lossBudget},
	{name: "sync", synchronousReplicas: 1},
	{name: "sync-local", synchronousReplicas: 1, localCommit: true},
	{name: "async-pooler", pooler: true},
	{name: "sync-pooler", synchronousReplicas: 1, pooler: true},
}

// lossBudget is the async-budget mode's spec.postgresql.lossBudget: small enough that
// a primary cut from its standbys but not from its clients, which loses every commit
// it acknowledges within T without a budget (hundreds of rows), stops at it.
const lossBudget = 8 << 10

// minRowWAL is the least WAL one acknowledged row of the writers costs: its own
// transaction's heap insert record and commit record. A loss of n rows is at least
// n × minRowWAL bytes of acknowledged WAL no standby had.
const minRowWAL = 100

// cluster is the PostgresCluster the faults of one mode hit, in a namespace of its own
// (restricted Pod Security). A cluster that does not recover from a fault is replaced
// by a new one, in a new namespace, so that the next faults start from health.
type cluster struct {
	mode mode
	gen  int
	ns   string
	name string

	// rw is the connection to the -rw Service as the application owner; app the same
	// settings, for a pod's own address.
	rw *pgx.ConnConfig
	// pooled is the connection to the -pooler-rw Service (pooler modes), nil otherwise.
	pooled *pgx.ConnConfig

	// nextID is the first id of the next round's writer; history holds every attempt
	// on this cluster's table so far, and lost the acknowledged ids already reported
	// missing, so that a row lost by a later fault is reported by that fault's round.
	nextID  int64
	history []testutil.Attempt
	lost    map[int64]bool
	// byID finds an attempt of history by its ID; torn holds the bulk transactions
	// already reported torn.
	byID map[int64]testutil.Attempt
	torn map[int64]bool
}

// newCluster creates a cluster for mode and waits until it is Healthy with every
// replica streaming, and the writer's and probe's tables exist.
func newCluster(t testing.TB, m mode, gen int) *cluster {
	t.Helper()
	// A namespace of an earlier run may still be terminating: the run's start time
	// keeps the names apart.
	c := &cluster{mode: m, gen: gen, ns: fmt.Sprintf("chaos-%s-%s-%d", runID, m.name, gen), name: "chaos",
		nextID: 1, lost: map[int64]bool{}, byID: map[int64]testutil.Attempt{}, torn: map[int64]bool{}}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pgc := &dbv1.PostgresCluster{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: c.ns},
		Spec: dbv1.PostgresClusterSpec{Replicas: instances, Version: settings.pgMajor}}
	pgc.Spec.PostgreSQL.SynchronousReplicas = m.synchronousReplicas
	if m.lossBudget > 0 {
		pgc.Spec.PostgreSQL.LossBudget = resource.NewQuantity(m.lossBudget, resource.BinarySI)
	}
	if m.pooler {
		// One pod: the faults hit the instances, not the pooler; query_wait_timeout
		// bounds how long a writer's statement waits for a primary.
		pgc.Spec.Pooler = &dbv1.PoolerSpec{Instances: 1, Parameters: map[string]string{"query_wait_timeout": "30"}}
	}
	if err := k8s.Create(ctx, pgc); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.waitRecovered(10 * time.Minute); err != nil {
		c.dump(t, start)
		t.Fatalf("cluster %s/%s not Healthy with every replica streaming: %v", c.ns, c.name, err)
	}
	var err error
	if c.rw, err = c.connConfig(ctx, dbv1.NamesOf(c.name).ReadWriteService()); err != nil {
		t.Fatal(err)
	}
	if m.pooler {
		testutil.Eventually(t, 5*time.Minute, func() error {
			pgc, err := c.get(ctx)
			if err != nil {
				return err
			}
			if p := pgc.Status.Pooler; p == nil || p.ReadyInstances < 1 {
				return fmt.Errorf("status.pooler %+v", p)
			}
			return nil
		})
		if c.pooled, err = c.connConfig(ctx, dbv1.NamesOf(c.name).PoolerReadWrite()); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		"CREATE TABLE acked (id bigint PRIMARY KEY)",
		"CREATE TABLE probe (instance text NOT NULL, at timestamptz NOT NULL DEFAULT now())",
		"CREATE TABLE bulk (txn bigint NOT NULL, n int NOT NULL)",
	} {
		// -rw routes to the primary a moment after it is ready (endpoints, kube-proxy).
		testutil.Eventually(t, time.Minute, func() error { return c.exec(ctx, sql) })
	}
	t.Logf("cluster %s/%s (%s) Healthy with %d instances streaming after %s", c.ns, c.name, m.name, instances,
		time.Since(start).Round(time.Second))
	return c
}

// delete removes the cluster's namespace without waiting.
func (c *cluster) delete() {
	_ = k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})
}

func (c *cluster) get(ctx context.Context) (dbv1.PostgresCluster, error) {
	var pgc dbv1.PostgresCluster
	err := k8s.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.name}, &pgc)
	return pgc, err
}

func (c *cluster) pods(ctx context.Context) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := k8s.List(ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels{dbv1.LabelCluster: c.name})
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods.Items, err
}

func (c *cluster) pod(ctx context.Context, name string) (corev1.Pod, error) {
	var p corev1.Pod
	err := k8s.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: name}, &p)
	return p, err
}

// primary returns the pod status.currentPrimary names.
func (c *cluster) primary(ctx context.Context) (corev1.Pod, error) {
	pgc, err := c.get(ctx)
	if err != nil {
		return corev1.Pod{}, err
	}
	if pgc.Status.CurrentPrimary == "" {
		return corev1.Pod{}, fmt.Errorf("status.currentPrimary is empty")
	}
	return c.pod(ctx, pgc.Status.CurrentPrimary)
}

// recovered returns nil when the cluster is Healthy with every instance ready, and the
// current primary's agent reports itself primary with every other instance streaming.
func (c *cluster) recovered(ctx context.Context) error {
	pgc, err := c.get(ctx)
	if err != nil {
		return err
	}
	if pgc.Status.Phase != dbv1.PhaseHealthy || pgc.Status.ReadyInstances != instances || pgc.Status.CurrentPrimary == "" {
		return fmt.Errorf("phase %s, %d ready instances, primary %q", pgc.Status.Phase, pgc.Status.ReadyInstances, pgc.Status.CurrentPrimary)
	}
	p, err := c.pod(ctx, pgc.Status.CurrentPrimary)
	if err != nil {
		return err
	}
	st, _, err := agentStatus(ctx, p)
	if err != nil {
		return fmt.Errorf("agent of %s: %w", p.Name, err)
	}
	var streaming []string
	for _, r := range st.Replicas {
		if r.State == "streaming" {
			streaming = append(streaming, r.Name)
		}
	}
	if st.Role != "primary" || len(streaming) != instances-1 {
		return fmt.Errorf("%s reports role %s with standbys %v streaming", p.Name, st.Role, streaming)
	}
	return nil
}

// waitRecovered polls recovered until it returns nil or timeout passes, and returns
// its last error then.
func (c *cluster) waitRecovered(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.recovered(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// restartLimit is how many times a pod's containers may have restarted before the
// suite recreates the pod ahead of a round. The kubelet doubles a container's restart
// delay with every exit (10 s, 20 s, 40 s, ... up to 5 min) and forgets it only after
// 10 minutes without one. The suite kills the same containers many times within that,
// which no real node sees, and a round would then time the kubelet's back-off rather
// than pgpilot. A new pod (same name, same volume) starts without one.
const restartLimit = 3

// restarts is the most restarts of any container of p.
func restarts(p corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n = max(n, cs.RestartCount)
	}
	return n
}

// renewBackOff recreates, one at a time, each pod of c and each operator pod whose
// containers restarted restartLimit times or more, and waits until the cluster is
// recovered after each. Writers are not running: nothing here is measured. It returns
// the names of the pods it recreated.
func (c *cluster) renewBackOff(ctx context.Context) ([]string, error) {
	pods, err := c.pods(ctx)
	if err != nil {
		return nil, err
	}
	ops, err := operatorPods(ctx)
	if err != nil {
		return nil, err
	}
	var renewed []string
	for _, p := range append(pods, ops...) {
		if restarts(p) < restartLimit {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err := k8s.Delete(dctx, &p)
		if err == nil || apierrors.IsNotFound(err) {
			err = gone(dctx, p)
		}
		if err == nil && p.Namespace == operatorNamespace {
			err = operatorReady(dctx)
		}
		cancel()
		if err != nil {
			return renewed, fmt.Errorf("recreating %s after %d restarts: %w", p.Name, restarts(p), err)
		}
		if err := c.waitRecovered(10 * time.Minute); err != nil {
			return renewed, fmt.Errorf("recreating %s after %d restarts: %w", p.Name, restarts(p), err)
		}
		renewed = append(renewed, fmt.Sprintf("%s (%d restarts)", p.Name, restarts(p)))
	}
	return renewed, nil
}

// connConfig returns the settings of a connection as the application owner to the -rw
// Service, by its cluster IP (the suite runs in the node's network namespace, where
// kube-proxy routes it).
func (c *cluster) connConfig(ctx context.Context, service string) (*pgx.ConnConfig, error) {
	var s corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: service}, &s); err != nil {
		return nil, err
	}
	var secret corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: dbv1.NamesOf(c.name).AppSecret()}, &secret); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 dbname=app user=%s sslmode=require connect_timeout=3",
		s.Spec.ClusterIP, secret.Data["username"]))
	if err != nil {
		return nil, err
	}
	cfg.Password = string(secret.Data["password"])
	return cfg, nil
}

// at returns c.rw pointed at host instead of the Service.
func (c *cluster) at(host string) *pgx.ConnConfig {
	cfg := c.rw.Copy()
	cfg.Host = host
	return cfg
}

// rwTarget is the writer's endpoint: the -rw Service, or the -pooler-rw Service in a
// pooler mode.
func (c *cluster) rwTarget(context.Context) (*pgx.ConnConfig, error) {
	if c.pooled != nil {
		return c.pooled, nil
	}
	return c.rw, nil
}

// poolerIPs are the addresses of the cluster's pooler pods (none without a pooler).
func (c *cluster) poolerIPs(ctx context.Context) ([]string, error) {
	if c.pooled == nil {
		return nil, nil
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(c.ns), client.MatchingLabels{"db.example.com/pooler": c.name}); err != nil {
		return nil, err
	}
	var ips []string
	for _, p := range pods.Items {
		if p.Status.PodIP != "" {
			ips = append(ips, p.Status.PodIP)
		}
	}
	return ips, nil
}

// probeTargets lists every instance pod that has an address.
func (c *cluster) probeTargets(ctx context.Context) ([]testutil.ProbeTarget, error) {
	pods, err := c.pods(ctx)
	if err != nil {
		return nil, err
	}
	var ts []testutil.ProbeTarget
	for _, p := range pods {
		// A pod being deleted is probed too: until its containers stop it may still
		// acknowledge commits.
		if p.Status.PodIP != "" {
			ts = append(ts, testutil.ProbeTarget{Instance: p.Name, Config: c.at(p.Status.PodIP)})
		}
	}
	return ts, nil
}

func (c *cluster) exec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := testutil.Connect(ctx, c.rw, nil)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// lossBound is how long after the fault a commit that skipped the commit gate (a
// session's synchronous_commit = local, a commit cancelled while it waited) may still
// have been acknowledged and then lost: an old primary stops acknowledging anything T
// (4 s) after its last confirmation, which came before the fault, and the margin (1 s)
// covers its clock (docs/failover.md).
const lossBound = 5 * time.Second

// losses sorts the acknowledged rows one round found missing.
type losses struct {
	// strict: rows whose commit waited for the gate (or that no gate was asked for,
	// in asynchronous mode): every writer's but the local sessions', and the
	// cancelling writer's commits that came without the WARNING.
	strict []int64
	// bounded: local-session commits and commits acknowledged with the WARNING,
	// acknowledged at most lossBound after the fault; late: the same, acknowledged
	// later, which no mode allows once the old primary stops itself.
	bounded, late []int64
	// bulk: the bulk writer's acknowledged transactions not wholly there (their IDs),
	// bulkRows their missing rows; torn: transactions partly there.
	bulk       []int64
	bulkRows   int
	torn       []int64
	from, to   time.Duration
	earlier    int
	haveSpan   bool
	bulkChecks int
}

// count is how many acknowledged rows were lost in all.
func (l losses) count() int { return len(l.strict) + len(l.bounded) + len(l.late) + l.bulkRows }

// span says when the lost rows of this round were acknowledged, relative to the fault,
// and how many were acknowledged in earlier rounds.
func (l losses) span() string {
	var parts []string
	if l.haveSpan {
		parts = append(parts, fmt.Sprintf("%+.1f s to %+.1f s", l.from.Seconds(), l.to.Seconds()))
	}
	if l.earlier > 0 {
		parts = append(parts, fmt.Sprintf("%d from earlier rounds", l.earlier))
	}
	return strings.Join(parts, "; ")
}

// show returns a setting as a new session of the application owner through -rw sees
// it, or the error.
func (c *cluster) show(ctx context.Context, setting string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := testutil.Connect(ctx, c.rw, nil)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SHOW "+setting).Scan(&v); err != nil {
		return err.Error()
	}
	return v
}

// checkRows reads the tables from the current primary's own address and compares them
// with every attempt on this cluster so far. It returns the check of this round's
// attempts and the acknowledged rows (of any round) missing now that no earlier round
// reported, sorted by what the commit promised, with when they were acknowledged
// relative to faultAt.
func (c *cluster) checkRows(round []testutil.Attempt, faultAt time.Time) (testutil.RowCheck, losses, error) {
	c.history = append(c.history, round...)
	for _, a := range round {
		c.byID[a.ID] = a
	}
	var (
		present map[int64]bool
		counts  map[int64]int
		err     error
	)
	// The primary was just found recovered; a few tries cover a blip.
	for try := 0; try < 5; try++ {
		if present, counts, err = c.readIDs(); err == nil {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		return testutil.RowCheck{}, losses{}, err
	}
	check := testutil.CompareRows(present, round)
	check.Lost, check.LostSyncWarned = nil, 0
	var l losses
	// The ids grow from round to round on a cluster.
	first := c.nextID
	for _, a := range round {
		first = min(first, a.ID)
	}
	note := func(a testutil.Attempt) {
		if a.ID < first {
			l.earlier++
			return
		}
		d := a.End.Sub(faultAt)
		if !l.haveSpan || d < l.from {
			l.from = d
		}
		if !l.haveSpan || d > l.to {
			l.to = d
		}
		l.haveSpan = true
	}
	for _, id := range testutil.CompareRows(present, c.history).Lost {
		if c.lost[id] {
			continue
		}
		c.lost[id] = true
		a := c.byID[id]
		check.Lost = append(check.Lost, id)
		if a.SyncWarning != "" {
			check.LostSyncWarned++
		}
		note(a)
		switch {
		case a.Writer != testutil.WriterLocal && a.SyncWarning == "":
			l.strict = append(l.strict, id)
		case a.End.Sub(faultAt) <= lossBound:
			l.bounded = append(l.bounded, id)
		default:
			l.late = append(l.late, id)
		}
	}
	bulk := testutil.CompareBulk(counts, c.history)
	for _, id := range bulk.Lost {
		if c.lost[id] {
			continue
		}
		c.lost[id] = true
		a := c.byID[id]
		note(a)
		l.bulk = append(l.bulk, id)
		l.bulkRows += a.Rows - counts[id]
	}
	for _, id := range bulk.Torn {
		if !c.torn[id] {
			c.torn[id] = true
			l.torn = append(l.torn, id)
		}
	}
	l.bulkChecks = testutil.CompareBulk(counts, round).Attempted
	return check, l, nil
}

// readIDs reads the ids of acked and the rows per transaction of bulk.
func (c *cluster) readIDs() (map[int64]bool, map[int64]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.primary(ctx)
	if err != nil {
		return nil, nil, err
	}
	if p.Status.PodIP == "" {
		return nil, nil, fmt.Errorf("primary %s has no address", p.Name)
	}
	conn, err := testutil.Connect(ctx, c.at(p.Status.PodIP), nil)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(context.Background())
	var recovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil {
		return nil, nil, err
	}
	if recovery {
		return nil, nil, fmt.Errorf("%s, the current primary, is in recovery", p.Name)
	}
	ids, err := testutil.IDs(ctx, conn, "acked")
	if err != nil {
		return nil, nil, err
	}
	rows, err := conn.Query(ctx, "SELECT txn, count(*) FROM bulk GROUP BY txn")
	if err != nil {
		return nil, nil, err
	}
	counts := map[int64]int{}
	for rows.Next() {
		var (
			txn int64
			n   int
		)
		if err := rows.Scan(&txn, &n); err != nil {
			return nil, nil, err
		}
		counts[txn] = n
	}
	return ids, counts, rows.Err()
}

// status is the part of the agent's GET /status the suite reads.
type status struct {
	Role     string `json:"role"`
	Frozen   bool   `json:"frozen"`
	Replicas []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"replicas"`
}

// agentStatus asks the agent of pod for /status on port 8008, and returns it parsed and
// as it came.
func agentStatus(ctx context.Context, p corev1.Pod) (status, []byte, error) {
	if p.Status.PodIP == "" {
		return status{}, nil, fmt.Errorf("pod %s has no IP", p.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	// As the operator calls it: TLS verified with the cluster's CA, the operator's token.
	n := dbv1.NamesOf(p.Labels[dbv1.LabelCluster])
	var token, ca corev1.Secret
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: n.AgentTokenSecret()}, &token); err != nil {
		return status{}, nil, err
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: n.CASecret()}, &ca); err != nil {
		return status{}, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+p.Status.PodIP+":8008/status", nil)
	if err != nil {
		return status{}, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+string(token.Data["token"]))
	resp, err := testutil.AgentHTTP(p.Name+"."+n.HeadlessService()+"."+p.Namespace+".svc", ca.Data["ca.crt"]).Do(req)
	if err != nil {
		return status{}, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return status{}, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return status{}, body, fmt.Errorf("GET /status: %s", resp.Status)
	}
	var st status
	err = json.Unmarshal(body, &st)
	return st, body, err
}

// dump logs what explains a failed round: the cluster's status, each pod with its
// containers, its agent's /status and its containers' last log lines (the previous
// instance's too after a restart), the primary Lease, the operator's logs and the
// events since since.
func (c *cluster) dump(t testing.TB, since time.Time, sections ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "==== dump of %s/%s (%s) since %s\n", c.ns, c.name, c.mode.name, since.Format(timeFormat))
	if pgc, err := c.get(ctx); err != nil {
		fmt.Fprintf(&b, "cluster: %v\n", err)
	} else {
		fmt.Fprintf(&b, "status: phase %s primary %q ready %d lastFailover %+v\n", pgc.Status.Phase,
			pgc.Status.CurrentPrimary, pgc.Status.ReadyInstances, pgc.Status.LastFailover)
		for _, cond := range pgc.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	pods, _ := c.pods(ctx)
	for _, p := range pods {
		fmt.Fprintf(&b, "pod %s (uid %s, ip %s): phase %s role %q deleting %v\n", p.Name, p.UID, p.Status.PodIP,
			p.Status.Phase, p.Labels[dbv1.LabelRole], p.DeletionTimestamp != nil)
		_, raw, err := agentStatus(ctx, p)
		fmt.Fprintf(&b, "  agent /status: %s %v\n", raw, errOrEmpty(err))
		containerLogs(ctx, &b, p, 120)
	}
	for _, s := range sections {
		if s != "" {
			fmt.Fprintln(&b, s)
		}
	}
	var lease coordinationv1.Lease
	if err := k8s.Get(ctx, c.primaryLeaseKey(), &lease); err != nil {
		fmt.Fprintf(&b, "lease: %v\n", err)
	} else {
		fmt.Fprintf(&b, "lease %s: holder %q transitions %v renewed %v annotations %v\n", lease.Name,
			deref(lease.Spec.HolderIdentity), deref(lease.Spec.LeaseTransitions), lease.Spec.RenewTime, lease.Annotations)
	}
	if ops, err := operatorPods(ctx); err == nil {
		for _, op := range ops {
			containerLogs(ctx, &b, op, 200)
		}
	} else {
		fmt.Fprintf(&b, "operator pods: %v\n", err)
	}
	var events corev1.EventList
	if err := k8s.List(ctx, &events, client.InNamespace(c.ns)); err == nil {
		slices.SortFunc(events.Items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
		for _, e := range events.Items {
			if eventTime(e).Before(since.Add(-time.Second)) {
				continue
			}
			fmt.Fprintf(&b, "event %s %s %s %s: %s\n", eventTime(e).Format(timeFormat), e.InvolvedObject.Kind,
				e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	t.Log(b.String())
}

// containerLogs writes each container's status and last lines of log, and the previous
// instance's after a restart.
func containerLogs(ctx context.Context, b *strings.Builder, p corev1.Pod, lines int64) {
	for _, cs := range p.Status.ContainerStatuses {
		fmt.Fprintf(b, "  container %s/%s ready %v restarts %d state %s\n", p.Name, cs.Name, cs.Ready, cs.RestartCount, containerState(cs.State))
		previous := []bool{false}
		if cs.RestartCount > 0 {
			previous = []bool{true, false}
		}
		for _, prev := range previous {
			// The writer's and the probe's statements flood the server's log: read far
			// back, and keep the last lines that are not about them.
			far := int64(20000)
			raw, err := clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name,
				&corev1.PodLogOptions{Container: cs.Name, TailLines: &far, Previous: prev}).DoRaw(ctx)
			raw = []byte(lastLines(relevant(string(raw)), int(lines)))
			what := "log"
			if prev {
				what = "previous container's log"
			}
			if err != nil {
				fmt.Fprintf(b, "  %s of %s/%s: %v\n", what, p.Name, cs.Name, err)
				continue
			}
			fmt.Fprintf(b, "  last %d lines of the %s of %s/%s:\n%s\n", lines, what, p.Name, cs.Name, indent(string(raw)))
		}
	}
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(timeFormat)
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason
	case s.Terminated != nil:
		return fmt.Sprintf("terminated: %s (exit %d) at %s", s.Terminated.Reason, s.Terminated.ExitCode,
			s.Terminated.FinishedAt.Format(timeFormat))
	}
	return "unknown"
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// primaryLeaseKey is the key of c's primary Lease.
func (c *cluster) primaryLeaseKey() client.ObjectKey {
	return client.ObjectKey{Namespace: c.ns, Name: dbv1.NamesOf(c.name).PrimaryLease()}
}

// operatorPods returns the running operator pods (namespace pgpilot-system).
func operatorPods(ctx context.Context) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(operatorNamespace),
		client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
		return nil, err
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return nil, fmt.Errorf("no running operator pod among %d in %s", len(pods.Items), operatorNamespace)
	}
	return running, nil
}

// operatorPod returns the operator pod whose controller leads: the holder of the
// controller's leader election Lease, which names it by the pod's name.
func operatorPod(ctx context.Context) (corev1.Pod, error) {
	var l coordinationv1.Lease
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: controllerElection}, &l); err != nil {
		return corev1.Pod{}, fmt.Errorf("the controller's leader election Lease: %w", err)
	}
	pods, err := operatorPods(ctx)
	if err != nil {
		return corev1.Pod{}, err
	}
	for _, p := range pods {
		if p.Name == ptr.Deref(l.Spec.HolderIdentity, "") {
			return p, nil
		}
	}
	return corev1.Pod{}, fmt.Errorf("the controller's leader %q is not a running operator pod", deref(l.Spec.HolderIdentity))
}

// operatorReady waits until the operator's Deployment has every replica updated and
// ready, and a running pod leads.
func operatorReady(ctx context.Context) error {
	for {
		var d appsv1.Deployment
		err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorDeployment}, &d)
		if err == nil {
			want := ptr.Deref(d.Spec.Replicas, 1)
			s := d.Status
			if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.Replicas != want {
				err = fmt.Errorf("deployment %s: %d of %d replicas updated, %d ready, %d in all", d.Name, s.UpdatedReplicas, want, s.ReadyReplicas, s.Replicas)
			}
		}
		if err == nil {
			_, err = operatorPod(ctx)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the operator is not ready: %w (%w)", err, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// The operator's Deployment, and the controller's leader election Lease.
const (
	operatorDeployment = "pgpilot-controller-manager"
	controllerElection = "pgpilot-sidecar.db.example.com"
)

const operatorNamespace = "pgpilot-system"

const timeFormat = "15:04:05.000"

// containerID returns the runtime's ID of pod's container name (without the
// "containerd://" prefix).
func containerID(p corev1.Pod, name string) (string, error) {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name && cs.ContainerID != "" {
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			return id, nil
		}
	}
	return "", fmt.Errorf("pod %s has no running container %s", p.Name, name)
}

// relevant drops the log lines the writer and the probe cause by the thousand (their
// failed statements and connections), and a controller's start lines.
func relevant(log string) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "STATEMENT:"), strings.Contains(l, "read-only transaction"),
			strings.Contains(l, "duplicate key"), strings.Contains(l, "connection to client lost"),
			strings.Contains(l, "could not send data to client"), strings.Contains(l, "the database system is"),
			strings.Contains(l, "DETAIL:  Key (id)"),
			// A controller's start: a line per watch and per controller.
			strings.Contains(l, `"msg":"Starting EventSource"`), strings.Contains(l, `"msg":"Starting Controller"`),
			strings.Contains(l, `"msg":"Starting workers"`):
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// followed is a container's log read as it is written: it survives the pod's deletion,
// when the API server no longer serves it.
type followed struct {
	pod    string
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	b      strings.Builder
}

// follow reads p's postgres container log from now until stop.
func follow(p corev1.Pod) *followed {
	ctx, cancel := context.WithCancel(context.Background())
	f := &followed{pod: p.Name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		since := metav1.Now()
		r, err := clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name,
			&corev1.PodLogOptions{Container: "postgres", Follow: true, SinceTime: &since}).Stream(ctx)
		if err != nil {
			f.write([]byte(err.Error()))
			return
		}
		defer r.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			f.write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	return f
}

func (f *followed) write(p []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.b.Write(p)
}

// stop ends the reading and returns the relevant lines read.
func (f *followed) stop() string {
	f.cancel()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return relevant(f.b.String())
}
