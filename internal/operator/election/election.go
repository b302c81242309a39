// Package election shortens a leader election's takeover when the leader is known to be
// dead. A standby replica takes the election Lease over only once it has seen no
// renewal for the Lease duration: it cannot tell a dead leader from a slow one by the
// Lease alone. The kubelet can: it reports the leader's container as not running once
// its process has exited. A standby that reads that report clears the Lease's holder,
// and its elector takes the Lease at its next try instead of waiting the Lease out
// (docs/failover.md, "The operator's own availability").
//
// This changes who leads sooner, nothing else. No write of the failover protocol
// depends on who leads: each is conditional on the primary Lease's version, so two
// replicas that both believed they led could not both act on the same state (O1).
package election

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DeadLeader is a manager runnable of every replica that, until this replica is
// elected, releases the election Lease of a leader whose container the kubelet reports
// as not running.
type DeadLeader struct {
	// Reader reads the Lease and the leader's pod from the API server, uncached.
	Reader client.Reader
	// Writer updates the Lease.
	Writer client.Writer
	// Namespace and Name are the election Lease's; the holder is a pod in Namespace
	// (the leader election identity is the pod's name).
	Namespace, Name string
	// Identity is this replica's: its own Lease is never released.
	Identity string
	// Container is the name of the leader's container in its pod.
	Container string
	// Period is how often the Lease and the leader's pod are read.
	Period time.Duration
	// Elected is closed once this replica leads; the runnable returns then.
	Elected <-chan struct{}
	Log     logr.Logger
}

// NeedLeaderElection is false: it is the standbys that run it.
func (*DeadLeader) NeedLeaderElection() bool { return false }

// Start checks every Period until the context ends or this replica is elected.
func (d *DeadLeader) Start(ctx context.Context) error {
	tick := time.NewTicker(d.Period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.Elected:
			return nil
		case <-tick.C:
		}
		if err := d.check(ctx); err != nil && ctx.Err() == nil {
			d.Log.V(1).Info("Could not check the leader", "error", err.Error())
		}
	}
}

// check releases the Lease if its holder's container is not running. The update is
// conditional on the Lease's version: a leader that renewed meanwhile keeps it.
func (d *DeadLeader) check(ctx context.Context) error {
	var lease coordinationv1.Lease
	if err := d.Reader.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: d.Name}, &lease); err != nil {
		return client.IgnoreNotFound(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if holder == "" || holder == d.Identity {
		return nil
	}
	var pod corev1.Pod
	if err := d.Reader.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: holder}, &pod); err != nil {
		// No pod of that name: the leader is not a pod of this Deployment (a process run
		// by hand, say), or its pod was deleted and its process may still be stopping.
		// Neither is known dead.
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	why := Stopped(&pod, d.Container)
	if why == "" && lease.Spec.AcquireTime != nil {
		why = Restarted(&pod, d.Container, lease.Spec.AcquireTime.Time)
	}
	if why == "" {
		return nil
	}
	lease.Spec.HolderIdentity = nil
	lease.Spec.AcquireTime, lease.Spec.RenewTime = nil, nil
	if err := d.Writer.Update(ctx, &lease); err != nil {
		if apierrors.IsConflict(err) {
			return nil // renewed or taken meanwhile: read again next time
		}
		return err
	}
	d.Log.Info("Released the election Lease of a leader that is not running", "leader", holder, "reason", why)
	return nil
}

// Restarted says that container in pod started after acquired, when the Lease was
// taken, or "": the process that took the Lease has exited, and the one running now
// has not led yet. A restarted container keeps its pod's name and so its claim to the
// Lease, but it starts with nothing cached, while the standby has every cache warm;
// the restarted process leads only once ready (managerflags' readyLock), so it cannot
// take the Lease back before it could act. The start time and the acquire time are
// written on the same node, the first by its kubelet and the second by the process,
// by the same clock; the start time is in whole seconds, so a restart within the
// second of the acquisition is missed, never made up.
func Restarted(pod *corev1.Pod, container string, acquired time.Time) string {
	if s := containerStatus(pod, container); s != nil && s.State.Running != nil && s.State.Running.StartedAt.After(acquired) {
		return fmt.Sprintf("its container started again (restart %d) after it took the Lease", s.RestartCount)
	}
	return ""
}

// Stopped says why the kubelet reports container as not running in pod, or "" when it
// runs or nothing is known of it. A container that is waiting (to be started again
// after a crash, or being created) or terminated has no process: the one that held the
// Lease has exited.
func Stopped(pod *corev1.Pod, container string) string {
	s := containerStatus(pod, container)
	switch {
	case s == nil || s.State.Running != nil:
		return ""
	case s.State.Terminated != nil:
		return "its container terminated (" + s.State.Terminated.Reason + ")"
	case s.State.Waiting != nil:
		return "its container is waiting to start (" + s.State.Waiting.Reason + ")"
	}
	return ""
}

// containerStatus is what the kubelet reports of container in pod, or nil.
func containerStatus(pod *corev1.Pod, container string) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == container {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}
