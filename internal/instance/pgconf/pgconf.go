// Package pgconf renders what configures an instance's PostgreSQL and its connections:
// postgresql.conf, pg_hba.conf and pg_ident.conf, the password file, the TLS files and
// the upstream a standby streams from, SCRAM verifiers, and the agent API's tokens. It
// decides nothing and runs nothing: the agent does (internal/instance/agent).
package pgconf

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
	"github.com/pgpilot/pgpilot/internal/protocol/tuning"
)

// Role of the postgres the agent starts.
type Role int

const (
	// AsPrimary starts postgres accepting writes.
	AsPrimary Role = iota
	// AsStandby starts postgres streaming from its Upstream.
	AsStandby
)

// ConfInput is everything postgresql.conf is rendered from.
type ConfInput struct {
	Cluster clusterconfig.Config
	Pod     string
	Listen  string
	Port    int
	Socket  string
	Role    Role
	// Upstream is where a standby streams from; nil starts it frozen.
	Upstream *Upstream
	// ReplicationUser logs in with its client certificate (pg_hba.conf).
	ReplicationUser string
	// TLS are the certificates postgres serves and verifies clients with.
	TLS TLSFiles
	// Commands are the agent's archive and restore commands.
	Commands Commands
	// Recovery is set while a new cluster's first primary recovers from a backup.
	Recovery *Recovery
	// SyncRule is the standbys of the synchronous rule, after the gate: a primary's
	// own; on a standby, StandbyRule until the agent sets the recorded one right before
	// promoting it.
	SyncRule []string
	// VolumeBytes is the size of the data directory's volume; 0 when unknown.
	VolumeBytes uint64
	// LockedOut renders pg_hba.conf without clients (lockout.go).
	LockedOut bool
}

// HBA renders pg_hba.conf for in.
func (in ConfInput) HBA() string {
	if in.LockedOut {
		return LockedOutHBAConf(in.ReplicationUser)
	}
	return HBAConf(in.ReplicationUser, in.Cluster.SuperuserNetworkAccess)
}

// Commands run the agent binary as postgres's archive_command and restore_command.
type Commands struct {
	// Agent is the agent binary; ConfigPath its config.json; StatusFile where the
	// archive command records its last failure.
	Agent, ConfigPath, StatusFile string
}

// Archive is archive_command: the agent stores the segment when the cluster has a
// backup store and does nothing otherwise, so adding spec.backup needs no restart.
// archive_mode is always: standbys archive what they receive too, so WAL a failed
// primary had not archived yet is archived by the replicas, which keep it until then.
func (c Commands) Archive() string {
	return shellJoin(c.Agent, "archive-wal", "--config", c.ConfigPath, "--status-file", c.StatusFile) + " %p %f"
}

// Restore is restore_command, reading the restore source's archive.
func (c Commands) Restore() string {
	return shellJoin(c.Agent, "restore-wal", "--config", c.ConfigPath) + " %f %p"
}

// Recovery is an archive recovery to a target.
type Recovery struct {
	// TargetTime (RFC 3339) or TargetLSN; neither recovers to the end of the archive.
	TargetTime, TargetLSN string
}

// pgTimestamp turns an RFC 3339 time into PostgreSQL's timestamptz input in UTC, with
// at most microseconds (what PostgreSQL keeps); anything else is passed on as is.
func pgTimestamp(rfc3339 string) string {
	t, err := time.Parse(time.RFC3339Nano, rfc3339)
	if err != nil {
		return rfc3339
	}
	return t.UTC().Format("2006-01-02 15:04:05.999999") + "+00"
}

// shellJoin quotes each word for /bin/sh.
func shellJoin(words ...string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}

// SlotName is the physical replication slot the primary keeps for an instance: the pod
// name made a valid slot name.
func SlotName(pod string) string {
	return "pgpilot_" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '_'
	}, pod)
}

// maxSenders is max_wal_senders and max_replication_slots: room for the largest cluster
// (16 instances, the CRD's bound) whatever spec.replicas is now. Both take effect only
// at a restart, and a hot standby must run with at least its primary's
// max_wal_senders: sized from spec.replicas, a scale-down lowered it, and a standby
// restarted after that could not start while the primary still ran with the old value
// ("insufficient parameter settings"). A fixed value never changes with the cluster's
// size; each unused sender or slot costs a few hundred bytes of shared memory.
const maxSenders = 2*16 + 4

