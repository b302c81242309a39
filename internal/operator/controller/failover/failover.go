package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/opmetrics"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// PollPeriod is how often each cluster's agents are asked for their status while the
// cluster is not Settled; QuietPeriod while it is.
const (
	PollPeriod  = time.Second
	QuietPeriod = 5 * time.Second
)

// renewalCheck is how often the renewal watchdog looks for a settled cluster whose
// holder has not renewed within RenewingWithin.
const renewalCheck = 100 * time.Millisecond

// Reconciler watches every instance of every cluster and keeps one writer: it
// creates the primary Lease, revokes it from a failed primary, moves it after a
// handover, runs switchovers, and labels the pods by role (the only writer of that
// label).
type Reconciler struct {
	client   client.Client
	reader   client.Reader // uncached, for reads that must see the latest Lease
	recorder record.EventRecorder
	clock    clock.PassiveClock
	fleet    *fleet.Fleet

	mu     sync.Mutex
	memory map[types.NamespacedName]*memory

	// lanes are the two queues cycles are taken from (SetupWithManager): a cluster
	// with something to decide is never queued behind the routine polls of settled ones.
	lanes lanes
}

// lanes holds the queues of the failover controller's two lanes, each set once its
// controller starts.
type lanes struct {
	mu sync.Mutex
	// urgent takes every cycle of an unsettled cluster, and every wake-up by a pod, a
	// Lease change or the renewal watchdog.
	urgent workqueue.TypedRateLimitingInterface[reconcile.Request]
	// routine takes the QuietPeriod polls of settled clusters and the clusters' own events.
	routine workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// add queues req in the urgent or the routine lane after d; false when that lane's
// controller has not started.
func (l *lanes) add(urgent bool, req reconcile.Request, d time.Duration) bool {
	l.mu.Lock()
	q := l.routine
	if urgent {
		q = l.urgent
	}
	l.mu.Unlock()
	if q == nil {
		return false
	}
	if d <= 0 {
		q.Add(req)
	} else {
		q.AddAfter(req, d)
	}
	return true
}

// capture is a source that only records its controller's queue into *into.
func (l *lanes) capture(into *workqueue.TypedRateLimitingInterface[reconcile.Request]) source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		*into = q
		return nil
	})
}

// memory is what decisions need from earlier observations. It is lost on a restart,
// which only makes the controller wait longer (RenewSeen and VacantSince start again).
type memory struct {
	// failedSince is when the holder failedHolder was first seen failed in failedTerm.
	failedSince  time.Time
	failedHolder string
	failedTerm   int32
	lastReason   string
	// fenceNote is the last message about the user's fencing (reportFencing).
	fenceNote string
	// renewTime is the holder's last renewal seen, and renewSeen when it was seen.
	renewTime time.Time
	renewSeen time.Time
	// renewObserved: renewTime changed at least once while watched (a renewal was seen,
	// not only a Lease read for the first time).
	renewObserved bool
	// vacantTerm is the term in which the Lease was first seen vacant, at vacantSince.
	vacantTerm  int32
	vacantSince time.Time
	// seen is the last Lease read.
	seen *primarylease.Record
	// durability is what the agents' synchronous_commit guard reported, per instance,
	// as last turned into events (durability.go).
	durability map[string]durabilitySeen
	// unrecorded is a failover moved on the Lease whose record the report does not
	// hold yet (its write failed); written again until it does.
	unrecorded *dbv1.FailoverRecord
	// agentErrorSeen is when each instance not ready was first seen reporting an error
	// (agenterrors.go).
	agentErrorSeen map[string]time.Time
	// full is the last observation of every agent that found the cluster Settled, while
	// it stays settled: what a quiet cycle compares with and carries (quiet.go).
	full *fullObservation
	// settled: the last cycle found the cluster Settled and comes back after
	// QuietPeriod; the renewal watchdog wakes it sooner if its holder stops renewing.
	settled bool
	// cycling is held for the length of a cycle: the two lanes may both hold the
	// cluster, and its cycles run one at a time.
	cycling sync.Mutex
}

// NewReconciler returns a Reconciler. reader reads uncached (the
// manager's API reader); agentURL nil means https://<pod IP>:8008.
func NewReconciler(c client.Client, reader client.Reader, recorder record.EventRecorder, clk clock.PassiveClock, agentURL func(*corev1.Pod) string) *Reconciler {
	return &Reconciler{
		client: c, reader: reader, recorder: recorder, clock: clk, fleet: fleet.New(c, agentURL),
		memory: map[types.NamespacedName]*memory{},
	}
}

// +kubebuilder:rbac:groups=db.example.com,resources=postgresclusters,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=db.example.com,resources=postgresbackups,verbs=create

