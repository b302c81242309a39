package v1

import (
	"slices"
	"strings"
)

// RoleSpec is a PostgreSQL role pgpilot keeps as written, without a restart: created
// when missing, its attributes, password and memberships set when they differ, dropped
// only when ensure is absent (docs/operations.md, "Roles and databases").
// +kubebuilder:validation:XValidation:rule="!(self.name in ['postgres', 'public', 'none', 'current_role', 'current_user', 'session_user']) && !self.name.startsWith('pg_') && !self.name.startsWith('pgpilot_')",message="role name is reserved: postgres is the superuser, names starting with pgpilot_ (pgpilot_replication, pgpilot_gate, pgpilot_monitor) are pgpilot's own, public, none, current_role, current_user and session_user are SQL keywords, and PostgreSQL reserves names starting with pg_"
// +kubebuilder:validation:XValidation:rule="!has(self.inRoles) || !(self.name in self.inRoles)",message="a role cannot be a member of itself"
// +kubebuilder:validation:XValidation:rule="!has(self.inRoles) || self.inRoles.all(r, !(r in ['postgres', 'pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files']) && !r.startsWith('pgpilot_'))",message="inRoles cannot name postgres (the superuser), pg_execute_server_program, pg_read_server_files, pg_write_server_files or pgpilot's own roles (pgpilot_*): each runs programs or reads files in the database container, where the pod's credentials are, or is pgpilot's; grant the role privileges on the objects it needs instead (GRANT ... ON TABLE/SCHEMA, or pg_read_all_data, pg_write_all_data, pg_monitor)"
type RoleSpec struct {
	// name of the role.
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// ensure is present (the default) or absent: an absent role is dropped when it owns
	// nothing and has no privileges left; otherwise it is kept and reported Failed with
	// PostgreSQL's reason. A role removed from the list is left as it is.
	// +kubebuilder:validation:Enum=present;absent
	// +kubebuilder:default=present
	// +optional
	Ensure Ensure `json:"ensure,omitempty"`

	// login lets the role log in (over TLS with its password).
	// +kubebuilder:default=true
	// +optional
	Login *bool `json:"login,omitempty"`

	// createdb lets the role create databases.
	// +optional
	CreateDB bool `json:"createdb,omitempty"`

	// createrole lets the role create, alter and drop other roles that are not
	// superusers. Such a role can grant itself the membership of any of them. Refused
	// for versions 14 and 15, where it can also grant itself
	// pg_execute_server_program and run programs in the database container.
	// +optional
	CreateRole bool `json:"createrole,omitempty"`

	// inherit makes the role use the privileges of the roles it is a member of.
	// +kubebuilder:default=true
	// +optional
	Inherit *bool `json:"inherit,omitempty"`

	// connectionLimit is how many connections the role may open at once; -1 (the
	// default) is no limit.
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:default=-1
	// +optional
	ConnectionLimit *int32 `json:"connectionLimit,omitempty"`

	// passwordSecret names a Secret of the cluster's namespace whose key holds the
	// role's password. A change of the Secret is applied to PostgreSQL without a
	// restart (within seconds when the Secret carries the label
	// db.example.com/cluster, else at the next periodic pass, every 5 minutes). Without
	// it the role has no password and cannot log in over the network.
	// +optional
	PasswordSecret *PasswordSecretRef `json:"passwordSecret,omitempty"`

	// inRoles are the roles this role is a member of, and the only ones: a membership
	// not listed here is revoked. Each must exist (in spec.roles or made by hand).
	// postgres, pg_execute_server_program, pg_read_server_files, pg_write_server_files
	// and pgpilot's roles (pgpilot_*) are refused, and the primary's agent refuses any
	// role that reaches one of them or a superuser (docs/operations.md).
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	InRoles []string `json:"inRoles,omitempty"`
}

// PasswordSecretRef is a key of a Secret in the cluster's namespace.
type PasswordSecretRef struct {
	// name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key of the password in the Secret.
	// +kubebuilder:default=password
	// +kubebuilder:validation:MinLength=1
	// +optional
	Key string `json:"key,omitempty"`
}

