package rolestatus

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

func item(name string, state dbv1.ManagedState, msg string) dbv1.ManagedStatus {
	return dbv1.ManagedStatus{Name: name, State: state, Message: msg}
}

func TestItems(t *testing.T) {
	for _, tc := range []struct {
		name     string
		names    []string
		answer   []agentapi.ItemResult
		own      map[string]string
		previous []dbv1.ManagedStatus
		want     []dbv1.ManagedStatus
	}{
		{
			name:   "done, failed and in place",
			names:  []string{"a", "b", "c"},
			answer: []agentapi.ItemResult{{Name: "a", Done: "created"}, {Name: "b", Error: `ERROR: role "x" does not exist (SQLSTATE 42704)`}, {Name: "c"}},
			want: []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created"),
				item("b", dbv1.ManagedFailed, `ERROR: role "x" does not exist (SQLSTATE 42704)`), item("c", dbv1.ManagedReconciled, "in place")},
		},
		{
			name:     "a pass with nothing to do keeps what the last one did",
			names:    []string{"a"},
			answer:   []agentapi.ItemResult{{Name: "a"}},
			previous: []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created")},
			want:     []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created")},
		},
		{
			name:   "an unreadable Secret fails the role, with the agent's error too",
			names:  []string{"a", "b"},
			answer: []agentapi.ItemResult{{Name: "a", Done: "created"}, {Name: "b", Error: "boom"}},
			own:    map[string]string{"a": "Secret s does not exist", "b": "Secret t has no key \"pw\""},
			want: []dbv1.ManagedStatus{item("a", dbv1.ManagedFailed, "Secret s does not exist"),
				item("b", dbv1.ManagedFailed, "Secret t has no key \"pw\"; boom")},
		},
		{
			name:     "removed from the spec: unmanaged, never dropped",
			names:    []string{"a"},
			answer:   []agentapi.ItemResult{{Name: "a"}},
			previous: []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created"), item("gone", dbv1.ManagedReconciled, "created")},
			want: []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created"),
				item("gone", dbv1.ManagedUnmanaged, "removed from the spec: left as it is in PostgreSQL")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Items(tc.names, tc.answer, tc.own, tc.previous)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A failure is an event once, and again only when its message changes.
func TestNewly(t *testing.T) {
	failed := item("a", dbv1.ManagedFailed, "x")
	for _, tc := range []struct {
		name        string
		before, now []dbv1.ManagedStatus
		want        []dbv1.ManagedStatus
	}{
		{"new failure", []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "")}, []dbv1.ManagedStatus{failed}, []dbv1.ManagedStatus{failed}},
		{"same failure", []dbv1.ManagedStatus{failed}, []dbv1.ManagedStatus{failed}, nil},
		{"other message", []dbv1.ManagedStatus{failed}, []dbv1.ManagedStatus{item("a", dbv1.ManagedFailed, "y")}, []dbv1.ManagedStatus{item("a", dbv1.ManagedFailed, "y")}},
		{"first pass", nil, []dbv1.ManagedStatus{failed}, []dbv1.ManagedStatus{failed}},
		{"fixed", []dbv1.ManagedStatus{failed}, []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Newly(tc.before, tc.now)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCondition(t *testing.T) {
	ok := []dbv1.ManagedStatus{item("a", dbv1.ManagedReconciled, "created"), item("old", dbv1.ManagedUnmanaged, "")}
	for _, tc := range []struct {
		name    string
		o       Outcome
		status  metav1.ConditionStatus
		reason  string
		message string
	}{
		{"all reconciled", Outcome{Roles: ok, Databases: ok[:1]}, metav1.ConditionTrue, dbv1.ReasonRolesReconciled,
			"1 roles and 1 databases as in the spec, and pgpilot's passwords as in their Secrets"},
		{"one failed", Outcome{Roles: ok, Databases: []dbv1.ManagedStatus{item("d", dbv1.ManagedFailed, "no owner")}},
			metav1.ConditionFalse, dbv1.ReasonRoleFailed, "database d failed: see status.roles and status.databases"},
		{"a password of pgpilot's", Outcome{Passwords: "the password of app from its Secret could not be set: x"},
			metav1.ConditionFalse, dbv1.ReasonRoleFailed, "the password of app from its Secret could not be set: x"},
		{"no primary", Outcome{Roles: ok, Problem: "no primary: a failover or handover is under way"},
			metav1.ConditionUnknown, dbv1.ReasonRolesUnreachable, "no primary: a failover or handover is under way"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Condition(tc.o)
			if c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message {
				t.Errorf("got %s %s %q, want %s %s %q", c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.message)
			}
		})
	}
}
