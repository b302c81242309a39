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

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
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
}

// faulting is what a fault works on.
type faulting struct {
	c       *cluster
	primary corev1.Pod
	logf    func(format string, args ...any)
}

// controls run only when CHAOS_FAULTS names them. "none" is the writers and the probe
// alone for the hold: whatever happens to the cluster then is the harness's doing.
var controls = []fault{
	{"none", "no fault: the writers and the probe run for the hold (20 s)", func(ctx context.Context, _ *faulting) error {
		return hold(ctx)
	}},
}

var faults = []fault{
	{"graceful-delete", "the primary's pod is deleted (default grace period, 60 s)", func(ctx context.Context, f *faulting) error {
		if err := k8s.Delete(ctx, &f.primary); err != nil {
			return err
		}
		return gone(ctx, f.primary)
	}},
	{"evict", "the primary's pod is evicted through the Eviction API, as kubectl drain does (retried every 5 s while a disruption budget refuses)",
		func(ctx context.Context, f *faulting) error {
			if err := evict(ctx, f.primary); err != nil {
				return err
			}
			return gone(ctx, f.primary)
		}},
	{"forced-delete", "the primary's pod is deleted with grace period 0, forced (kubectl delete --force --grace-period=0)",
		func(ctx context.Context, f *faulting) error {
			if err := k8s.Delete(ctx, &f.primary, client.GracePeriodSeconds(0)); err != nil {
				return err
			}
			return gone(ctx, f.primary)
		}},
	{"container-kill", "SIGKILL to PID 1 of the primary's postgres container; the kubelet restarts it in the same pod",
		func(ctx context.Context, f *faulting) error {
			pid, err := killContainer(f.primary, "postgres")
			f.logf("killed PID 1 (%d) of %s/postgres", pid, f.primary.Name)
			if err != nil {
				return err
			}
			return restarted(ctx, f.primary, "postgres")
		}},
	{"crash-loop", "SIGKILL to the primary's postmaster every time one appears (polled every 50 ms), until another pod is primary",
		crashLoop},
	{"freeze", "SIGSTOP to every process of the primary's pod, SIGCONT after the hold (20 s)", freezePod},
	{"network-cut", "the primary's pod loses every packet but loopback's (iptables DROP in its network namespace) during the hold (20 s)",
		func(ctx context.Context, f *faulting) error {
			return cut(ctx, f, []rule{
				{"INPUT", []string{"!", "-i", "lo", "-j", "DROP"}},
				{"OUTPUT", []string{"!", "-o", "lo", "-j", "DROP"}},
			})
		}},
	{"apiserver-cut", "the primary's pod loses the API server only (the kubernetes Service and the server's own address) during the hold (20 s)",
		apiserverCut},
	{"sidecar-kill", "SIGKILL to PID 1 of the primary's postgres container, then 1.5 s later to the operator's sidecar container",
		func(ctx context.Context, f *faulting) error {
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
			pid, err = killContainer(op, "sidecar")
			f.logf("killed PID 1 (%d) of %s/sidecar", pid, op.Name)
			return err
		}},
	{"lease-delete", "the primary Lease is deleted (the record of who may write, not the pod); the operator must rebuild it from the agents",
		leaseDelete},
	{"back-to-back", "the primary's pod is deleted; as soon as status.currentPrimary names another pod, SIGKILL to that pod's postgres container",
		func(ctx context.Context, f *faulting) error {
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
}

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
	key := client.ObjectKey{Namespace: f.c.ns, Name: dbv1.NamesOf(f.c.name).PrimaryLease()}
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