// managed returns the settings pgpilot owns. They come after the user's parameters in
// postgresql.conf, so they win even if a user parameter slipped past the CRD's rule.
func managed(in ConfInput) map[string]string {
	m := map[string]string{
		"listen_addresses":        in.Listen,
		"port":                    fmt.Sprint(in.Port),
		"unix_socket_directories": in.Socket,
		"cluster_name":            in.Pod,
		"wal_level":               "replica",
		"hot_standby":             "on",
		"wal_log_hints":           "on",
		"max_wal_senders":         fmt.Sprint(maxSenders),
		"max_replication_slots":   fmt.Sprint(maxSenders),
		"logging_collector":       "off",
		"archive_mode":            "always",
		"archive_command":         in.Commands.Archive(),
		// TLS is always on; pg_hba.conf accepts network connections over it only.
		"ssl":           "on",
		"ssl_cert_file": in.TLS.ServerCert(),
		"ssl_key_file":  in.TLS.ServerKey(),
		"ssl_ca_file":   in.TLS.ClientCA(),
	}
	if r := in.Recovery; r != nil {
		m["restore_command"] = in.Commands.Restore()
		m["recovery_target_action"] = "promote"
		m["recovery_target_timeline"] = "latest"
		if r.TargetTime != "" {
			m["recovery_target_time"] = pgTimestamp(r.TargetTime)
		}
		if r.TargetLSN != "" {
			m["recovery_target_lsn"] = r.TargetLSN
		}
	}
	// Every primary has its commit gate as first synchronous standby. A standby
	// carries a rule too (recovery ignores it), so that no commit of a promotion is ever
	// acknowledged without the gate; the agent sets the recorded rule before promoting.
	m["synchronous_standby_names"] = SynchronousStandbyNames(in.Cluster.SynchronousReplicas, in.SyncRule)
	// Needs a restart to change, so every role has it (a primary ignores it).
	m["recovery_target_timeline"] = "latest"
	if in.Role == AsStandby && in.Upstream == nil {
		// Frozen: no upstream, the WAL receiver stays stopped.
		m["primary_conninfo"] = ""
	}
	if in.Role == AsStandby && in.Upstream != nil {
		m["primary_conninfo"] = in.Upstream.Conninfo(map[string]string{
			"application_name": in.Pod,
			"keepalives_idle":  "5", "keepalives_interval": "2", "keepalives_count": "3",
			// The WAL receiver ignores connect_timeout (PostgreSQL 15): connecting to an
			// address that no longer answers (the primary's pod came back with a new
			// IP) waited for the kernel's SYN retries, 2 min 14 s. Linux ends a connect
			// whose SYNs go unanswered after TCP_USER_TIMEOUT (measured: 3.1 s with
			// 3000, over 25 s without), and an established stream whose data goes
			// unacknowledged as long. The agent's watch (receiver.go) ends a hang
			// sooner still, and one the kernel cannot see (an answered SYN, then
			// silence).
			"tcp_user_timeout": "5000",
		})
		if !in.Upstream.Source {
			// The source of a replica cluster keeps no slot for it: what it no longer
			// has is cloned again (docs/replica-cluster.md).
			m["primary_slot_name"] = SlotName(in.Pod)
		}
	}
	return m
}

// defaults are pgpilot's choices where PostgreSQL's own suit HA poorly; unlike the
// managed settings a user parameter overrides them.
var defaults = map[string]string{
	// A standby whose primary vanished retries every 5 s by default: after a failover
	// the other replicas would wait that long before following the new primary. The
	// wait also follows every change of primary_conninfo (the receiver is stopped and
	// counts as failed), so with 500 ms a standby re-pointed at a new primary streamed
	// from it 0.45 s later (make chaos dumps); in synchronous mode the new primary's
	// first commits wait for exactly that. A retry costs a process and a connection
	// attempt, ten a second at most while no primary answers.
	"wal_retrieve_retry_interval": "100ms",
	// Crash recovery first fsyncs every file of the data directory, one by one: 1 s of
	// a primary's restart after its container was killed on the loaded chaos node, on
	// a small database. syncfs asks the kernel to sync the volume in one call
	// (PostgreSQL 14 and later, Linux; errors are reported reliably since Linux 5.8).
	"recovery_init_sync_method": "syncfs",
	// A standby's WAL receiver asks its primary for a reply after half of this
	// without a message, and gives up after all of it: 5 s rather than 60 s, so that a
	// stream whose primary vanished ends within seconds and the receiver reconnects
	// (docs/failover.md, I6). The agent's watch ends one silent for half of it plus 3 s.
	"wal_receiver_timeout": "5s",
	// A primary's walsender whose standby went silent holds that standby's slot until
	// this passes: the standby's new connection is refused ("replication slot ... is
	// active for PID ...") meanwhile. With PostgreSQL's 60 s, a standby whose path to
	// the primary broke streamed again only a minute later (TestHungWALReceiver...,
	// test/pg). The walsender asks for a reply after half of it; standbys and the
	// commit gate (every 100 ms) answer at once.
	"wal_sender_timeout": "10s",
	// TLS 1.0 and 1.1 have known weaknesses; a parameter may raise this to TLSv1.3.
	"ssl_min_protocol_version": "TLSv1.2",
}

