package failover

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
	"github.com/pgpilot/pgpilot/internal/protocol/report"
)

// NextDataGuard is the record of the agents' data protection after this observation:
// what each answering agent reports now; for one that does not answer, what it last
// reported, as long as its pod exists.
func NextDataGuard(prev *report.DataGuard, instances []Instance) report.DataGuard {
	next := report.DataGuard{Refusals: map[string]string{}, SetAside: map[string][]string{}}
	for _, i := range instances {
		switch {
		case i.Reachable:
			if i.Status.Refusal != "" {
				next.Refusals[i.Name] = i.Status.Refusal
			}
			for _, a := range i.Status.SetAside {
				next.SetAside[i.Name] = append(next.SetAside[i.Name], setAsideLine(a.Name, a.Reason, a.Superseded, a.Bytes))
			}
		case prev != nil && i.Pod != nil:
			if r, ok := prev.Refusals[i.Name]; ok {
				next.Refusals[i.Name] = r
			}
			if s, ok := prev.SetAside[i.Name]; ok {
				next.SetAside[i.Name] = s
			}
		}
	}
	return next
}

func setAsideLine(name, reason string, superseded bool, bytes int64) string {
	state := "kept until a newer clone is verified"
	if superseded {
		state = "superseded, removed when the volume needs the space"
	}
	return fmt.Sprintf("%s: %s (%d MiB, %s)", name, reason, bytes>>20, state)
}

// DataGuardEvent is one change between two records, for an event.
type DataGuardEvent struct {
	Type, Reason, Message string
}

// DataGuardEvents are the changes from prev to next worth an event: a new refusal, a
// newly set-aside directory, and one that an answering agent (in answered) no longer
// reports.
func DataGuardEvents(prev *report.DataGuard, next report.DataGuard, answered []string) []DataGuardEvent {
	if prev == nil {
		prev = &report.DataGuard{}
	}
	var out []DataGuardEvent
	for _, pod := range slices.Sorted(maps.Keys(next.Refusals)) {
		if msg := next.Refusals[pod]; prev.Refusals[pod] != msg {
			out = append(out, DataGuardEvent{corev1.EventTypeWarning, dbv1.ReasonDataRefused, pod + ": " + msg})
		}
	}
	names := func(g *report.DataGuard, pod string) map[string]string {
		m := map[string]string{}
		for _, line := range g.SetAside[pod] {
			name, _, _ := strings.Cut(line, ": ")
			m[name] = line
		}
		return m
	}
	pods := slices.Sorted(maps.Keys(next.SetAside))
	for _, pod := range slices.Sorted(maps.Keys(prev.SetAside)) {
		if !slices.Contains(pods, pod) {
			pods = append(pods, pod)
		}
	}
	for _, pod := range pods {
		before, now := names(prev, pod), names(&next, pod)
		for _, name := range slices.Sorted(maps.Keys(now)) {
			if _, ok := before[name]; !ok {
				out = append(out, DataGuardEvent{corev1.EventTypeWarning, dbv1.ReasonDataSetAside,
					fmt.Sprintf("%s replaced its data directory by a new clone and kept the old one on its volume: %s", pod, now[name])})
			}
		}
		if !slices.Contains(answered, pod) {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(before)) {
			if _, ok := now[name]; !ok {
				out = append(out, DataGuardEvent{corev1.EventTypeNormal, dbv1.ReasonSetAsideRemoved,
					fmt.Sprintf("%s removed the set-aside data directory %s: a verified clone superseded it and the volume needed the space", pod, name)})
			}
		}
	}
	return out
}

// recordDataGuard records the agents' refusals and set-aside directories in the report
// for the status controller, with an event for each change.
func (c *cycle) recordDataGuard(ctx context.Context) error {
	prev := c.reported.DataGuard
	next := NextDataGuard(prev, c.instances)
	empty := len(next.Refusals) == 0 && len(next.SetAside) == 0
	if prev == nil && empty {
		return nil
	}
	if prev != nil && equalGuard(*prev, next) {
		return nil
	}
	c.tell("Data protection changed", DataGuardEvents(prev, next, answered(c.instances)))
	if err := c.record(ctx, report.KeyDataGuard, &next); err != nil {
		return fmt.Errorf("recording the agents' data protection: %w", err)
	}
	c.reported.DataGuard = &next
	if empty {
		c.reported.DataGuard = nil
	}
	return nil
}

// answered are the instances whose agents answered.
// tell logs each event with what changed, and records it on the cluster.
func (c *cycle) tell(what string, events []DataGuardEvent) {
	for _, e := range events {
		c.log(what, "reason", e.Reason, "message", e.Message)
		c.r.recorder.Event(c.cluster, e.Type, e.Reason, e.Message)
	}
}

func answered(instances []Instance) []string {
	var out []string
	for _, i := range instances {
		if i.Reachable {
			out = append(out, i.Name)
		}
	}
	return out
}

func equalGuard(a, b report.DataGuard) bool {
	return maps.Equal(a.Refusals, b.Refusals) && maps.EqualFunc(a.SetAside, b.SetAside, slices.Equal[[]string])
}

// DataVersion is the PostgreSQL major version the holder runs as a ready primary: the
// version of the cluster's data. "" when it cannot say now.
func DataVersion(holder string, instances []Instance) string {
	i := find(instances, holder)
	if i == nil || !i.Reachable || i.Status.Role != agentapi.RolePrimary || i.Status.PostgresVersion <= 0 {
		return ""
	}
	return strconv.Itoa(i.Status.PostgresVersion / 10000)
}

// recordDataVersion records the data's major version in the report when the primary
// runs another than recorded (the first time, or after a person edited it).
func (c *cycle) recordDataVersion(ctx context.Context) error {
	holder := primarylease.Parse(c.lease).Holder
	v := DataVersion(holder, c.instances)
	if v == "" || v == c.reported.DataVersion {
		return nil
	}
	if err := c.record(ctx, report.KeyDataVersion, v); err != nil {
		return fmt.Errorf("recording the data's major version: %w", err)
	}
	c.reported.DataVersion = v
	c.log("Recorded the data's major version", "version", v, "primary", holder)
	return nil
}