// cycle is one reconcile of one cluster.
type cycle struct {
	r       *Reconciler
	cluster *dbv1.PostgresCluster
	store   primarylease.Store
	lease   *coordinationv1.Lease
	// reported is the cluster's report as read, with this cycle's writes; unread is
	// why it could not be read (nothing of it is written then).
	reported  report.Report
	unread    error
	pods      []corev1.Pod
	instances []Instance
	access    fleet.Access
	mem       *memory
	log       func(msg string, kv ...any)
	// started is when the reconcile began and observed how long asking the agents took
	// (logged with a move, to explain a failover's duration).
	started  time.Time
	observed time.Duration
	// quiet: this cycle asked the holder alone, which vouched for the standbys; their
	// statuses are the last full observation's (quiet.go).
	quiet bool
	// noQuiet: every observation of this cycle asks every agent.
	noQuiet bool
	// decision is what Decide decided for a Lease with a holder this cycle; nil when
	// the Lease had none, or hibernation held it.
	decision *Decision
}

// lane is the reconciler of one of the two lanes: it runs a cycle and queues the
// cluster's next one in the lane its state calls for.
type lane struct {
	r      *Reconciler
	urgent bool
}

// Reconcile runs one cycle of the cluster, then queues the next: in the routine lane
// after QuietPeriod once the cluster is settled, in the urgent lane otherwise.
func (l lane) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := l.r.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter <= 0 {
		return res, err
	}
	l.r.mu.Lock()
	m, known := l.r.memory[req.NamespacedName]
	urgent := known && !m.settled
	l.r.mu.Unlock()
	if urgent != l.urgent && l.r.lanes.add(urgent, req, res.RequeueAfter) {
		return ctrl.Result{}, nil
	}
	return res, nil
}