// SynchronousStandbyNames is "FIRST k+1 (gate, standbys...)": the commit gate, always
// connected, is always one of the synchronous standbys, and the k highest-priority
// streaming standbys of the rule are the others. k is never capped at the rule's
// length: with fewer standbys than k in the rule, commits wait.
func SynchronousStandbyNames(k int, standbys []string) string {
	names := []string{`"` + gate.GateName + `"`}
	for _, s := range standbys {
		names = append(names, `"`+s+`"`)
	}
	return fmt.Sprintf("FIRST %d (%s)", k+1, strings.Join(names, ", "))
}

// StandbyRule is the synchronous rule a standby of primary carries (it has no effect
// before a promotion): in synchronous mode every other configured instance but
// primary. That is the rule it starts with when the Lease moves to it while those
// instances stream (the operator records them as the synchronous set of the new term),
// so a promotion usually finds it in force and need not wait for a reload.
func StandbyRule(c clusterconfig.Config, pod, primary string) []string {
	if c.SynchronousReplicas == 0 {
		return nil
	}
	return slices.DeleteFunc(OtherInstances(c, pod), func(p string) bool { return p == primary })
}

// OtherInstances are the configured instances but pod, in ordinal order: the agent's
// peers.
func OtherInstances(c clusterconfig.Config, pod string) []string {
	names := dbv1.NamesOf(c.ClusterName)
	var out []string
	for i := range c.Replicas {
		if other := names.Instance(i); other != pod {
			out = append(out, other)
		}
	}
	return out
}

// slotKeepShare: replication slots may keep at most 1/slotKeepShare of the volume.
const slotKeepShare = 4

// PostgresqlConf renders postgresql.conf: pgpilot's defaults, the user's parameters,
// then pgpilot's managed settings (later lines win).
func PostgresqlConf(in ConfInput) string {
	var b strings.Builder
	b.WriteString("# Written by the pgpilot agent at every start; edits are lost.\n\n# Defaults\n")
	writeSettings(&b, defaults)
	b.WriteString("\n# Tuned from the container's resources (docs/tuning.md)\n")
	writeSettings(&b, tuning.Settings(in.Cluster.Resources, tuning.MaxConnections(in.Cluster.Parameters)))
	if in.VolumeBytes > 0 {
		// A replication slot of an instance that is away keeps WAL on the primary until
		// it returns: without a bound, a replica down for a day fills the primary's
		// volume, the most reported outage of PostgreSQL operators. Past a quarter of the
		// volume, PostgreSQL invalidates the slot and removes the WAL; the instance is
		// cloned again when it returns (the agent recreates the slot, and a standby whose
		// WAL is gone is cloned).
		//
		// WAL between checkpoints is bounded by max_wal_size, 1 GB by default: the whole
		// of the chart's default 1Gi volume. It is a quarter of the volume at most too, so
		// slots and checkpoints together keep at most half of it.
		quarter := max(in.VolumeBytes/slotKeepShare>>20, 64)
		maxWAL := min(quarter, 1024)
		writeSettings(&b, map[string]string{
			"max_slot_wal_keep_size": fmt.Sprintf("%dMB", quarter),
			"max_wal_size":           fmt.Sprintf("%dMB", maxWAL),
			"min_wal_size":           fmt.Sprintf("%dMB", min(maxWAL/2, 80)),
		})
	}
	if in.Cluster.Backup != nil {
		// A quiet primary still closes a segment every 5 minutes, bounding how much
		// a lost volume can take with it.
		writeSettings(&b, map[string]string{"archive_timeout": "5min"})
	}
	b.WriteString("\n# spec.postgresql.parameters\n")
	writeSettings(&b, userSettings(in.Cluster.Parameters))
	b.WriteString("\n# Managed by pgpilot\n")
	writeSettings(&b, managed(in))
	return b.String()
}

// userSettings are the parameters that can be written as they are: the CRD refuses the
// others, but a config.json made by hand or under an older CRD is not checked by it. A
// name that is not a setting's could add a line of its own (a newline in it), and a
// managed setting in another case (ARCHIVE_COMMAND) would stay in force where pgpilot
// does not set its own: both are left out, and so is a library named by path (or a
// library directory other than $libdir: dbv1.UnsafeLibraryValue).
func userSettings(params map[string]string) map[string]string {
	out := make(map[string]string, len(params))
	for k, v := range params {
		if dbv1.ParameterName.MatchString(k) && !dbv1.IsManagedParameter(k) && dbv1.UnsafeLibraryValue(k, v) == "" {
			out[k] = v
		}
	}
	return out
}

func writeSettings(b *strings.Builder, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "%s = %s\n", k, QuoteConf(m[k]))
	}
}

