package v1

import "strconv"

// Labels and annotations pgpilot puts on objects.
const (
	// LabelCluster names the PostgresCluster an object belongs to.
	LabelCluster = "db.example.com/cluster"
	// LabelRole is primary, replica or fenced on instance pods; the Services select on it.
	LabelRole = "db.example.com/role"

	RolePrimary = "primary"
	RoleReplica = "replica"
	RoleFenced  = "fenced"
)

// Names of the credentials Secrets' roles.
const (
	SuperuserName   = "postgres"
	ReplicationUser = "pgpilot_replication"
)

// PrimaryLeaseName is the Lease whose holder is the primary pod: the single source of
// truth for who is primary.
func (c *PostgresCluster) PrimaryLeaseName() string { return c.Name + "-primary" }

// SuperuserSecretName is the Secret with the postgres superuser's credentials.
func (c *PostgresCluster) SuperuserSecretName() string { return c.Name + "-superuser" }

// ReplicationSecretName is the Secret with the replication role's credentials.
func (c *PostgresCluster) ReplicationSecretName() string { return c.Name + "-replication" }

// AppSecretName is the Secret with the application owner's credentials.
func (c *PostgresCluster) AppSecretName() string { return c.Name + "-app" }

// ReadWriteServiceName is the Service that selects the primary.
func (c *PostgresCluster) ReadWriteServiceName() string { return c.Name + "-rw" }

// InstanceName is the pod name of instance ordinal i (StatefulSet naming).
func (c *PostgresCluster) InstanceName(i int) string {
	return c.Name + "-" + strconv.Itoa(i)
}