// Reconcile observes the cluster's instances, decides, acts, labels, and comes back
// after PollPeriod at the latest (QuietPeriod once it is settled). Cycles of one
// cluster never overlap.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := r.remember(req.NamespacedName)
	m.cycling.Lock()
	defer m.cycling.Unlock()
	return r.reconcile(ctx, req)
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cluster dbv1.PostgresCluster
	if err := r.client.Get(ctx, req.NamespacedName, &cluster); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cluster.DeletionTimestamp.IsZero() {
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx)
	c := &cycle{r: r, cluster: &cluster, mem: r.remember(req.NamespacedName), log: logger.Info, started: time.Now(),
		store: primarylease.ClientStore{Reader: r.client, Writer: r.client, Namespace: cluster.Namespace, Name: cluster.PrimaryLeaseName()}}
	lease, err := c.store.Get(ctx)
	if apierrors.IsNotFound(err) {
		lease = nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	access, err := r.fleet.Access(ctx, &cluster)
	if err != nil {
		return ctrl.Result{RequeueAfter: PollPeriod}, client.IgnoreNotFound(err)
	}
	c.access = access
	// The cache's own pods, never changed here (label copies the one it changes).
	if c.pods, err = clusterpods.View(ctx, r.client, &cluster); err != nil {
		return ctrl.Result{}, err
	}
	if lease == nil {
		return ctrl.Result{RequeueAfter: PollPeriod}, c.createLease(ctx)
	}
	c.lease = lease
	// The report never delays a decision: unread, it is not written this cycle.
	c.reported, c.unread = report.Read(ctx, r.client, &cluster)
	c.noteRenewal(primarylease.Parse(lease))
	c.observe(ctx)
	if err := c.markBootstrapped(ctx); err != nil {
		return ctrl.Result{}, err
	}
	requeue, err := c.decideAndAct(ctx)
	if rerr := c.refreshReplicaConfig(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if lerr := c.label(ctx); lerr != nil && err == nil {
		err = lerr
	}
	// After the decision: recording what the agents report of their data must never
	// delay or block a failover.
	if merr := c.moveReportsOffLease(ctx); merr != nil && err == nil {
		err = merr
	}
	if ferr := c.recordFailover(ctx); ferr != nil && err == nil {
		err = ferr
	}
	if gerr := c.recordDataGuard(ctx); gerr != nil && err == nil {
		err = gerr
	}
	if verr := c.recordDataVersion(ctx); verr != nil && err == nil {
		err = verr
	}
	if uerr := c.recordUpgrade(ctx); uerr != nil && err == nil {
		err = uerr
	}
	c.reportDurability()
	if rerr := c.recordReplica(ctx); rerr != nil && err == nil {
		err = rerr
	}
	if serr := c.recordStreaming(ctx); serr != nil && err == nil {
		err = serr
	}
	if aerr := c.recordAgentErrors(ctx); aerr != nil && err == nil {
		err = aerr
	}
	if herr := c.recordHealth(ctx); herr != nil && err == nil {
		err = herr
	}
	settled := false
	if requeue <= 0 || requeue > PollPeriod {
		requeue = PollPeriod
		var why string
		switch {
		case err != nil:
			why = UnsettledError
		case c.decision == nil: // no holder, or hibernating: nothing was decided
			why = UnsettledLease
		default:
			why = Unsettled(primarylease.Parse(c.lease), *c.decision, c.instances, int(cluster.Spec.Replicas), cluster.FollowedSource())
			if why == "" && !c.renewing() {
				why = UnsettledRenewal
			}
		}
		if why == "" {
			requeue, settled = QuietPeriod, true
		} else {
			opmetrics.CountUnsettled(why)
		}
	}
	r.mu.Lock()
	c.mem.settled = settled
	switch {
	case !settled:
		c.mem.full = nil
	case !c.quiet:
		c.recordFull(r.clock.Now())
	}
	r.mu.Unlock()
	return ctrl.Result{RequeueAfter: requeue}, err
}

// watchRenewals wakes a settled cluster whose holder's last renewal was seen more than
// RenewingWithin ago: one that is asked every QuietPeriod would otherwise find its
// primary failed up to QuietPeriod late. The woken cycle asks the agents at once and is
// not settled until the holder renews again. It asks every agent together, never the
// holder alone: it suspects the holder, and a holder that does not answer would cost its
// whole timeout before the standbys were asked (docs/failover.md, "Quiet cycles").
func (r *Reconciler) watchRenewals(ctx context.Context) {
	tick := time.NewTicker(renewalCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := r.clock.Now()
		var due []types.NamespacedName
		r.mu.Lock()
		for key, m := range r.memory {
			if m.settled && !m.renewSeen.IsZero() && now.Sub(m.renewSeen) > RenewingWithin {
				m.settled = false
				due = append(due, key)
			}
		}
		r.mu.Unlock()
		for _, key := range due {
			if !r.lanes.add(true, reconcile.Request{NamespacedName: key}, 0) {
				r.mu.Lock()
				if m, ok := r.memory[key]; ok {
					m.settled = true // not started yet: look again at the next check
				}
				r.mu.Unlock()
			}
		}
	}
}

// renewing reports whether the holder's last renewal was seen within RenewingWithin. A
// cluster whose holder answers but does not renew (a slow API server, a primary cut off
// from it) is not settled until it renews again: settled, the renewal watchdog would
// wake it at every check (every 100 ms) until the renewal came.
func (c *cycle) renewing() bool {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	return !c.mem.renewSeen.IsZero() && c.r.clock.Now().Sub(c.mem.renewSeen) <= RenewingWithin
}

// observe asks the cluster's agents for their status. A primary that is being deleted
// and released the Lease after a clean stop is not asked: nothing it could answer
// changes the decision (it does not take the Lease back while it is deleted), and once
// its pod's address is gone the question would only wait for the timeout.
func (c *cycle) observe(ctx context.Context) {
	var except []string
	if c.lease != nil {
		if rec := primarylease.Parse(c.lease); rec.Holder == "" && rec.Handover.CleanRelease() {
			for i := range c.pods {
				if c.pods[i].Name == rec.Handover.From && !c.pods[i].DeletionTimestamp.IsZero() {
					except = append(except, rec.Handover.From)
				}
			}
		}
	}
	start := time.Now()
	defer func() { c.observed = time.Since(start) }()
	c.r.mu.Lock()
	full := c.mem.full
	holder := ""
	if !c.noQuiet {
		holder = quietHolder(full, c.mem.settled, c.r.clock.Now(), c.cluster, c.lease, c.pods)
	}
	c.r.mu.Unlock()
	if holder == "" {
		c.instances = c.r.fleet.Observe(ctx, c.pods, c.access, PollPeriod, except...)
		c.agentsSawRenewal(c.instances)
		opmetrics.CountObservation(opmetrics.ObservedFull)
		return
	}
	var standbys []string
	for i := range c.pods {
		if c.pods[i].Name != holder {
			standbys = append(standbys, c.pods[i].Name)
		}
	}
	asked := c.r.fleet.Observe(ctx, c.pods, c.access, PollPeriod, standbys...)
	c.agentsSawRenewal(asked)
	if v := vouched(asked, holder, primarylease.Parse(c.lease).Term, full); v != nil {
		c.instances, c.quiet = v, true
		opmetrics.CountObservation(opmetrics.ObservedQuiet)
		return
	}
	// The holder did not vouch for every standby: ask them now, before anything is
	// decided.
	rest := c.r.fleet.Observe(ctx, c.pods, c.access, PollPeriod, append(except, holder)...)
	c.agentsSawRenewal(rest)
	for i := range rest {
		if rest[i].Name == holder {
			rest[i] = asked[i]
		}
	}
	c.instances = rest
	opmetrics.CountObservation(opmetrics.ObservedUnvouched)
}

// createLease creates the missing primary Lease (DecideMissingLease): naming instance 0
// for a new cluster, rebuilt from the agents' views for one that has data. The Lease
// has no owner reference on purpose: like the volumes, it outlives the cluster, so a
// cluster created again on the kept volumes resumes with the instance that had the
// newest data as primary.
func (c *cycle) createLease(ctx context.Context) error {
	c.observe(ctx)
	c.r.mu.Lock()
	in := MissingLease{Instances: c.instances, Remembered: c.mem.seen, Bootstrapped: c.cluster.Bootstrapped(),
		SynchronousReplicas: int(c.cluster.Spec.PostgreSQL.SynchronousReplicas)}
	c.r.mu.Unlock()
	for i := range c.cluster.Spec.Replicas {
		in.Expected = append(in.Expected, c.cluster.InstanceName(int(i)))
	}
	kept, err := c.keptVolumes(ctx)
	if err != nil {
		return err
	}
	in.KeptVolumes = kept
	origin := DecideMissingLease(in)
	name := c.cluster.PrimaryLeaseName()
	if origin.Record == nil {
		c.report(dbv1.ReasonNoPrimary, origin.Reason, "Waiting before designating the first primary")
		return nil
	}
	l, err := primarylease.Rebuild(c.cluster.Namespace, name, c.cluster.Name, *origin.Record, c.r.clock.Now())
	if err != nil {
		return err
	}
	if err := c.r.client.Create(ctx, l); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Lease %s: %w", name, err)
	}
	if origin.Recreated {
		c.log("Recreated the deleted primary Lease", "lease", name, "holder", origin.Record.Holder, "term", origin.Record.Term, "reason", origin.Reason)
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeWarning, dbv1.ReasonPrimaryLeaseRecreated, "Lease %s was deleted: %s", name, origin.Reason)
		return nil
	}
	c.log("Designated the first primary", "lease", name, "primary", origin.Record.Holder, "reason", origin.Reason)
	c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonPrimaryDesignated,
		"Designated %s as the first primary (Lease %s): %s", origin.Record.Holder, name, origin.Reason)
	return nil
}