// QuoteConf quotes a value for postgresql.conf: single quotes, with ' and \ escaped and
// line breaks refused by replacing them with spaces (a setting is one line).
func QuoteConf(v string) string {
	v = strings.NewReplacer("\\", "\\\\", "'", "''", "\n", " ", "\r", " ").Replace(v)
	return "'" + v + "'"
}

// Conninfo renders a libpq key=value connection string with values quoted.
func Conninfo(kv map[string]string) string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := strings.NewReplacer("\\", "\\\\", "'", "\\'").Replace(kv[k])
		parts = append(parts, k+"='"+v+"'")
	}
	return strings.Join(parts, " ")
}

// HBAConf renders pg_hba.conf. Over the local socket: the superuser by peer (the agent
// runs as the postgres OS user), the custom queries' role by peer through
// pg_ident.conf's map, the pooler's lookup role not at all, everyone else by password.
// Over the network, TLS only: the replication role by its client certificate alone
// (streaming, pg_basebackup, and pg_rewind's connection to the postgres database), the
// pooler's lookup role (poolerauth.Role) by its client certificate alone, to any
// database but for replication, the superuser not at all unless superuserNetwork,
// everyone else by password (SCRAM). The lookup role never gets into the template
// databases: a session of it idle in template1 (PgBouncer keeps its lookup sessions)
// would make CREATE DATABASE fail. The two certificate roles' reject lines keep them
// from the password lines below, whatever password someone gives them. The pooler's
// line is there whether or not a pooler is configured: only the cluster's CA issues
// its certificate. A connection without TLS matches the last line and is refused with
// its reason.
func HBAConf(replicationUser string, superuserNetwork bool) string {
	superuser := "reject"
	if superuserNetwork {
		superuser = "scram-sha-256"
	}
	return fmt.Sprintf(`# Written by the pgpilot agent at every start; edits are lost.
# TYPE     DATABASE     USER      ADDRESS  METHOD
local      all          postgres           peer
local      all          %[3]s    peer map=pgpilot
local      all          %[4]s     reject
local      all          all                scram-sha-256
local      replication  postgres           peer
hostssl    replication  %[1]s  all      cert
hostssl    postgres     %[1]s  all      cert
host       all          %[1]s  all      reject
host       template0,template1  %[4]s  all  reject
hostssl    all          %[4]s  all      cert
host       all          %[4]s  all      reject
host       replication  all       all      reject
hostssl    all          postgres  all      %[2]s
hostssl    all          all       all      scram-sha-256
hostnossl  all          all       all      reject
`, replicationUser, superuser, MonitorUser, poolerauth.Role)
}

// IdentConf renders pg_ident.conf: the agent (the postgres OS user) may log in as
// MonitorUser too, for the custom queries (docs/monitoring.md).
func IdentConf() string {
	return `# Written by the pgpilot agent at every start; edits are lost.
# MAPNAME  SYSTEM-USERNAME  PG-USERNAME
pgpilot    postgres         ` + MonitorUser + "\n"
}

// PassFile renders a pgpass file for the replication role and the superuser.
func PassFile(cs Credentials) string {
	esc := strings.NewReplacer("\\", "\\\\", ":", "\\:")
	var b strings.Builder
	for _, c := range []Credential{cs.Replication, cs.Superuser} {
		fmt.Fprintf(&b, "*:*:*:%s:%s\n", esc.Replace(c.Username), esc.Replace(c.Password))
	}
	return b.String()
}

// MonitorUser is the role the user's custom queries run as: a member of pg_monitor and
// nothing more, never the superuser. Whoever may name a ConfigMap in a PostgresCluster
// must not get to run programs in the pods (docs/security.md), which a superuser's
// session can. The agent logs in as it over the local socket by peer authentication
// with a map (pg_hba.conf, pg_ident.conf), so it has no password.
const MonitorUser = "pgpilot_monitor"

// LockedOutHBAConf renders pg_hba.conf for a primary that locked its clients out: the
// agent's own local sessions (the superuser and the custom queries' role by peer, the
// commit gate) and the standbys' replication connections stay; every other connection is
// refused, with that reason in the client's error. The pooler's lookup role is refused
// like any client: a pooler takes a session of it that finds postgres out of recovery
// as the sign that the primary accepts writes (docs/pooler.md).
func LockedOutHBAConf(replicationUser string) string {
	return fmt.Sprintf(`# Written by the pgpilot agent: this primary may not acknowledge commits now (its
# Lease is not confirmed), so clients are locked out; edits are lost.
# TYPE     DATABASE     USER      ADDRESS  METHOD
local      all          postgres           peer
local      all          %[2]s    peer map=pgpilot
local      replication  postgres           peer
hostssl    replication  %[1]s  all      cert
hostssl    postgres     %[1]s  all      cert
local      all          all                reject
host       all          all       all      reject
`, replicationUser, MonitorUser)
}
