package agentapi

import (
	"context"
	"net/http"
)

// PathRoles is PUT: it makes the primary's roles and databases what the body says
// (RolesRequest, RolesResult). It needs the Control token: the body carries passwords,
// and only over the API's TLS.
const PathRoles = "/roles"

// RolesRequest is the state the primary must hold: spec.roles and spec.databases, with
// the passwords the controller read from their Secrets, and the passwords of pgpilot's
// own roles. Sending it again changes nothing that already matches.
type RolesRequest struct {
	Roles     []Role     `json:"roles,omitempty"`
	Databases []Database `json:"databases,omitempty"`
	// Passwords are those of the roles pgpilot made itself (the superuser, the
	// replication role, the bootstrap owner), set where the role exists.
	Passwords []Password `json:"passwords,omitempty"`
}

// Role is one role of spec.roles.
type Role struct {
	Name   string `json:"name"`
	Absent bool   `json:"absent,omitempty"`

	Login           bool     `json:"login"`
	CreateDB        bool     `json:"createdb"`
	CreateRole      bool     `json:"createrole"`
	Inherit         bool     `json:"inherit"`
	ConnectionLimit int32    `json:"connectionLimit"`
	InRoles         []string `json:"inRoles,omitempty"`

	// Password is the role's password; nil is none (the role cannot log in with one).
	Password *string `json:"password,omitempty"`
	// KeepPassword leaves the password as it is: its Secret could not be read.
	KeepPassword bool `json:"keepPassword,omitempty"`
}

// Database is one database of spec.databases.
type Database struct {
	Name       string   `json:"name"`
	Absent     bool     `json:"absent,omitempty"`
	Owner      string   `json:"owner,omitempty"`
	Extensions []string `json:"extensions,omitempty"`
}

// Password is the password of one of pgpilot's own roles.
type Password struct {
	Role     string `json:"role"`
	Password string `json:"password"`
}

// RolesResult is what the primary did of a RolesRequest, item by item, in the order
// of the request. An item that failed does not stop the others.
type RolesResult struct {
	Roles     []ItemResult `json:"roles,omitempty"`
	Databases []ItemResult `json:"databases,omitempty"`
	Passwords []ItemResult `json:"passwords,omitempty"`
}

// ItemResult is one role, database or password.
type ItemResult struct {
	Name string `json:"name"`
	// Error is PostgreSQL's error (or the agent's reason) when the item does not match
	// the request; empty when it does.
	Error string `json:"error,omitempty"`
	// Done says what was changed ("created", "password set", ...); empty when nothing
	// needed to be.
	Done string `json:"done,omitempty"`
}

// RolesInstance is what the server needs from an agent that manages roles.
type RolesInstance interface {
	// ApplyRoles makes the roles and databases what req says, on a primary; on any
	// other instance it wraps ErrConflict.
	ApplyRoles(ctx context.Context, req RolesRequest) (RolesResult, error)
}

func (s *Server) registerRoles(mux *http.ServeMux, ri RolesInstance) {
	// Logged without its body: it carries passwords.
	mux.Handle("PUT "+PathRoles, s.bounded(s.actionTimeout, s.authorized("roles", func(w http.ResponseWriter, r *http.Request) error {
		var req RolesRequest
		if err := decodeBody(r, &req); err != nil {
			writeJSONError(w, http.StatusBadRequest, "the body must be a roles request: "+err.Error())
			return nil
		}
		res, err := ri.ApplyRoles(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})))
}

// ApplyRoles sends the roles and databases the primary must hold.
func (c *Client) ApplyRoles(ctx context.Context, req RolesRequest) (RolesResult, error) {
	var res RolesResult
	err := c.do(ctx, http.MethodPut, c.base+PathRoles, req, &res, c.actionTimeout)
	return res, err
}