// DatabaseSpec is a database pgpilot keeps as written: created when missing, its owner
// set when it differs, its extensions created when missing (never dropped). A database
// is dropped only when ensure is absent.
// +kubebuilder:validation:XValidation:rule="!(self.name in ['postgres', 'template0', 'template1'])",message="database name is reserved: postgres, template0 and template1 are PostgreSQL's own"
// +kubebuilder:validation:XValidation:rule="(has(self.ensure) && self.ensure == 'absent') || (has(self.owner) && self.owner.size() > 0)",message="a database needs an owner unless ensure is absent"
type DatabaseSpec struct {
	// name of the database.
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// ensure is present (the default) or absent: an absent database is dropped (and
	// its data with it) unless sessions are connected to it, which are reported.
	// +kubebuilder:validation:Enum=present;absent
	// +kubebuilder:default=present
	// +optional
	Ensure Ensure `json:"ensure,omitempty"`

	// owner of the database: a role of spec.roles, the bootstrap owner, or one made by
	// hand. Required unless ensure is absent.
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,62}$`
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Owner string `json:"owner,omitempty"`

	// extensions are created in the database when missing (CREATE EXTENSION, by the
	// superuser). One removed from the list is left installed: dropping it could drop
	// the columns of its types.
	// +kubebuilder:validation:MaxItems=32
	// +listType=set
	// +optional
	Extensions []ExtensionName `json:"extensions,omitempty"`
}

// ExtensionName is the name of a PostgreSQL extension installed with the server
// (contrib: citext, pg_trgm, pgcrypto, uuid-ossp, ...).
// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_-]{0,62}$`
// +kubebuilder:validation:MaxLength=63
type ExtensionName string

// Ensure says whether an item must exist.
type Ensure string

// Values of Ensure.
const (
	EnsurePresent Ensure = "present"
	EnsureAbsent  Ensure = "absent"
)

// ManagedState is where one role or database of the spec stands.
type ManagedState string

// Values of ManagedState.
const (
	// ManagedReconciled: PostgreSQL matches the spec.
	ManagedReconciled ManagedState = "Reconciled"
	// ManagedFailed: a statement failed; the message holds PostgreSQL's error.
	ManagedFailed ManagedState = "Failed"
	// ManagedUnmanaged: the item was removed from the spec and is left as it is.
	ManagedUnmanaged ManagedState = "Unmanaged"
)

// ManagedStatus is one role or database of the spec as pgpilot last reconciled it.
type ManagedStatus struct {
	// name of the role or database.
	Name string `json:"name"`
	// state is Reconciled, Failed or Unmanaged.
	State ManagedState `json:"state"`
	// message says what was done or what failed (never a password).
	// +optional
	Message string `json:"message,omitempty"`
}

// IsLogin is the role's login attribute with its default.
func (r RoleSpec) IsLogin() bool { return r.Login == nil || *r.Login }

// IsInherit is the role's inherit attribute with its default.
func (r RoleSpec) IsInherit() bool { return r.Inherit == nil || *r.Inherit }

// Limit is the role's connection limit with its default.
func (r RoleSpec) Limit() int32 {
	if r.ConnectionLimit == nil {
		return -1
	}
	return *r.ConnectionLimit
}

// IsAbsent reports whether the item must not exist.
func (e Ensure) IsAbsent() bool { return e == EnsureAbsent }

// SecretKey is the key with its default.
func (p PasswordSecretRef) SecretKey() string {
	if p.Key == "" {
		return "password"
	}
	return p.Key
}

// UnsafeMemberships are the roles spec.roles[].inRoles never names, besides pgpilot's
// own (OwnRolePrefix): the superuser, and PostgreSQL's roles that run programs or read
// and write files as the database's OS user, in the container that holds the pod's
// credentials (the ServiceAccount token that may move the primary Lease, the
// replication certificate). The CRD's rule on RoleSpec lists the same; the agent
// refuses them too, and any role that is or reaches a superuser (IsUnsafeMembership).
var UnsafeMemberships = []string{"postgres", "pg_execute_server_program", "pg_read_server_files", "pg_write_server_files"}

// OwnRolePrefix starts the names of pgpilot's own roles (pgpilot_replication,
// pgpilot_monitor): none may be granted through spec.roles.
const OwnRolePrefix = "pgpilot_"

// IsUnsafeMembership reports whether role is one spec.roles[].inRoles may never name.
func IsUnsafeMembership(role string) bool {
	return slices.Contains(UnsafeMemberships, role) || strings.HasPrefix(role, OwnRolePrefix)
}
