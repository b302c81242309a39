//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// The operator's faults: the leading controller dies at each step of a failover, and the
// operator is rolled during a switchover (docs/chaos.md, "The operator's faults"). The
// primary fails as in freeze, every process of its pod stopped for the hold: a primary
// that neither answers nor renews, so only a failover brings writes back.

// failoverStep is a step of a failover, as the suite sees it from outside: the primary
// Lease and the agents.
type failoverStep string

const (
	// stepAtOnce: the moment the primary stopped.
	stepAtOnce failoverStep = "at-once"
	// stepDetecting: 1.5 s after the primary stopped, before the operator could revoke
	// its Lease (it fails a primary that neither answers nor renews 2 s after its last
	// renewal, and revokes once I2's wait allows).
	stepDetecting failoverStep = "detecting"
	// stepRevoked: the Lease is in a newer term than the primary's.
	stepRevoked failoverStep = "revoked"
	// stepFrozen: revoked, and a standby's agent reports itself frozen.
	stepFrozen failoverStep = "frozen"
	// stepMoved: the Lease names a new holder.
	stepMoved failoverStep = "moved"
	// stepPromoted: the new holder's agent reports itself primary.
	stepPromoted failoverStep = "promoted"
)

// operatorKillAt is the fault: the primary's pod frozen for the hold, and the leading
// controller's container killed (SIGKILL to its PID 1) once the failover reached step.
func operatorKillAt(step failoverStep) func(context.Context, *faulting) error {
	return func(ctx context.Context, f *faulting) error {
		var l coordinationv1.Lease
		if err := k8s.Get(ctx, f.c.primaryLeaseKey(), &l); err != nil {
			return err
		}
		term := ptr.Deref(l.Spec.LeaseTransitions, 0)
		frozen := make(chan error, 1)
		go func() { frozen <- freezePod(ctx, f) }()
		err := killLeaderAt(ctx, f, term, step)
		return errors.Join(err, <-frozen)
	}
}

// killLeaderAt waits until the failover of the primary, which held the Lease in term,
// reached step, and kills the leading controller's container.
func killLeaderAt(ctx context.Context, f *faulting, term int32, step failoverStep) error {
	switch step {
	case stepAtOnce: // no wait: the primary and the leader fail together
	case stepDetecting:
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(1500 * time.Millisecond):
		}
	default:
		if err := waitStep(ctx, f, term, step); err != nil {
			return err
		}
	}
	op, err := operatorPod(ctx)
	if err != nil {
		return err
	}
	pid, err := killContainer(op, "controller")
	if err != nil {
		return fmt.Errorf("killing the leading controller of %s: %w", op.Name, err)
	}
	f.logf("failover %s: killed PID 1 (%d) of %s/controller, the leader", step, pid, op.Name)
	return nil
}

// waitStep polls the Lease (and the agents, for the steps only they show) every 20 ms
// until the failover from term reached step or went past it.
func waitStep(ctx context.Context, f *faulting, term int32, step failoverStep) error {
	for {
		reached, err := atStep(ctx, f, term, step)
		if reached {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the failover did not reach %q: %w (last: %v)", step, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// atStep reports whether the failover from term reached step or went past it.
func atStep(ctx context.Context, f *faulting, term int32, step failoverStep) (bool, error) {
	var l coordinationv1.Lease
	if err := k8s.Get(ctx, f.c.primaryLeaseKey(), &l); err != nil {
		return false, err
	}
	holder, now := ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0)
	revoked := now > term
	moved := revoked && holder != "" && holder != f.primary.Name
	switch step {
	case stepRevoked:
		return revoked, nil
	case stepMoved:
		return moved, nil
	case stepFrozen:
		if moved {
			return true, nil // past it: the standbys were frozen before the move
		}
		if !revoked {
			return false, nil
		}
		pods, err := f.c.pods(ctx)
		if err != nil {
			return false, err
		}
		for _, p := range pods {
			if p.Name == f.primary.Name {
				continue
			}
			if st, _, err := agentStatus(ctx, p); err == nil && st.Frozen {
				return true, nil
			}
		}
		return false, nil
	case stepPromoted:
		if !moved {
			return false, nil
		}
		p, err := f.c.pod(ctx, holder)
		if err != nil {
			return false, err
		}
		st, _, err := agentStatus(ctx, p)
		return err == nil && st.Role == "primary", err
	}
	return false, fmt.Errorf("no step %q", step)
}

// operatorRollout asks for a switchover to a standby and, at once, rolls the operator's
// Deployment (kubectl rollout restart): the leading controller is stopped during the
// switchover it started, and its successor must finish it. It returns once the
// switchover is done and the rollout complete.
func operatorRollout(ctx context.Context, f *faulting) error {
	pods, err := f.c.pods(ctx)
	if err != nil {
		return err
	}
	target := ""
	for _, p := range pods {
		if p.Name != f.primary.Name {
			target = p.Name
			break
		}
	}
	if target == "" {
		return fmt.Errorf("no standby to switch over to among %d pods", len(pods))
	}
	pgc, err := f.c.get(ctx)
	if err != nil {
		return err
	}
	patch := client.MergeFrom(pgc.DeepCopy())
	if pgc.Annotations == nil {
		pgc.Annotations = map[string]string{}
	}
	pgc.Annotations[dbv1.AnnotationSwitchoverTo] = target
	if err := k8s.Patch(ctx, &pgc, patch); err != nil {
		return fmt.Errorf("asking for a switchover to %s: %w", target, err)
	}
	var d appsv1.Deployment
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: operatorDeployment}, &d); err != nil {
		return err
	}
	dpatch := client.MergeFrom(d.DeepCopy())
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = time.Now().Format(time.RFC3339Nano)
	if err := k8s.Patch(ctx, &d, dpatch); err != nil {
		return fmt.Errorf("rolling the operator: %w", err)
	}
	f.logf("switchover to %s asked, and the operator's Deployment rolled", target)
	if _, err := waitNewPrimary(ctx, f.c, f.primary.Name); err != nil {
		return err
	}
	if err := operatorReady(ctx); err != nil {
		return err
	}
	leader, err := operatorPod(ctx)
	if err == nil {
		f.logf("the rollout is complete; %s leads", leader.Name)
	}
	return err
}