// keptVolumes are the instances whose PersistentVolumeClaim is older than the
// PostgresCluster. Read once per missing Lease, uncached: the controller needs no watch on
// claims, only get.
func (c *cycle) keptVolumes(ctx context.Context) ([]string, error) {
	var kept []string
	for i := range int(c.cluster.Spec.Replicas) {
		var pvc corev1.PersistentVolumeClaim
		err := c.r.reader.Get(ctx, client.ObjectKey{Namespace: c.cluster.Namespace, Name: c.cluster.VolumeClaimName(i)}, &pvc)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("reading the volume claim of %s: %w", c.cluster.InstanceName(i), err)
		}
		if pvc.CreationTimestamp.Before(&c.cluster.CreationTimestamp) {
			kept = append(kept, c.cluster.InstanceName(i))
		}
	}
	return kept, nil
}

// sawRenewal records renewTime as the holder's last renewal, seen at now, unless it is
// the one recorded already; from the second record on, a renewal was seen happen
// (renewObserved). The caller holds r.mu.
func (m *memory) sawRenewal(renewTime, now time.Time) {
	if !m.renewSeen.IsZero() && renewTime.Equal(m.renewTime) {
		return
	}
	m.renewObserved = !m.renewSeen.IsZero()
	m.renewTime, m.renewSeen = renewTime, now
}

// noteRenewal records when the holder's renewal was first seen (I2 measures from it).
func (c *cycle) noteRenewal(rec primarylease.Record) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.mem.seen = &rec
	c.mem.sawRenewal(rec.RenewTime, c.r.clock.Now())
}

// markBootstrapped annotates the Lease once its holder is Ready for the first time: from
// then on an agent whose volume is empty must not initialise a new database.
func (c *cycle) markBootstrapped(ctx context.Context) error {
	rec := primarylease.Parse(c.lease)
	if rec.Bootstrapped || rec.Holder == "" {
		return nil
	}
	for i := range c.pods {
		if c.pods[i].Name == rec.Holder && clusterpods.IsReady(&c.pods[i]) {
			l, err := c.apply(ctx, primarylease.MarkBootstrapped())
			if err != nil {
				return fmt.Errorf("marking the Lease bootstrapped: %w", err)
			}
			c.lease = l
			c.log("Marked the cluster bootstrapped", "primary", rec.Holder)
		}
	}
	return nil
}

func (c *cycle) apply(ctx context.Context, change primarylease.Change) (*coordinationv1.Lease, error) {
	return primarylease.Apply(ctx, c.store, c.lease, c.r.clock.Now, change)
}

func (c *cycle) input(rec primarylease.Record) Input {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if rec.Holder == "" && (c.mem.vacantSince.IsZero() || c.mem.vacantTerm != rec.Term) {
		c.mem.vacantTerm, c.mem.vacantSince = rec.Term, c.r.clock.Now()
	}
	return Input{
		Lease: rec, Instances: c.instances, Source: c.cluster.FollowedSource(), Enabled: c.cluster.FailoverEnabled(), Delay: c.cluster.FailoverDelay(),
		StartTimeout: c.cluster.FailoverStartTimeout(), SynchronousReplicas: int(c.cluster.Spec.PostgreSQL.SynchronousReplicas),
		Switchover: c.cluster.Annotations[dbv1.AnnotationSwitchoverTo], FailedSince: c.mem.failedSince,
		FailedHolder: c.mem.failedHolder, FailedTerm: c.mem.failedTerm,
		Fenced: RequestedFencing(FencingInput{Requested: c.cluster.Annotations[dbv1.AnnotationFencedInstances], Lease: rec,
			Instances: c.instances, Cluster: c.cluster.Name, Replicas: int(c.cluster.Spec.Replicas)}),
		Cluster: c.cluster.Name, Replicas: int(c.cluster.Spec.Replicas),
		RenewSeen: c.mem.renewSeen, RenewObserved: c.mem.renewObserved, VacantSince: c.mem.vacantSince, Now: c.r.clock.Now(),
	}
}

