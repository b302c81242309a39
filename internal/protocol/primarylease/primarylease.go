// Package primarylease owns the primary Lease of a cluster: the single record of who may
// write (docs/failover.md). Every read parses it into a Record and every write goes
// through one of the changes here, applied with optimistic concurrency, so the agent
// and the operator never undo each other's writes.
package primarylease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// The protocol's times (docs/failover.md).
const (
	// Duration is T: a primary acknowledges commits only until T after its last
	// confirmation was sent.
	Duration = 4 * time.Second
	// RenewInterval is how often the holder's agent renews the Lease.
	RenewInterval = time.Second
	// Margin is what the operator waits beyond T after the last renewal it observed
	// before it takes a silent primary for stopped.
	Margin = time.Second
)

// Annotations of the Lease this package owns besides the api/v1 ones.
const (
	// AnnotationHandover says why the Lease names no holder (JSON of a Handover).
	AnnotationHandover = "db.example.com/handover"
	// AnnotationSynchronous is the synchronous set (JSON of a SyncSet).
	AnnotationSynchronous = "db.example.com/synchronous"
	// AnnotationTimeline is the timeline ID reserved for the promotion of the term's
	// holder (a decimal number; see Record.Timeline).
	AnnotationTimeline = "db.example.com/timeline"
)

// ErrNotHolder is returned by a change whose precondition on the holder or the term no
// longer holds: the Lease moved on.
var ErrNotHolder = errors.New("the primary Lease no longer names this holder in this term")

// Record is the primary Lease, read.
type Record struct {
	// Holder is the primary's pod, "" while a handover or failover is in progress or
	// before the first primary is designated.
	Holder string
	// Term grows by one at every change of holder.
	Term int32
	// RenewTime is the holder's last renewal; zero when none.
	RenewTime time.Time
	// Bootstrapped: the cluster's first primary came up; an empty volume is a lost
	// volume from then on, never a reason to run initdb.
	Bootstrapped bool
	// Handover says why Holder is "" (nil otherwise, or when unknown).
	Handover *Handover
	// Sync is the synchronous set; nil in asynchronous mode or before any was recorded.
	Sync *SyncSet
	// Timeline is the timeline ID the holder's promotion in this term takes, and no
	// instance of the cluster is on a higher one: every Move reserves one above all it
	// knows of, so no two promotions choose the same ID (docs/failover.md, "Timeline
	// IDs"). 0 when none was recorded.
	Timeline int64
	// Hibernation is where spec.stopped stands; nil while the cluster runs.
	Hibernation *Hibernation
	// Fenced are the instances whose postgres must stay stopped (the user's fencing);
	// the holder is among them only when no other instance may serve.
	Fenced []string
	// ResourceVersion of the Lease read.
	ResourceVersion string
}

// Phases of a hibernation.
const (
	// Stopping: the holder stops postgres cleanly and keeps the Lease; the standbys
	// keep running to receive its final WAL.
	Stopping = "stopping"
	// Stopped: every pod may go; the holder stays the primary.
	Stopped = "stopped"
	// Resuming: the pods are back; the holder starts as the primary again.
	Resuming = "resuming"
)

// Hibernation is a cluster stopped on purpose (spec.stopped), the primary role kept by
// Holder in Term, so that resuming starts the same primary (docs/operations.md).
type Hibernation struct {
	Phase  string `json:"phase"`
	Holder string `json:"holder"`
	Term   int32  `json:"term"`
	// Since is when Phase began.
	Since metav1.Time `json:"since"`
	// FinalLSN and Timeline are where the holder's WAL ended when it stopped (its
	// shutdown checkpoint); empty before it did.
	FinalLSN string `json:"finalLSN,omitempty"`
	Timeline int64  `json:"timeline,omitempty"`
}

// Holds reports whether the hibernation keeps the Lease's holder in term stopped:
// stopping or stopped, recorded for that holder and term.
func (h *Hibernation) Holds(holder string, term int32) bool {
	return h != nil && h.Holder == holder && h.Term == term && (h.Phase == Stopping || h.Phase == Stopped)
}

// IsFenced reports whether pod is among r.Fenced.
func (r Record) IsFenced(pod string) bool { return slices.Contains(r.Fenced, pod) }

// KeepsDown reports whether the Lease keeps pod's postgres stopped: fenced, or the
// holder of a hibernation that is stopping or stopped.
func (r Record) KeepsDown(pod string) bool {
	return r.IsFenced(pod) || pod == r.Holder && r.Hibernation.Holds(r.Holder, r.Term)
}

