package rolestatus

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Outcome is a cluster's roles and databases as last reconciled: what the status
// controller writes into status.roles, status.databases and RolesReconciled.
type Outcome struct {
	// Generation of the spec the outcome is for.
	Generation int64
	Roles      []dbv1.ManagedStatus
	Databases  []dbv1.ManagedStatus
	// Passwords says which of pgpilot's own passwords could not be set, "" when all were.
	Passwords string
	// Problem says why the primary could not be asked, "" when it answered; the items
	// are then those of the last answer.
	Problem string
}

// Failed are the names of the items that failed, "role x", "database y".
func (o Outcome) Failed() []string {
	var out []string
	for _, r := range o.Roles {
		if r.State == dbv1.ManagedFailed {
			out = append(out, "role "+r.Name)
		}
	}
	for _, d := range o.Databases {
		if d.State == dbv1.ManagedFailed {
			out = append(out, "database "+d.Name)
		}
	}
	return out
}

// Items are the status of each item of the spec from the agent's answer and the
// controller's own problems with it (a password Secret it could not read), by name;
// items of previous no longer in the spec are Unmanaged: pgpilot leaves them as they
// are.
func Items(names []string, answer []agentapi.ItemResult, own map[string]string, previous []dbv1.ManagedStatus) []dbv1.ManagedStatus {
	byName := map[string]agentapi.ItemResult{}
	for _, a := range answer {
		byName[a.Name] = a
	}
	var out []dbv1.ManagedStatus
	for _, n := range names {
		a := byName[n]
		var errs []string
		for _, e := range []string{own[n], a.Error} {
			if e != "" {
				errs = append(errs, e)
			}
		}
		switch {
		case len(errs) > 0:
			out = append(out, dbv1.ManagedStatus{Name: n, State: dbv1.ManagedFailed, Message: strings.Join(errs, "; ")})
		case a.Done != "":
			out = append(out, dbv1.ManagedStatus{Name: n, State: dbv1.ManagedReconciled, Message: a.Done})
		default:
			out = append(out, dbv1.ManagedStatus{Name: n, State: dbv1.ManagedReconciled, Message: lastDone(previous, n)})
		}
	}
	for _, p := range previous {
		if slices.Contains(names, p.Name) {
			continue
		}
		out = append(out, dbv1.ManagedStatus{Name: p.Name, State: dbv1.ManagedUnmanaged,
			Message: "removed from the spec: left as it is in PostgreSQL"})
	}
	return out
}

// lastDone keeps what the last pass that changed the item did ("created"), so that a
// pass with nothing to do does not erase it; "in place" when nothing was ever done.
func lastDone(previous []dbv1.ManagedStatus, name string) string {
	for _, p := range previous {
		if p.Name == name && p.State == dbv1.ManagedReconciled && p.Message != "" {
			return p.Message
		}
	}
	return "in place"
}

// Newly are the items of now whose failure is new since before: a failure appears or
// its message changed. Each becomes one Warning event.
func Newly(before, now []dbv1.ManagedStatus) []dbv1.ManagedStatus {
	var out []dbv1.ManagedStatus
	for _, n := range now {
		if n.State != dbv1.ManagedFailed {
			continue
		}
		i := slices.IndexFunc(before, func(b dbv1.ManagedStatus) bool { return b.Name == n.Name })
		if i < 0 || before[i] != n {
			out = append(out, n)
		}
	}
	return out
}

// Condition is RolesReconciled for o.
func Condition(o Outcome) dbv1.Condition {
	c := dbv1.Condition{Type: dbv1.ConditionRolesReconciled, ObservedGeneration: o.Generation}
	failed := o.Failed()
	switch {
	case o.Problem != "":
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, dbv1.ReasonRolesUnreachable, o.Problem
	case len(failed) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, dbv1.ReasonRoleFailed
		c.Message = fmt.Sprintf("%s failed: see status.roles and status.databases", strings.Join(failed, ", "))
	case o.Passwords != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, dbv1.ReasonRoleFailed, o.Passwords
	default:
		c.Status, c.Reason = metav1.ConditionTrue, dbv1.ReasonRolesReconciled
		c.Message = fmt.Sprintf("%d roles and %d databases as in the spec, and pgpilot's passwords as in their Secrets", count(o.Roles), count(o.Databases))
	}
	return c
}

func count(items []dbv1.ManagedStatus) int {
	n := 0
	for _, i := range items {
		if i.State != dbv1.ManagedUnmanaged {
			n++
		}
	}
	return n
}

// Store holds each cluster's last Outcome for the status controller, the only writer
// of the status (the Helm manager's status writes drop fields it does not know, and the
// status controller writes them back from here). A controller that restarts reconciles
// every cluster at once and fills it again; until then the status is kept as it is.
type Store struct {
	mu       sync.Mutex
	outcomes map[types.NamespacedName]Outcome
	changes  chan event.GenericEvent
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{outcomes: map[types.NamespacedName]Outcome{}, changes: make(chan event.GenericEvent, 1024)}
}

// Get returns the cluster's last outcome, if any.
func (s *Store) Get(key types.NamespacedName) (Outcome, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.outcomes[key]
	return o, ok
}

// Changes are the clusters whose outcome changed, for the status controller's watch.
func (s *Store) Changes() <-chan event.GenericEvent { return s.changes }

// Set records the cluster's outcome o, and tells the status controller when it changed.
func (s *Store) Set(c *dbv1.PostgresCluster, o Outcome) {
	key := client.ObjectKeyFromObject(c)
	s.mu.Lock()
	old, ok := s.outcomes[key]
	s.outcomes[key] = o
	s.mu.Unlock()
	if ok && equal(old, o) {
		return
	}
	select {
	case s.changes <- event.GenericEvent{Object: c.DeepCopy()}:
	default: // full: the status controller's periodic and cluster events catch up
	}
}

func equal(a, b Outcome) bool {
	return a.Generation == b.Generation && a.Passwords == b.Passwords && a.Problem == b.Problem &&
		slices.Equal(a.Roles, b.Roles) && slices.Equal(a.Databases, b.Databases)
}
