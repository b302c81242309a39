package status

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
)

// Why an instance does not run is said where a user looks: status.instances[].message,
// the Ready condition and an event. The kubelet and the scheduler say it only in the
// pod's status, the StatefulSet controller only in an event on the StatefulSet, and
// the agent only in its log and its /status (recorded by the failover controller):
// a user who reads the cluster would see "0 of 3 instances are ready" and no cause.

// problemGrace is how long a pod may wait in a state that is also part of a normal
// start (not yet scheduled while its volume is provisioned, a Secret the operator is
// about to create) before it is told as a problem.
const problemGrace = 15 * time.Second

// Problem is why one instance does not run.
type Problem struct {
	// Message says it, without the instance's name.
	Message string
	// Image: an image cannot be pulled (the Ready condition's reason is then
	// ImageUnavailable, with what selects the image).
	Image bool
}

// imagePullReasons are the kubelet's reasons for a container that waits because its
// image cannot be had: it retries them with a growing back-off and never says so
// anywhere but in the pod's status.
var imagePullReasons = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true,
}

// cannotStartReasons are the kubelet's reasons for a container it cannot create or
// start (a missing Secret or ConfigMap key, a refused mount, a failed hook).
var cannotStartReasons = map[string]bool{
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"PreStartHookError": true, "PostStartHookError": true,
}

// maxDetail bounds what is quoted of a message from elsewhere.
const maxDetail = 300

// PodProblem says why p does not run or is not ready as its pod says (the scheduler's
// and the kubelet's words), the zero Problem when the pod runs or says nothing.
func PodProblem(p *corev1.Pod, now time.Time) Problem {
	if clusterpods.IsReady(p) || !p.DeletionTimestamp.IsZero() {
		return Problem{}
	}
	old := now.Sub(p.CreationTimestamp.Time) >= problemGrace
	if p.Status.Phase == corev1.PodFailed {
		return Problem{Message: fmt.Sprintf("failed (%s): %s", orUnknown(p.Status.Reason), clip(p.Status.Message))}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && now.Sub(c.LastTransitionTime.Time) >= problemGrace {
			return Problem{Message: fmt.Sprintf("cannot be scheduled (%s): %s", orUnknown(c.Reason), clip(c.Message))}
		}
	}
	limits := map[string]string{}
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			limits[c.Name] = m.String()
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		w := cs.State.Waiting
		switch {
		case w == nil:
		case imagePullReasons[w.Reason]:
			return Problem{Image: true, Message: fmt.Sprintf("cannot pull the image %q of its %s container (%s: %s)", cs.Image, cs.Name, w.Reason, clip(w.Message))}
		case cannotStartReasons[w.Reason] && old:
			return Problem{Message: fmt.Sprintf("cannot start its %s container (%s: %s)", cs.Name, w.Reason, clip(w.Message))}
		case w.Reason == "CrashLoopBackOff":
			return Problem{Message: "keeps exiting: its " + cs.Name + " container " + lastExit(cs, limits[cs.Name])}
		}
	}
	return Problem{}
}

// lastExit says how a container that keeps exiting last ended.
func lastExit(cs corev1.ContainerStatus, memoryLimit string) string {
	t := cs.LastTerminationState.Terminated
	if t == nil {
		return "is in CrashLoopBackOff"
	}
	msg := fmt.Sprintf("last exited with code %d", t.ExitCode)
	if t.Reason != "" {
		msg += " (" + t.Reason + ")"
	}
	if t.Reason == "OOMKilled" {
		msg += fmt.Sprintf(": it was killed for memory; its memory limit is %s: raise spec.resources.limits.memory, or lower shared_buffers and work_mem", orUnknown(memoryLimit))
	}
	if last := lastLine(t.Message); last != "" {
		msg += ": " + clip(last)
	}
	return msg
}

// InstanceProblems are, by instance, why each instance that does not run does not:
// what its pod says first, else what its agent last reported (agents) for a pod that is
// not ready, and for an instance without a pod, why the StatefulSet cannot create it
// (createFailure).
func InstanceProblems(c *dbv1.PostgresCluster, pods []corev1.Pod, agents map[string]string, createFailure string, now time.Time) map[string]Problem {
	out := map[string]Problem{}
	have := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		have[p.Name] = true
		pr := PodProblem(p, now)
		if pr.Message == "" && !clusterpods.IsReady(p) && p.DeletionTimestamp.IsZero() && agents[p.Name] != "" {
			pr.Message = "reports: " + clip(agents[p.Name])
		}
		if pr.Message != "" {
			out[p.Name] = pr
		}
	}
	if createFailure != "" && !c.Spec.Stopped {
		for i := range c.Spec.Replicas {
			if name := c.InstanceName(int(i)); !have[name] {
				out[name] = Problem{Message: "has no pod: the StatefulSet cannot create it: " + clip(createFailure)}
			}
		}
	}
	return out
}

// describeProblems is one sentence per instance, sorted by name.
func describeProblems(problems map[string]Problem) (text string, image bool) {
	names := make([]string, 0, len(problems))
	for name, p := range problems {
		names = append(names, name)
		image = image || p.Image
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = name + " " + problems[name].Message
	}
	return strings.Join(parts, "; "), image
}

// notRunning gives the Ready condition of a cluster that is not Healthy the reason
// InstanceNotRunning (ImageUnavailable when an image cannot be pulled) and why each
// instance does not run, while any says: the phase alone ("1 of 3 instances are
// ready") would not say why.
func notRunning(o Observed, problems map[string]Problem, phase dbv1.Phase, reason, message string) (string, string) {
	if len(problems) == 0 || phase == dbv1.PhaseHealthy || phase == dbv1.PhaseStopped {
		return reason, message
	}
	text, image := describeProblems(problems)
	if !image {
		return dbv1.ReasonInstanceNotRunning, message + "; " + text
	}
	return dbv1.ReasonImageUnavailable, message + "; " + text +
		fmt.Sprintf(". spec.version %q selects the image; set spec.image to one the nodes can pull, or give the operator one for this major (RELATED_IMAGE_POSTGRES_<major>, docs/install.md)", o.Cluster.Spec.Version)
}

// InstanceEvent is an event about one instance's problem.
type InstanceEvent struct {
	Type, Reason, Message string
}

// InstanceEvents are the events for the change from the instances' status before to
// after: a Warning for each instance whose problem is new or another, a Normal for
// each that had one and is ready now.
func InstanceEvents(before, after []dbv1.InstanceStatus) []InstanceEvent {
	had := map[string]string{}
	for _, in := range before {
		had[in.Name] = in.Message
	}
	var out []InstanceEvent
	for _, in := range after {
		switch {
		case in.Message != "" && in.Message != had[in.Name]:
			out = append(out, InstanceEvent{corev1.EventTypeWarning, dbv1.ReasonInstanceNotRunning, in.Name + " " + in.Message})
		case in.Message == "" && had[in.Name] != "" && in.Ready:
			out = append(out, InstanceEvent{corev1.EventTypeNormal, dbv1.ReasonInstanceRunning, in.Name + " runs again"})
		}
	}
	return out
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxDetail {
		return s[:maxDetail] + "..."
	}
	return s
}

// lastLine is the last line of s that says something.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