// decideAndAct takes the cluster one step; it returns when to come back.
func (c *cycle) decideAndAct(ctx context.Context) (time.Duration, error) {
	rec := primarylease.Parse(c.lease)
	if rec.Holder == "" {
		return c.vacant(ctx)
	}
	if held, requeue, err := c.hibernate(ctx, rec); held || err != nil {
		c.report("", "", "")
		return requeue, err
	}
	if err := c.fence(ctx, primarylease.Parse(c.lease)); err != nil {
		return 0, err
	}
	rec = primarylease.Parse(c.lease)
	d := Decide(c.input(rec))
	if c.quiet && d.Action != None {
		// Nothing is ever done on a carried status: the standbys are asked, and the
		// decision made again on what every agent answers now.
		c.quiet, c.noQuiet = false, true
		c.observe(ctx)
		d = Decide(c.input(rec))
	}
	c.decision = &d
	c.r.mu.Lock()
	c.mem.failedSince, c.mem.failedHolder, c.mem.failedTerm = d.FailedSince, rec.Holder, rec.Term
	c.r.mu.Unlock()
	if d.Action != Blocked && d.Action != Wait {
		// A report that cannot be written never holds the action back.
		if err := c.setBlocked(ctx, ""); err != nil {
			c.log("Could not clear the blocked failover in the report", "error", err.Error())
		}
	}
	switch d.Action {
	case None:
		c.report("", "", "")
	case Wait, Blocked:
		return c.hold(ctx, d, "Primary failed")
	case RefuseSwitchover:
		c.log("Switchover refused", "to", d.Target, "reason", d.Reason)
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeWarning, dbv1.ReasonSwitchoverRefused, "Switchover to %s refused: %s", d.Target, d.Reason)
		return 0, c.clearSwitchover(ctx)
	case Demote:
		return c.demote(ctx, rec, d)
	case ScaleDown:
		return c.scaleDown(ctx, d)
	case Revoke:
		c.log("Failing over: revoking the primary Lease", "from", rec.Holder, "reason", d.Reason)
		c.r.recorder.Event(c.cluster, corev1.EventTypeWarning, dbv1.ReasonFailoverStarted, d.Reason)
		l, err := c.apply(ctx, primarylease.Revoke(rec.Holder, rec.Term, d.Reason))
		if err != nil {
			return 0, fmt.Errorf("revoking the primary Lease: %w", err)
		}
		c.lease = l
		return c.vacant(ctx)
	}
	return 0, nil
}

// hold reports a decision to wait (logged as waitMsg) or a blocked failover, and
// returns when to come back.
func (c *cycle) hold(ctx context.Context, d Decision, waitMsg string) (time.Duration, error) {
	if d.Action == Wait {
		if d.Settling || settling(primarylease.Parse(c.lease), c.lease.Spec.AcquireTime, c.r.clock.Now(), c.cluster.FailoverDelay()) {
			c.log("Waiting for the primary role to settle", "reason", d.Reason)
			return d.RequeueAfter, nil
		}
		c.report(dbv1.ReasonPrimaryFailed, d.Reason, waitMsg)
		return d.RequeueAfter, nil
	}
	c.report(dbv1.ReasonFailoverBlocked, d.Reason, "Failover blocked")
	return 0, c.setBlocked(ctx, d.Reason)
}

// settling reports whether the primary role changed hands less than delay
// (spec.failover.delay) before now, in the ordinary course of a move: the holder took
// the Lease (acquired) that recently, or, with no holder, the last one released it
// cleanly that recently. A primary just promoted, by a failover or a switchover, is not
// ready until its commit gate streams and its agent has confirmed the Lease; a
// switchover's target needs a moment to receive the final WAL of the primary that
// handed over. The controller still counts a wait that lasts as a failure and fails over
// (FailoverStarted says so then), but does not warn of these moments as PrimaryFailed,
// which would follow every planned switchover on a busy node.
func settling(rec primarylease.Record, acquired *metav1.MicroTime, now time.Time, delay time.Duration) bool {
	if rec.Holder == "" {
		return rec.Handover.CleanRelease() && now.Sub(rec.Handover.At.Time) < delay
	}
	return acquired != nil && now.Sub(acquired.Time) < delay
}

// report emits reason's event and log line once per distinct message ("" resets).
func (c *cycle) report(reason, msg, logMsg string) {
	c.reportOnce(&c.mem.lastReason, reason, msg, logMsg)
}

// reportOnce is report with the last message kept in *last, so that concerns that
// report side by side do not reset each other's.
// Messages that differ only in the durations they carry ("has not renewed the Lease for
// 10.2s", then "for 10.4s") are one: each reconcile would otherwise emit one more, and
// client-go drops an object's events beyond a burst of 25, so a restart's worth of
// them hid the events that followed (an upgrade's UpgradeFailed, say; make e2e).
func (c *cycle) reportOnce(last *string, reason, msg, logMsg string) {
	c.r.mu.Lock()
	same := withoutDurations(*last) == withoutDurations(msg)
	*last = msg
	c.r.mu.Unlock()
	if msg == "" || same {
		return
	}
	c.log(logMsg, "reason", msg)
	c.r.recorder.Event(c.cluster, corev1.EventTypeWarning, reason, msg)
}