// Handover is how the Lease came to name no holder.
type Handover struct {
	// From is the last holder.
	From string `json:"from"`
	// Term is the term From held.
	Term int32 `json:"term"`
	// Reason is for people.
	Reason string `json:"reason"`
	// Clean: From stopped after it stopped acknowledging commits, and every commit it
	// ever acknowledged is at or before FinalLSN on Timeline: the end of its WAL (its
	// shutdown checkpoint) after a fast stop, or the last position its commit gate
	// confirmed after an immediate stop, which it made only once a standby had it. A
	// standby that has FinalLSN holds every commit From ever acknowledged.
	Clean    bool   `json:"clean"`
	FinalLSN string `json:"finalLSN,omitempty"`
	Timeline int64  `json:"timeline,omitempty"`
	// Released: From's agent gave the Lease up itself (it is stopped); otherwise the
	// operator revoked it.
	Released bool `json:"released,omitempty"`
	// Recreated: the Lease was deleted and the operator recreated it from what the
	// agents reported, naming no holder because none could be established.
	Recreated bool `json:"recreated,omitempty"`
	// At is when the holder became "".
	At metav1.Time `json:"at"`
}

// CleanRelease reports whether From stopped cleanly and released the Lease itself:
// no more WAL comes from it, so every standby's position is final without a freeze.
func (h *Handover) CleanRelease() bool { return h != nil && h.Clean && h.Released }

// SyncSet is every standby that may have acknowledged a commit of the holder since the
// Lease last moved, for synchronous_standby_names = FIRST K+1 (gate, members).
type SyncSet struct {
	// K is spec.postgresql.synchronousReplicas when the set was recorded.
	K int `json:"k"`
	// Members maps a standby's pod to "" while it is in the holder's rule, or to the
	// LSN up to which it may have acknowledged commits once it was taken out.
	Members map[string]string `json:"members"`
}

// Parse reads a Lease.
func Parse(l *coordinationv1.Lease) Record {
	r := Record{ResourceVersion: l.ResourceVersion}
	if l.Spec.HolderIdentity != nil {
		r.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		r.Term = *l.Spec.LeaseTransitions
	}
	if l.Spec.RenewTime != nil {
		r.RenewTime = l.Spec.RenewTime.Time
	}
	a := l.Annotations
	r.Bootstrapped = a[dbv1.AnnotationBootstrapped] == "true"
	r.Timeline, _ = strconv.ParseInt(a[AnnotationTimeline], 10, 64)
	r.Handover = decode[Handover](a[AnnotationHandover])
	r.Sync = decode[SyncSet](a[AnnotationSynchronous])
	r.Hibernation = decode[Hibernation](a[dbv1.AnnotationHibernation])
	if fenced := decode[[]string](a[dbv1.AnnotationFenced]); fenced != nil {
		r.Fenced = *fenced
	}
	return r
}

// decode is nil for a missing or unreadable annotation: a person may have edited it,
// and every reader treats "unknown" conservatively.
func decode[T any](raw string) *T {
	if raw == "" {
		return nil
	}
	var v T
	if json.Unmarshal([]byte(raw), &v) != nil {
		return nil
	}
	return &v
}

