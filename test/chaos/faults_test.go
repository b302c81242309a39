//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/pgpilot/pgpilot/test/testutil"
)

// fault is one way the primary fails. inject hits primary (the pod status.currentPrimary
// named when the round began) and returns once the fault is over: at once for a kill
// or a delete, after the hold for a freeze or a cut, which it undoes before returning.
// ctx ends at the round's recovery timeout.
type fault struct {
	name string
	// what says what inject does, for the report.
	what   string
	inject func(ctx context.Context, f *faulting) error
	// cancelling adds the writer that sends a cancel request when an attempt times
	// out (testutil.WriterCancelling) to the round; bulk the writer that commits
	// bulkRows rows per transaction (testutil.WriterBulk).
	cancelling, bulk bool
}

// bulkRows is the size of the bulk writer's transactions.
const bulkRows = 20000

// faulting is what a fault works on.
type faulting struct {
	c       *cluster
	primary corev1.Pod
	w       *testutil.Writer
	logf    func(format string, args ...any)
}

// controls run only when CHAOS_FAULTS names them. "none" is the writers and the probe
// alone for the hold: whatever happens to the cluster then is the harness's doing.
var controls = []fault{
	{name: "none", what: "no fault: the writers and the probe run for the hold (20 s)", inject: func(ctx context.Context, _ *faulting) error {
		return hold(ctx)
	}},
}

// faults are the primary's faults, then the operator's (operator_test.go).
var faults = append([]fault{
	{name: "graceful-delete", what: "the primary's pod is deleted (default grace period, 60 s)", inject: func(ctx context.Context, f *faulting) error {
		if err := k8s.Delete(ctx, &f.primary); err != nil {
			return err
		}
		return gone(ctx, f.primary)
	}},
	{name: "evict", what: "the primary's pod is evicted through the Eviction API, as kubectl drain does (retried every 5 s while a disruption budget refuses)",
		inject: func(ctx context.Context, f *faulting) error {
			if err := evict(ctx, f.primary); err != nil {
				return err
			}
			return gone(ctx, f.primary)
		}},
	{name: "forced-delete", what: "the primary's pod is deleted with grace period 0, forced (kubectl delete --force --grace-period=0)",
		inject: func(ctx context.Context, f *faulting) error {
			if err := k8s.Delete(ctx, &f.primary, client.GracePeriodSeconds(0)); err != nil {
				return err
			}
			return gone(ctx, f.primary)
		}},
	{name: "container-kill", what: "SIGKILL to PID 1 of the primary's postgres container; the kubelet restarts it in the same pod",
		inject: func(ctx context.Context, f *faulting) error {
			pid, err := killContainer(f.primary, "postgres")
			f.logf("killed PID 1 (%d) of %s/postgres", pid, f.primary.Name)
			if err != nil {
				return err
			}
			return restarted(ctx, f.primary, "postgres")
		}},
	{name: "sandbox-kill", what: "SIGKILL to every process of the primary's pod, its sandbox's pause process first; the kubelet makes a new sandbox, and the pod comes back with a new IP",
		inject: sandboxKill},
	{name: "bulk-kill", what: fmt.Sprintf("SIGKILL to PID 1 of the primary's postgres container halfway through a %d-row INSERT ... SELECT", bulkRows),
		inject: bulkKill, bulk: true},
	{name: "crash-loop", what: "SIGKILL to the primary's postmaster every time one appears (polled every 50 ms), until another pod is primary",
		inject: crashLoop},
	{name: "freeze", what: "SIGSTOP to every process of the primary's pod, SIGCONT after the hold (20 s)", inject: freezePod},
	{name: "network-cut", what: "the primary's pod loses every packet but loopback's (iptables DROP in its network namespace) during the hold (20 s)",
		inject: func(ctx context.Context, f *faulting) error {
			return cut(ctx, f, []rule{
				{"INPUT", []string{"!", "-i", "lo", "-j", "DROP"}},
				{"OUTPUT", []string{"!", "-o", "lo", "-j", "DROP"}},
			})
		}},
	{name: "apiserver-cut", what: "the primary's pod loses the API server only (the kubernetes Service and the server's own address) during the hold (20 s)",
		inject: apiserverCut},
	{name: "reachable-cut", what: "the primary's pod loses the API server, its peers and the operator but not its clients (the suite's writers and probe, from the node, on port 5432) during the hold (20 s)",
		inject: reachableCut},
	{name: "reachable-cut-cancel", what: "reachable-cut, with a writer that sends a cancel request when a commit waits for more than 1 s",
		inject: reachableCut, cancelling: true},
	{name: "controller-kill", what: "SIGKILL to PID 1 of the primary's postgres container, then 1.5 s later to the operator's controller container",
		inject: func(ctx context.Context, f *faulting) error {
			pid, err := killContainer(f.primary, "postgres")
			if err != nil {
				return err
			}
			f.logf("killed PID 1 (%d) of %s/postgres", pid, f.primary.Name)
			// The delay is the fault: the operator dies while it handles the failure.
			time.Sleep(1500 * time.Millisecond)
			op, err := operatorPod(ctx)
			if err != nil {
				return err
			}
			pid, err = killContainer(op, "controller")
			f.logf("killed PID 1 (%d) of %s/controller", pid, op.Name)
			return err
		}},
	{name: "lease-delete", what: "the primary Lease is deleted (the record of who may write, not the pod); the operator must rebuild it from the agents",
		inject: leaseDelete},
	{name: "back-to-back", what: "the primary's pod is deleted; as soon as status.currentPrimary names another pod, SIGKILL to that pod's postgres container",
		inject: func(ctx context.Context, f *faulting) error {
			if err := k8s.Delete(ctx, &f.primary); err != nil {
				return err
			}
			next, err := waitNewPrimary(ctx, f.c, f.primary.Name)
			if err != nil {
				return err
			}
			pid, err := killContainer(next, "postgres")
			f.logf("%s became primary; killed PID 1 (%d) of its postgres container", next.Name, pid)
			return err
		}},
}, operatorFaults...)