// scaleDown requests the switchover a scale-down needs, through the annotation a user
// would set: the switchover then runs, is reported and can be refused like any other.
// With no target it waits, said once in an event.
func (c *cycle) scaleDown(ctx context.Context, d Decision) (time.Duration, error) {
	if d.Target == "" {
		c.report(dbv1.ReasonScaleDownWaiting, d.Reason, "Scale-down waiting")
		return 0, nil
	}
	c.log("Switching over before a scale-down", "to", d.Target, "reason", d.Reason)
	c.r.recorder.Event(c.cluster, corev1.EventTypeNormal, dbv1.ReasonSwitchingOverForScaleDown, d.Reason)
	return 0, client.IgnoreNotFound(switchover.Request(ctx, c.r.client, c.cluster, d.Target))
}

// demote runs a switchover's handover: the holder's agent stops acknowledging, stops
// cleanly and releases the Lease with its final position; the vacant step then promotes
// the target once it has that position, or gives the Lease back.
func (c *cycle) demote(ctx context.Context, rec primarylease.Record, d Decision) (time.Duration, error) {
	c.log("Switching over: demoting the primary", "from", rec.Holder, "to", d.Target)
	old := find(c.instances, rec.Holder)
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := c.r.fleet.Client(old.Pod, c.access).Demote(dctx)
	cancel()
	if err != nil {
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeWarning, dbv1.ReasonSwitchoverRefused, "Switchover to %s failed: demoting %s: %v", d.Target, rec.Holder, err)
		return 0, c.clearSwitchover(ctx)
	}
	l, err := primarylease.ClientStore{Reader: c.r.reader, Namespace: c.cluster.Namespace, Name: c.cluster.PrimaryLeaseName()}.Get(ctx)
	if err != nil {
		return 0, err
	}
	c.lease = l
	c.observe(ctx)
	return c.vacant(ctx)
}

// vacant handles a Lease that names no holder: fence the old primary if it still runs,
// freeze the standbys, then decide.
func (c *cycle) vacant(ctx context.Context) (time.Duration, error) {
	rec := primarylease.Parse(c.lease)
	c.prepare(ctx, rec)
	in := c.input(rec)
	d := DecideVacant(in)
	switch d.Action {
	case Wait, Blocked:
		return c.hold(ctx, d, "Waiting")
	case Move, GiveBack:
		// Come back soon: the target's pod is labelled primary once its agent reports
		// the promotion.
		return 100 * time.Millisecond, c.move(ctx, rec, in, d)
	}
	return 0, nil
}

// prepare fences the old primary if its postgres still runs, and freezes every running
// standby that is not frozen, all at once; their answers replace their observations.
func (c *cycle) prepare(ctx context.Context, rec primarylease.Record) {
	from := ""
	if rec.Handover != nil {
		from = rec.Handover.From
	}
	var wg sync.WaitGroup
	for i := range c.instances {
		in := &c.instances[i]
		if !in.Reachable || !in.Status.Running {
			continue
		}
		var act func(context.Context) (agentapi.Status, error)
		client := c.r.fleet.Client(in.Pod, c.access)
		switch {
		case in.Status.Role == agentapi.RolePrimary || in.Name == from && NeedsFreeze(rec.Handover):
			// After a clean release the old primary wrote its shutdown checkpoint: its
			// postgres cannot write any more, even while it finishes stopping.
			act = client.Fence
		case in.Status.Role == agentapi.RoleReplica && !in.Status.Frozen && NeedsFreeze(rec.Handover):
			act = client.Freeze
		default:
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if st, err := act(actx); err == nil {
				in.Status = st
			} else {
				c.log("Could not fence or freeze an instance", "pod", in.Name, "error", err.Error())
			}
		}()
	}
	wg.Wait()
}

