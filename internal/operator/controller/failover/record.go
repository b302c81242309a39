package failover

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// MissingLease is everything the decision on a missing Lease is made from.
type MissingLease struct {
	// Expected are the instances spec.replicas asks for.
	Expected []string
	// Instances are the instance pods as observed now.
	Instances []Instance
	// Bootstrapped: the PostgresCluster's Bootstrapped condition is True.
	Bootstrapped bool
	// Remembered is the last Lease the operator read, if it read one since it started.
	Remembered *primarylease.Record
	// SynchronousReplicas is spec.postgresql.synchronousReplicas.
	SynchronousReplicas int
	// KeptVolumes are the instances whose PersistentVolumeClaim is older than the
	// PostgresCluster: volumes kept from a cluster of the same name deleted before.
	KeptVolumes []string
}

// LeaseOrigin is what a missing Lease is created as.
type LeaseOrigin struct {
	// Record is the Lease to create; nil to create none yet, and wait (Reason says for
	// what).
	Record *primarylease.Record
	// Recreated: the cluster had data; the Lease is rebuilt, not a new cluster's.
	Recreated bool
	// Reason is for people: the evidence, or what is waited for.
	Reason string
}

// DecideMissingLease decides what a missing primary Lease is created as. A cluster with
// any sign of data (the Bootstrapped condition, an agent reporting a data directory) is
// never treated as new: its Lease is rebuilt from the agents' views, naming the primary
// they all follow when that primary runs in the newest term anyone saw, and naming no
// holder otherwise, so that the failover rules compare WAL positions. Only a cluster
// without a sign of data gets a new cluster's Lease, naming instance 0.
func DecideMissingLease(in MissingLease) LeaseOrigin {
	var withData []string
	for _, i := range in.Instances {
		if i.Reachable && i.Status.SystemIdentifier != "" {
			withData = append(withData, i.Name)
		}
	}
	if !in.Bootstrapped && len(withData) == 0 && in.Remembered == nil {
		if unseen := unseenKeptVolumes(in); len(unseen) > 0 {
			return LeaseOrigin{Reason: fmt.Sprintf(
				"waiting for the agents of %s to report their volumes: they are older than this PostgresCluster and may hold a deleted cluster's data, which a new cluster's first primary must not ignore",
				strings.Join(unseen, ", "))}
		}
		return newClusterLease(in)
	}
	evidence := fmt.Sprintf("instances with data: %s", listOrNone(withData))
	if in.Bootstrapped {
		evidence = "the cluster's Bootstrapped condition; " + evidence
	}
	rec := primarylease.Record{Bootstrapped: true, Timeline: highestTimeline(in.Instances)}
	term, holder, agreed := newestView(in.Instances)
	if r := in.Remembered; r != nil && r.Term > term {
		term, holder, agreed = r.Term, r.Holder, false
		rec.Timeline = max(rec.Timeline, r.Timeline)
	}
	if h := find(in.Instances, holder); agreed && holder != "" && h != nil && h.Reachable && h.Status.Running &&
		h.Status.Role == agentapi.RolePrimary && h.Status.Term == term {
		rec.Holder, rec.Term = holder, term
		rec.Sync = everyOtherMember(in.Expected, holder, in.SynchronousReplicas)
		return LeaseOrigin{Record: &rec, Recreated: true, Reason: fmt.Sprintf(
			"recreated the deleted primary Lease naming %s in term %d, the primary every agent in that term follows (%s)", holder, term, evidence)}
	}
	rec.Term = term + 1
	rec.Handover = &primarylease.Handover{From: holder, Term: term, Recreated: true,
		Reason: "the primary Lease was deleted and no running primary could be established from the agents"}
	rec.Sync = everyOtherMember(in.Expected, holder, in.SynchronousReplicas)
	return LeaseOrigin{Record: &rec, Recreated: true, Reason: fmt.Sprintf(
		"recreated the deleted primary Lease naming no primary in term %d (the agents' newest view: %s in term %d); the failover rules choose one (%s)",
		rec.Term, orUnknown(holder), term, evidence)}
}

// unseenKeptVolumes are the instances with a kept volume whose agent has not answered:
// their volumes may hold data.
func unseenKeptVolumes(in MissingLease) []string {
	var unseen []string
	for _, name := range in.KeptVolumes {
		if i := find(in.Instances, name); i == nil || !i.Reachable {
			unseen = append(unseen, name)
		}
	}
	return unseen
}

// newClusterLease is the Lease of a cluster that shows no sign of data: no record, no
// agent reporting data, and every volume older than the PostgresCluster (kept from a
// deleted cluster of the same name, whose Lease was deleted too) seen empty by its
// agent. Volumes newer than the PostgresCluster were made for it, empty.
func newClusterLease(in MissingLease) LeaseOrigin {
	first := in.Expected[0]
	return LeaseOrigin{Record: &primarylease.Record{Holder: first},
		Reason: fmt.Sprintf("no instance reports data: %s is the first primary", first)}
}

// newestView is the newest term any reachable agent saw, and the holder the agents in
// that term name; agreed is false when they name different holders.
func newestView(instances []Instance) (term int32, holder string, agreed bool) {
	agreed = true
	seen := false
	for _, i := range instances {
		if !i.Reachable {
			continue
		}
		switch st := i.Status; {
		case !seen || st.Term > term:
			term, holder, agreed, seen = st.Term, st.Holder, true, true
		case st.Term == term && st.Holder != holder:
			agreed = false
		}
	}
	return term, holder, agreed
}

func highestTimeline(instances []Instance) int64 {
	var tl int64
	for _, i := range instances {
		if i.Reachable {
			tl = max(tl, i.Status.Timeline)
		}
	}
	return tl
}

// everyOtherMember is the synchronous set a rebuilt Lease starts with: every instance
// but the holder may have acknowledged a commit, which is what the failover rules
// assume of a member until the holder's next renewal writes its real set. Nil in
// asynchronous mode.
func everyOtherMember(expected []string, holder string, k int) *primarylease.SyncSet {
	if k == 0 {
		return nil
	}
	set := &primarylease.SyncSet{K: k, Members: map[string]string{}}
	for _, name := range expected {
		if name != holder {
			set.Members[name] = ""
		}
	}
	return set
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none answering"
	}
	return strings.Join(slices.Sorted(slices.Values(names)), ", ")
}