// evict asks the Eviction API to evict pod until it accepts: a 429 is a disruption
// budget refusing for now, which kubectl drain retries every 5 s.
func evict(ctx context.Context, pod corev1.Pod) error {
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	for {
		err := k8s.SubResource("eviction").Create(ctx, &pod, eviction)
		if !apierrors.IsTooManyRequests(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("evicting %s: still refused when the round ended: %w", pod.Name, err)
		case <-time.After(5 * time.Second):
		}
	}
}

// leaseDelete deletes the cluster's primary Lease and waits until the operator has
// created it again (another UID).
func leaseDelete(ctx context.Context, f *faulting) error {
	key := f.c.primaryLeaseKey()
	var l coordinationv1.Lease
	if err := k8s.Get(ctx, key, &l); err != nil {
		return err
	}
	if err := k8s.Delete(ctx, &l); err != nil {
		return err
	}
	for {
		var now coordinationv1.Lease
		if err := k8s.Get(ctx, key, &now); err == nil && now.UID != l.UID {
			f.logf("the Lease was recreated naming %q in term %d (it named %q in term %d)",
				deref(now.Spec.HolderIdentity), deref(now.Spec.LeaseTransitions), deref(l.Spec.HolderIdentity), deref(l.Spec.LeaseTransitions))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the primary Lease was not recreated: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitNewPrimary polls status.currentPrimary until it names another pod than old, and
// returns that pod.
func waitNewPrimary(ctx context.Context, c *cluster, old string) (corev1.Pod, error) {
	for {
		p, err := c.primary(ctx)
		if err == nil && p.Name != old {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return corev1.Pod{}, fmt.Errorf("status.currentPrimary still names %s: %w", old, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// crashLoop kills the postmaster of the primary's pod every time its agent starts one,
// as a postgres that crashes at every start would, until status.currentPrimary names
// another pod. A single crash is repaired in place by the agent; a primary that cannot
// stay up must be replaced.
func crashLoop(ctx context.Context, f *faulting) error {
	kills := 0
	defer func() { f.logf("killed %d postmasters of %s", kills, f.primary.Name) }()
	for {
		pids, err := postmasters(f.primary)
		if err != nil {
			return err
		}
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				kills++
			}
		}
		if p, err := f.c.primary(ctx); err == nil && p.Name != f.primary.Name {
			if kills == 0 {
				return fmt.Errorf("the primary moved from %s to %s before any postmaster was killed", f.primary.Name, p.Name)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s still primary after %d postmasters killed: %w", f.primary.Name, kills, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freezePod(ctx context.Context, f *faulting) error {
	pids, err := freeze(f.primary)
	// Thawed whatever happens, the test's end included.
	defer func() {
		thaw(f.primary, pids)
		f.logf("SIGCONT to the %d processes of %s", len(pids), f.primary.Name)
	}()
	if err != nil {
		return err
	}
	f.logf("SIGSTOP to the %d processes of %s; holding %s", len(pids), f.primary.Name, settings.hold)
	return hold(ctx)
}

// hold waits for the fault's hold, or ctx.
func hold(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(settings.hold):
		return nil
	}
}

// cut adds rules to the primary pod's network namespace for the hold, then removes them.
func cut(ctx context.Context, f *faulting, rules []rule) error {
	ns, err := podNetns(f.primary)
	if err != nil {
		return err
	}
	defer ns.close()
	added, err := ns.insert(rules)
	defer func() {
		if rerr := ns.remove(added); rerr != nil {
			f.logf("restoring the network of %s: %v", f.primary.Name, rerr)
		} else {
			f.logf("restored the network of %s", f.primary.Name)
		}
	}()
	if err != nil {
		return err
	}
	f.logf("cut %s (%d iptables rules); holding %s", f.primary.Name, len(added), settings.hold)
	return hold(ctx)
}

// apiserverCut drops, in the primary pod's namespace, the traffic to and from the
// kubernetes Service's address and port and the API server's own addresses behind it.
// The pod still reaches its peers, the DNS and the operator, and they reach it.
func apiserverCut(ctx context.Context, f *faulting) error {
	var svc corev1.Service
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, &svc); err != nil {
		return err
	}
	var rules []rule
	drop := func(ip string, port int32) {
		p := fmt.Sprint(port)
		rules = append(rules,
			rule{"OUTPUT", []string{"-d", ip, "-p", "tcp", "--dport", p, "-j", "DROP"}},
			rule{"INPUT", []string{"-s", ip, "-p", "tcp", "--sport", p, "-j", "DROP"}})
	}
	for _, port := range svc.Spec.Ports {
		drop(svc.Spec.ClusterIP, port.Port)
	}
	var slices discoveryv1.EndpointSliceList
	if err := k8s.List(ctx, &slices, client.InNamespace("default"),
		client.MatchingLabels{discoveryv1.LabelServiceName: "kubernetes"}); err != nil {
		return err
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			for _, ip := range e.Addresses {
				for _, port := range s.Ports {
					if port.Port != nil {
						drop(ip, *port.Port)
					}
				}
			}
		}
	}
	if len(rules) <= 2 {
		return errors.New("found no address of the API server behind the kubernetes Service")
	}
	return cut(ctx, f, rules)
}

// sandboxKill kills every process of the primary's pod with SIGKILL, the sandbox's (the
// pause process, which holds the pod's network namespace) first, as a node whose
// runtime loses a pod does. The kubelet then creates a new sandbox, with a new network
// namespace and a new address, and starts the containers again in it. It waits until
// the pod has a new IP (or was replaced).
func sandboxKill(ctx context.Context, f *faulting) error {
	sandbox, others, err := sandboxProcs(f.primary)
	if err != nil {
		return err
	}
	for _, pid := range append(sandbox, others...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	f.logf("SIGKILL to the sandbox of %s (%v) and its %d other processes", f.primary.Name, sandbox, len(others))
	for {
		var now corev1.Pod
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&f.primary), &now)
		switch {
		case apierrors.IsNotFound(err) || err == nil && now.UID != f.primary.UID:
			f.logf("%s was replaced", f.primary.Name)
			return nil
		case err == nil && now.Status.PodIP != "" && now.Status.PodIP != f.primary.Status.PodIP:
			f.logf("%s came back with IP %s (was %s)", f.primary.Name, now.Status.PodIP, f.primary.Status.PodIP)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s did not come back with a new IP: %w", f.primary.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// bulkKill waits until the round's bulk writer is halfway through a transaction (by
// the duration of its last acknowledged one; 100 ms in before any), then kills PID 1 of
// the primary's postgres container as container-kill does.
func bulkKill(ctx context.Context, f *faulting) error {
	// Half the last acknowledged transaction's duration, read again every 250 ms; 100 ms
	// before any is acknowledged. It was at least 100 ms, and the longest one's: on a
	// quiet node a 20,000-row transaction takes less than 200 ms, and a bulk-kill round
	// waited its 5 minutes while 151 of them went by (another 2 minutes 15 s).
	var half time.Duration
	var read time.Time
	for {
		if time.Since(read) > 250*time.Millisecond {
			var last testutil.Attempt
			for _, a := range f.w.Attempts() {
				if a.Writer == testutil.WriterBulk && a.Acked() && a.End.After(last.End) {
					last = a
				}
			}
			half, read = 100*time.Millisecond, time.Now()
			if !last.End.IsZero() {
				half = max(5*time.Millisecond, last.End.Sub(last.Start)/2)
			}
		}
		if start, ok := f.w.InFlight(testutil.WriterBulk); ok && time.Since(start) >= half {
			f.logf("a %d-row transaction has been in flight for %s", bulkRows, time.Since(start).Round(time.Millisecond))
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no bulk transaction in flight: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	pid, err := killContainer(f.primary, "postgres")
	f.logf("killed PID 1 (%d) of %s/postgres", pid, f.primary.Name)
	if err != nil {
		return err
	}
	return restarted(ctx, f.primary, "postgres")
}

// reachableCut cuts the primary's pod from everything but its clients for the hold:
// in its network namespace, TCP to port 5432 from the suite's own addresses and the
// answers are accepted, loopback too, and every other packet is dropped. The suite
// runs in the node's network namespace, so its writers and probe reach the pod from
// the node: directly (the probe, from the bridge's address) and through the -rw
// Service (the writers, from the address the Service's route gives, masqueraded or
// not by kube-proxy), and in a pooler mode from the pooler's pods. The API server (on
// the node, but on its own port), the peers and
// the operator (pods) are cut: the primary loses its Lease confirmation and its
// standbys while clients still reach it, so what it acknowledges then is seen.
func reachableCut(ctx context.Context, f *faulting) error {
	if f.primary.Status.PodIP == "" {
		return fmt.Errorf("pod %s has no IP", f.primary.Name)
	}
	sources, err := clientSources(f.primary.Status.PodIP, f.c.rw.Host)
	if err != nil {
		return err
	}
	// Through a pooler, the clients of the primary are the pooler's pods.
	poolers, err := f.c.poolerIPs(ctx)
	if err != nil {
		return err
	}
	sources = append(sources, poolers...)
	f.logf("clients of %s reach it from %v", f.primary.Name, sources)
	// Inserted one by one at the head of their chain: the last inserted comes first, so
	// the DROPs go in first and the exceptions after them.
	rules := []rule{
		{"INPUT", []string{"!", "-i", "lo", "-j", "DROP"}},
		{"OUTPUT", []string{"!", "-o", "lo", "-j", "DROP"}},
	}
	for _, ip := range sources {
		rules = append(rules,
			rule{"INPUT", []string{"-s", ip, "-p", "tcp", "--dport", "5432", "-j", "ACCEPT"}},
			rule{"OUTPUT", []string{"-d", ip, "-p", "tcp", "--sport", "5432", "-j", "ACCEPT"}})
	}
	return cut(ctx, f, rules)
}

// restarted waits until the kubelet has seen the killed container exit (its restart
// count grew, or the pod was replaced): until then the instance's status can still
// look healthy, and the round would end before its fault did.
func restarted(ctx context.Context, pod corev1.Pod, container string) error {
	count := func(p corev1.Pod) int32 {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == container {
				return cs.RestartCount
			}
		}
		return 0
	}
	before := count(pod)
	for {
		var now corev1.Pod
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&pod), &now)
		if apierrors.IsNotFound(err) || err == nil && (now.UID != pod.UID || count(now) > before) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %s/%s was not restarted: %w", pod.Name, container, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gone waits until pod (this UID) no longer exists: until then a deleted primary that
// is still handing over looks healthy, and the round would end before its fault did.
func gone(ctx context.Context, pod corev1.Pod) error {
	for {
		var now corev1.Pod
		err := k8s.Get(ctx, client.ObjectKeyFromObject(&pod), &now)
		if apierrors.IsNotFound(err) || err == nil && now.UID != pod.UID {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s was not gone: %w", pod.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