// setJSON sets the annotation key to v as JSON, or removes it when v is nil or a nil
// pointer (written as JSON, that would be "null", which Parse reads as a zero value).
func setJSON(l *coordinationv1.Lease, key string, v any) error {
	if rv := reflect.ValueOf(v); !rv.IsValid() || rv.Kind() == reflect.Pointer && rv.IsNil() {
		delete(l.Annotations, key)
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	metav1.SetMetaDataAnnotation(&l.ObjectMeta, key, string(b))
	return nil
}

// A Change edits a copy of the Lease; it returns an error to give up (ErrNotHolder
// when its precondition fails). It is applied again to a fresh copy after a conflict,
// so it must decide from the Lease it is given.
type Change func(l *coordinationv1.Lease, now time.Time) error

// OnlyRenewed reports whether now differs from before by a renewal alone: its renew
// time, with the resource version and managed fields any write changes. What watches
// the Lease for its holder, term or annotations can skip such an update: the holder
// renews every second.
func OnlyRenewed(before, now *coordinationv1.Lease) bool {
	// Field by field: the controller compares every cycle of every settled cluster, and
	// a reflective comparison of the whole object was a measurable share of its CPU.
	// What a write can change in the metadata but the resource version and managed
	// fields: a Lease deleted and made again has another UID.
	a, b := &before.ObjectMeta, &now.ObjectMeta
	if a.Name != b.Name || a.Namespace != b.Namespace || a.UID != b.UID || a.Generation != b.Generation ||
		!a.DeletionTimestamp.Equal(b.DeletionTimestamp) || !maps.Equal(a.Labels, b.Labels) ||
		!maps.Equal(a.Annotations, b.Annotations) || !slices.Equal(a.Finalizers, b.Finalizers) ||
		!equality.Semantic.DeepEqual(a.OwnerReferences, b.OwnerReferences) {
		return false
	}
	x, y := before.Spec, now.Spec
	x.RenewTime, y.RenewTime = nil, nil
	return equality.Semantic.DeepEqual(x, y)
}

// Renew is the holder's renewal in term: it fails with ErrNotHolder once the Lease
// names someone else or another term. sync, when not nil, replaces the synchronous set.
func Renew(holder string, term int32, sync *SyncSet) Change {
	return func(l *coordinationv1.Lease, now time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		t := metav1.NewMicroTime(now)
		l.Spec.RenewTime = &t
		if sync != nil {
			return setJSON(l, AnnotationSynchronous, sync)
		}
		return nil
	}
}

// Release is the holder's agent giving the Lease up after it stopped: the holder
// becomes "" in a new term, with h (From, Term and At are filled in).
func Release(holder string, term int32, h Handover) Change {
	return func(l *coordinationv1.Lease, now time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		h.From, h.Term, h.Released, h.At = holder, term, true, metav1.NewTime(now)
		return vacate(l, h)
	}
}

// Revoke is the operator taking the Lease from holder in term, for a failover.
func Revoke(holder string, term int32, reason string) Change {
	return func(l *coordinationv1.Lease, now time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		return vacate(l, Handover{From: holder, Term: term, Reason: reason, At: metav1.NewTime(now)})
	}
}

func vacate(l *coordinationv1.Lease, h Handover) error {
	empty := ""
	l.Spec.HolderIdentity = &empty
	next := Parse(l).Term + 1
	l.Spec.LeaseTransitions = &next
	return setJSON(l, AnnotationHandover, h)
}

// Move makes to the holder in a new term, from a Lease in term (whatever its holder),
// with sync as the synchronous set it starts with (nil in asynchronous mode). It reserves the timeline of to's promotion: one
// above both the last reservation and inUse, the highest timeline the caller saw any
// instance on.
func Move(term int32, to string, sync *SyncSet, inUse int64) Change {
	return func(l *coordinationv1.Lease, now time.Time) error {
		r := Parse(l)
		if r.Term != term {
			return ErrNotHolder
		}
		t := metav1.NewMicroTime(now)
		l.Spec.HolderIdentity = &to
		next := term + 1
		l.Spec.LeaseTransitions = &next
		l.Spec.AcquireTime, l.Spec.RenewTime = &t, &t
		seconds := int32(Duration / time.Second)
		l.Spec.LeaseDurationSeconds = &seconds
		delete(l.Annotations, AnnotationHandover)
		setTimeline(l, max(r.Timeline, inUse)+1)
		return setJSON(l, AnnotationSynchronous, sync)
	}
}

// ReserveTimeline is the holder in term reserving a timeline for its promotion above
// inUse, the highest it knows of, when the Lease's reservation is not (the agent's
// own history files name a higher one: a promotion of its own cut short, or a Lease
// written before reservations existed).
func ReserveTimeline(holder string, term int32, inUse int64) Change {
	return func(l *coordinationv1.Lease, _ time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		if r.Timeline <= inUse {
			setTimeline(l, inUse+1)
		}
		return nil
	}
}

func setTimeline(l *coordinationv1.Lease, id int64) {
	metav1.SetMetaDataAnnotation(&l.ObjectMeta, AnnotationTimeline, strconv.FormatInt(id, 10))
}

// SetHibernation records h (nil removes the record) when the Lease still names the
// holder and term h was decided for.
func SetHibernation(holder string, term int32, h *Hibernation) Change {
	return func(l *coordinationv1.Lease, _ time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		if h == nil {
			delete(l.Annotations, dbv1.AnnotationHibernation)
			return nil
		}
		return setJSON(l, dbv1.AnnotationHibernation, h)
	}
}

// SetFenced records the instances whose postgres must stay stopped (none removes the
// record), when the Lease still names holder in term: fencing a holder depends on
// who else could serve, decided for that holder.
func SetFenced(holder string, term int32, fenced []string) Change {
	return func(l *coordinationv1.Lease, _ time.Time) error {
		r := Parse(l)
		if r.Holder != holder || r.Term != term {
			return ErrNotHolder
		}
		if len(fenced) == 0 {
			delete(l.Annotations, dbv1.AnnotationFenced)
			return nil
		}
		return setJSON(l, dbv1.AnnotationFenced, fenced)
	}
}

// MarkBootstrapped records that the cluster's first primary came up: from then on an
// agent whose volume is empty must not initialise a new database. It needs no holder:
// once true it stays true, whoever holds the Lease.
func MarkBootstrapped() Change {
	return func(l *coordinationv1.Lease, _ time.Time) error {
		metav1.SetMetaDataAnnotation(&l.ObjectMeta, dbv1.AnnotationBootstrapped, "true")
		return nil
	}
}

// The annotations an operator before the cluster's report (internal/protocol/report)
// kept on the Lease. They are read once, to move them into the report, then removed.
const (
	LegacyLastFailover    = "db.example.com/last-failover"
	LegacyFailoverBlocked = "db.example.com/failover-blocked"
	LegacyArchiving       = "db.example.com/archiving"
	LegacyDataGuard       = "db.example.com/data-guard"
	LegacyStreaming       = "db.example.com/streaming"
	LegacyDataVersion     = "db.example.com/data-version"
	LegacyPendingRestart  = "db.example.com/pending-restart"
)

var legacyReports = []string{LegacyLastFailover, LegacyFailoverBlocked, LegacyArchiving, LegacyDataGuard,
	LegacyStreaming, LegacyDataVersion, LegacyPendingRestart}

// LegacyReports are the report annotations l still carries, by key; none once moved.
func LegacyReports(l *coordinationv1.Lease) map[string]string {
	var out map[string]string
	for _, k := range legacyReports {
		if v, ok := l.Annotations[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// DropLegacyReports removes the report annotations from the Lease, and nothing else.
func DropLegacyReports() Change {
	return func(l *coordinationv1.Lease, _ time.Time) error {
		for _, k := range legacyReports {
			delete(l.Annotations, k)
		}
		return nil
	}
}

// New is the Lease of a new cluster, naming its first primary.
func New(namespace, name, cluster, holder string, now time.Time) *coordinationv1.Lease {
	t := metav1.NewMicroTime(now)
	seconds := int32(Duration / time.Second)
	var term int32
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{dbv1.LabelCluster: cluster}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &t, RenewTime: &t,
			LeaseTransitions: &term, LeaseDurationSeconds: &seconds},
	}
}

// Rebuild is a Lease recreated from r after it was deleted (docs/failover.md, "The
// cluster's record"): its holder, term, bootstrapped mark, handover, synchronous set and
// timeline reservation; renewed now.
func Rebuild(namespace, name, cluster string, r Record, now time.Time) (*coordinationv1.Lease, error) {
	l := New(namespace, name, cluster, r.Holder, now)
	l.Spec.LeaseTransitions = &r.Term
	if r.Bootstrapped {
		metav1.SetMetaDataAnnotation(&l.ObjectMeta, dbv1.AnnotationBootstrapped, "true")
	}
	if r.Timeline > 0 {
		setTimeline(l, r.Timeline)
	}
	if r.Handover != nil {
		if err := setJSON(l, AnnotationHandover, r.Handover); err != nil {
			return nil, err
		}
	}
	if r.Sync != nil {
		if err := setJSON(l, AnnotationSynchronous, r.Sync); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Store reads and writes one Lease. Both the agent (client-go) and the operator
// (controller-runtime) implement it.
type Store interface {
	Get(ctx context.Context) (*coordinationv1.Lease, error)
	Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
}

// Apply applies change to a copy of current (read from s when nil) and writes it with
// current's resourceVersion; after a conflict it reads the Lease again and retries, a
// few times. It returns the Lease written, or the change's own error.
func Apply(ctx context.Context, s Store, current *coordinationv1.Lease, now func() time.Time, change Change) (*coordinationv1.Lease, error) {
	var conflict error
	for range 5 {
		if current == nil {
			var err error
			if current, err = s.Get(ctx); err != nil {
				return nil, err
			}
		}
		next := current.DeepCopy()
		if err := change(next, now()); err != nil {
			return nil, err
		}
		written, err := s.Update(ctx, next)
		if err == nil {
			return written, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, err
		}
		conflict, current = err, nil
	}
	return nil, fmt.Errorf("updating the primary Lease: conflicts after 5 attempts: %w", conflict)
}