// operatorFaults are the operator's faults, in the order they run.
var operatorFaults = []fault{
	operatorKill(stepAtOnce), operatorKill(stepDetecting), operatorKill(stepRevoked), operatorKill(stepFrozen), operatorKill(stepMoved), operatorKill(stepPromoted),
	{name: "operator-rollout", what: "a switchover to a standby is asked and the operator's Deployment rolled at once (kubectl rollout restart): its leader stops during the switchover",
		inject: operatorRollout},
	{name: "operator-drain", what: "the primary's pod and the leading operator pod evicted through the Eviction API at the same moment, as a drain of the node they share does (each retried every 5 s while a disruption budget refuses)",
		inject: operatorDrain},
	{name: "operator-partition", what: "every process of the primary's pod stopped (SIGSTOP) for the hold (20 s), and the leading controller's pod cut from every agent (iptables DROP of the agents' port in its network namespace) for the hold; it still reaches the API server",
		inject: operatorPartition},
}

// operatorDrain evicts the primary's pod and the leading operator pod together, as
// kubectl drain does for a node that runs both: the primary hands over on SIGTERM while
// the leader stops (O3), and the standby replica must promote from what the handover
// recorded in the Lease. It returns once both pods are gone and the operator's
// Deployment is whole again.
func operatorDrain(ctx context.Context, f *faulting) error {
	op, err := operatorPod(ctx)
	if err != nil {
		return err
	}
	evicted := make(chan error, 1)
	go func() { evicted <- evict(ctx, op) }()
	if err := evict(ctx, f.primary); err != nil {
		return errors.Join(err, <-evicted)
	}
	if err := <-evicted; err != nil {
		return fmt.Errorf("evicting the leading operator pod %s: %w", op.Name, err)
	}
	f.logf("evicted %s and %s, the operator's leader", f.primary.Name, op.Name)
	if err := gone(ctx, f.primary); err != nil {
		return err
	}
	if err := gone(ctx, op); err != nil {
		return err
	}
	return operatorReady(ctx)
}

// operatorPartition stops the primary as freeze does and, at the same moment, cuts the
// leading operator pod off from the agents for the hold: its controller reaches the
// API server (and so keeps its election) but can ask no agent anything.
func operatorPartition(ctx context.Context, f *faulting) error {
	op, err := operatorPod(ctx)
	if err != nil {
		return err
	}
	ns, err := podNetns(op)
	if err != nil {
		return err
	}
	defer ns.close()
	port := fmt.Sprint(agentapi.Port)
	added, err := ns.insert([]rule{
		{"OUTPUT", []string{"-p", "tcp", "--dport", port, "-j", "DROP"}},
		{"INPUT", []string{"-p", "tcp", "--sport", port, "-j", "DROP"}},
	})
	defer func() {
		if rerr := ns.remove(added); rerr != nil {
			f.logf("restoring the network of %s: %v", op.Name, rerr)
		} else {
			f.logf("restored the network of %s", op.Name)
		}
	}()
	if err != nil {
		return err
	}
	f.logf("cut %s, the leader, from the agents (port %s)", op.Name, port)
	return freezePod(ctx, f)
}

func operatorKill(step failoverStep) fault {
	what := map[failoverStep]string{
		stepAtOnce:    "at the same moment",
		stepDetecting: "1.5 s after the primary stopped, before its Lease can be revoked",
		stepRevoked:   "as soon as the Lease is revoked (a newer term, no holder)",
		stepFrozen:    "as soon as a standby's agent reports itself frozen",
		stepMoved:     "as soon as the Lease names the new primary, before it is promoted",
		stepPromoted:  "as soon as the new primary's agent reports itself primary",
	}[step]
	return fault{
		name:   "operator-kill-" + string(step),
		what:   "every process of the primary's pod stopped (SIGSTOP) for the hold (20 s), and SIGKILL to PID 1 of the leading controller's container " + what,
		inject: operatorKillAt(step),
	}
}