// move makes d.Target the primary: the Lease names it in a new term with the
// synchronous set it starts with (the frozen standbys), then it is asked to promote.
func (c *cycle) move(ctx context.Context, rec primarylease.Record, in Input, d Decision) error {
	sync := &primarylease.SyncSet{K: in.SynchronousReplicas, Members: map[string]string{}}
	if sync.K > 0 {
		h := rec.Handover
		if h == nil {
			h = &primarylease.Handover{}
		}
		for _, s := range finalStandbys(c.instances, &primarylease.Handover{From: d.Target, Clean: h.Clean, Released: h.Released}) {
			sync.Members[s.Name] = ""
		}
	}
	from := ""
	if rec.Handover != nil {
		from = rec.Handover.From
	}
	onPurpose := in.Switchover != "" && d.Target == in.Switchover
	var failover *dbv1.FailoverRecord
	if !onPurpose && d.Action == Move {
		since := c.mem.failedSince
		if since.IsZero() {
			since = in.VacantSince
		}
		failover = &dbv1.FailoverRecord{From: from, To: d.Target, Time: metav1.NewTime(c.r.clock.Now()),
			Duration: c.r.clock.Since(since).Round(time.Millisecond).String(), Reason: d.Reason}
	}
	l, err := c.apply(ctx, primarylease.Move(rec.Term, d.Target, sync, timelineInUse(rec, c.instances)))
	if err != nil {
		return fmt.Errorf("moving the primary Lease to %s: %w", d.Target, err)
	}
	c.lease = l
	c.r.mu.Lock()
	c.mem.failedSince, c.mem.lastReason = time.Time{}, ""
	if failover != nil {
		c.mem.unrecorded = failover
	}
	c.r.mu.Unlock()
	recordMove(c.cluster, d.Action, onPurpose, failover, c.r.clock.Since(in.VacantSince))
	c.log("Moved the primary Lease", "from", from, "to", d.Target, "action", d.Action.String(), "reason", d.Reason,
		"reconcileTook", time.Since(c.started).Round(time.Millisecond).String(), "agentsAnsweredIn", c.observed.Round(time.Millisecond).String())
	if d.Lost != "" {
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeWarning, dbv1.ReasonFailoverCompleted, "%s: %s", d.Reason, d.Lost)
	}
	c.promote(d.Target)
	switch {
	case d.Action == GiveBack && in.Switchover != "":
		c.r.recorder.Event(c.cluster, corev1.EventTypeWarning, dbv1.ReasonSwitchoverAborted, d.Reason)
	case d.Action == GiveBack:
		c.r.recorder.Event(c.cluster, corev1.EventTypeNormal, dbv1.ReasonHandedBack, d.Reason)
	case onPurpose:
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonSwitchedOver, "Switched over from %s to %s in %s",
			from, d.Target, c.r.clock.Since(in.VacantSince).Round(time.Millisecond))
	case d.Lost == "":
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonFailoverCompleted, "Promoted %s in place of %s: %s", d.Target, orUnknown(from), d.Reason)
	}
	if in.Switchover != "" {
		return c.clearSwitchover(ctx)
	}
	return nil
}

// timelineInUse is the highest timeline ID the last handover or any instance's agent
// reported: the Lease's reservation for the next promotion goes above it.
func timelineInUse(rec primarylease.Record, instances []Instance) int64 {
	var highest int64
	if rec.Handover != nil {
		highest = rec.Handover.Timeline
	}
	for _, in := range instances {
		if in.Reachable {
			highest = max(highest, in.Status.Timeline)
		}
	}
	return highest
}

// promote asks the new holder's agent to promote, in the background: the agent would on
// seeing the Lease too, so the call only makes it sooner, and the reconciles that follow
// label the pod as soon as its status says it is the primary, without waiting for the
// rest of the agent's step (slots, synchronous rule).
func (c *cycle) promote(target string) {
	in := find(c.instances, target)
	if in == nil || in.Pod == nil || !in.Reachable {
		return
	}
	client, log := c.r.fleet.Client(in.Pod, c.access), c.log
	go func() {
		pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := client.Promote(pctx); err != nil {
			log("The promote call failed; the agent promotes itself from the Lease", "pod", target, "error", err.Error())
		}
	}()
}

// setBlocked records in the report why no failover can happen ("" when one can), for
// the status controller's FailoverReady condition; it writes only on change.
func (c *cycle) setBlocked(ctx context.Context, reason string) error {
	if c.reported.FailoverBlocked == reason {
		return nil
	}
	if err := c.record(ctx, report.KeyFailoverBlocked, reason); err != nil {
		return err
	}
	c.reported.FailoverBlocked = reason
	return nil
}

// recordFailover writes the last failover moved on the Lease into the report, once.
func (c *cycle) recordFailover(ctx context.Context) error {
	c.r.mu.Lock()
	rec := c.mem.unrecorded
	c.r.mu.Unlock()
	if rec == nil {
		return nil
	}
	if err := c.record(ctx, report.KeyLastFailover, rec); err != nil {
		return err
	}
	c.r.mu.Lock()
	if c.mem.unrecorded == rec {
		c.mem.unrecorded = nil
	}
	c.r.mu.Unlock()
	c.reported.LastFailover = rec
	return nil
}

// record writes one key of the cluster's report.
func (c *cycle) record(ctx context.Context, key report.Key, v any) error {
	if c.unread != nil {
		return c.unread
	}
	return report.Write(ctx, c.r.client, c.cluster, key, v)
}

// moveReportsOffLease moves what an operator before the report kept on the Lease into
// the report, once: the data's version and the last failover (the others are observed
// again), then removes every report annotation from the Lease.
func (c *cycle) moveReportsOffLease(ctx context.Context) error {
	legacy := primarylease.LegacyReports(c.lease)
	if len(legacy) == 0 || c.unread != nil {
		return c.unread
	}
	if v := legacy[primarylease.LegacyDataVersion]; v != "" && c.reported.DataVersion == "" {
		if err := c.record(ctx, report.KeyDataVersion, v); err != nil {
			return err
		}
		c.reported.DataVersion = v
	}
	if v := legacy[primarylease.LegacyLastFailover]; v != "" && c.reported.LastFailover == nil {
		var rec dbv1.FailoverRecord
		if json.Unmarshal([]byte(v), &rec) == nil {
			if err := c.record(ctx, report.KeyLastFailover, &rec); err != nil {
				return err
			}
			c.reported.LastFailover = &rec
		}
	}
	l, err := c.apply(ctx, primarylease.DropLegacyReports())
	if err != nil {
		return fmt.Errorf("removing the reports from the Lease: %w", err)
	}
	c.lease = l
	c.log("Moved the reports off the primary Lease", "report", c.cluster.ReportName())
	return nil
}

func (c *cycle) clearSwitchover(ctx context.Context) error {
	patch := client.MergeFrom(c.cluster.DeepCopy())
	delete(c.cluster.Annotations, dbv1.AnnotationSwitchoverTo)
	return client.IgnoreNotFound(c.r.client.Patch(ctx, c.cluster, patch))
}

// label gives every pod the role label Label says, from the Lease as it is now.
func (c *cycle) label(ctx context.Context) error {
	byName := make(map[string]*corev1.Pod, len(c.pods))
	for i := range c.pods {
		byName[c.pods[i].Name] = &c.pods[i]
	}
	var errs []error
	rec := primarylease.Parse(c.lease)
	for _, l := range Relabels(c.pods, rec.Holder, rec.Fenced, c.instances) {
		p, role := byName[l.Pod], l.Role
		if err := clusterpods.Check(c.cluster, p); err != nil {
			errs = append(errs, err)
			continue
		}
		// p is the cache's (clusterpods.View): change and patch a copy.
		p = p.DeepCopy()
		patch := client.MergeFrom(p.DeepCopy())
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		was := p.Labels[dbv1.LabelRole]
		p.Labels[dbv1.LabelRole] = role
		if err := c.r.client.Patch(ctx, p, patch); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("labelling %s %s: %w", p.Name, role, err))
			}
			continue
		}
		c.log("Labelled pod", "pod", p.Name, "role", role, "was", was)
		if was == dbv1.RoleFenced {
			c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonUnfenced, "%s serves as %s again", p.Name, role)
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) remember(key types.NamespacedName) *memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.memory[key]
	if !ok {
		m = &memory{}
		r.memory[key] = m
	}
	return m
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.memory, key)
	opmetrics.Forget(key.Namespace, key.Name)
}

// leaseEvents wakes the cluster's reconcile only when something other than a renewal
// changed: its holder, term or annotations. The renewals are recorded by the
// renewalRecorder, in every replica.
func (r *Reconciler) leaseEvents() handler.TypedEventHandler[client.Object, reconcile.Request] {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range clusterpods.ClusterOf(context.Background(), o) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			oldL, okOld := e.ObjectOld.(*coordinationv1.Lease)
			newL, okNew := e.ObjectNew.(*coordinationv1.Lease)
			if !okOld || !okNew {
				return
			}
			was, is := primarylease.Parse(oldL), primarylease.Parse(newL)
			if was.Holder != is.Holder || was.Term != is.Term || !equalAnnotations(oldL.Annotations, newL.Annotations) {
				enqueue(newL, q)
			}
		},
	}
}

func equalAnnotations(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// SetupWithManager runs the cycles in two lanes, two controllers over one Reconciler,
// because a workqueue serves in order: at a thousand clusters, a cluster whose primary
// just failed would otherwise wait behind every settled cluster's routine poll that
// came due before it (about 200 a second).
//   - "failover" (routine) takes the QuietPeriod polls of settled clusters, and every
//     change of a PostgresCluster;
//   - "failover-urgent" takes every cycle of a cluster that is not settled, and every
//     wake-up that may mean a failure: a pod changed, the Lease changed other than by
//     a renewal, the renewal watchdog, a change of a cluster's spec or annotations.
//
// A cycle queues the cluster's next one in the lane its state calls for (lane).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(renewalRecorder{r: r, cache: mgr.GetCache()}); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		r.watchRenewals(ctx)
		return nil
	})); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("failover").
		For(&dbv1.PostgresCluster{}).
		WatchesRawSource(r.lanes.capture(&r.lanes.routine)).
		// Each reconcile waits up to PollPeriod for the agents: enough workers that a
		// slow cluster does not hold up the others.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(lane{r: r}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("failover-urgent").
		WatchesRawSource(r.lanes.capture(&r.lanes.urgent)).
		Watches(&dbv1.PostgresCluster{}, &handler.EnqueueRequestForObject{},
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(clusterpods.ClusterOf)).
		Watches(&coordinationv1.Lease{}, r.leaseEvents()).
		// As many workers: a wave of new clusters (unsettled until their instances
		// run) is served here.
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(lane{r: r, urgent: true})
}

// durations are the time spans messages carry: 2.5s, 1.023s, 14ms, 1m30s.
var durations = regexp.MustCompile(`\b\d+(\.\d+)?(ms|s|m|h)(\d+(\.\d+)?(ms|s))?\b`)

// withoutDurations is msg with every duration replaced by one mark.
func withoutDurations(msg string) string { return durations.ReplaceAllString(msg, "…") }
