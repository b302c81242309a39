// Package report is a cluster's report: what the operator's controllers observe and
// tell each other and the status controller, kept in one ConfigMap per cluster
// (<cluster>-report) and not on the primary Lease, which holds leadership only.
//
// Each kind of report is one key of the ConfigMap, written with server-side apply by a
// field manager of its own ("pgpilot-report-<key>"): a writer owns its key and nothing
// else, so writers never undo each other and need no read before a write. No agent
// watches the ConfigMap, so a report wakes no instance (docs/architecture.md,
// "Reports").
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// Key is one kind of report: a key of the ConfigMap's data.
type Key string

// The reports, with the controller that writes each.
const (
	// KeyFailoverBlocked (failover controller) says why no failover can happen now.
	KeyFailoverBlocked Key = "failoverBlocked"
	// KeyLastFailover (failover controller) is the last automatic failover, JSON of a
	// dbv1.FailoverRecord.
	KeyLastFailover Key = "lastFailover"
	// KeyDataVersion (failover controller) is the PostgreSQL major version of the
	// cluster's data, as its primary runs it: the only version a plan deploys once
	// recorded.
	KeyDataVersion Key = "dataVersion"
	// KeyDataGuard (failover controller) is what the agents refuse to do to their data
	// and what they set aside, JSON of a DataGuard.
	KeyDataGuard Key = "dataGuard"
	// KeyStreaming (failover controller) is, by replica, why it does not serve reads,
	// JSON of a Streaming.
	KeyStreaming Key = "streaming"
	// KeyArchiving (backup controller) is the primary's WAL archiving health, JSON of an
	// Archiving.
	KeyArchiving Key = "archiving"
	// KeyPendingRestart (restart controller) is what waits for a restart of postgres,
	// JSON of a PendingRestart.
	KeyPendingRestart Key = "pendingRestart"
	// KeyUpgrade (failover controller) is where a major version upgrade stands, JSON
	// of an Upgrade.
	KeyUpgrade Key = "upgrade"
	// KeyAgentErrors (failover controller) is, by instance, the error its agent
	// reports while it is not ready, JSON of an AgentErrors.
	KeyAgentErrors Key = "agentErrors"
	// KeyHealth (failover controller) is what threatens the cluster before anything
	// fails (connections nearly all taken, transaction ID wraparound, a volume filling
	// up), JSON of a Health.
	KeyHealth Key = "health"
	// KeyBackupVerification (backup verification controller) is the last restore
	// verification, JSON of a dbv1.BackupVerification.
	KeyBackupVerification Key = "backupVerification"
	// KeyReplica (failover controller) is where a replica cluster stands, JSON of a
	// dbv1.ReplicaStatus.
	KeyReplica Key = "replica"
)

// Keys are every report, in the order the ConfigMap lists them.
var Keys = []Key{KeyFailoverBlocked, KeyLastFailover, KeyDataVersion, KeyDataGuard, KeyStreaming, KeyArchiving, KeyPendingRestart, KeyUpgrade, KeyAgentErrors, KeyHealth, KeyBackupVerification, KeyReplica}

// Report is the ConfigMap, read. A missing or unreadable report is its zero value: a
// person may have edited it, and every reader treats "unknown" as "nothing recorded".
type Report struct {
	FailoverBlocked string
	LastFailover    *dbv1.FailoverRecord
	DataVersion     string
	DataGuard       *DataGuard
	Streaming       Streaming
	Archiving       *Archiving
	PendingRestart  *PendingRestart
	Upgrade         *Upgrade
	AgentErrors     AgentErrors
	Health          Health
	// BackupVerification is the last restore verification; nil before the first.
	BackupVerification *dbv1.BackupVerification
	// Replica is where a replica cluster stands; nil for a cluster of its own.
	Replica *dbv1.ReplicaStatus
}

// Health is what threatens the cluster before anything fails, by signal: HealthConnections,
// HealthWraparound, and HealthVolume followed by an instance's name.
type Health map[string]HealthProblem

// The signals of a Health.
const (
	HealthConnections = "connections"
	HealthWraparound  = "wraparound"
	HealthVolume      = "volume:"
)

// HealthProblem is one signal's problem, as first recorded while it lasts (its figures
// are of that moment: the report is written when a problem begins or ends, not at every
// change of a figure).
type HealthProblem struct {
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// Volumes are the volume problems, by instance.
func (h Health) Volumes() map[string]HealthProblem {
	out := map[string]HealthProblem{}
	for k, p := range h {
		if pod, ok := strings.CutPrefix(k, HealthVolume); ok {
			out[pod] = p
		}
	}
	return out
}

// AgentErrors are, by instance, the error its agent reports while it is not ready and
// since when (the first report of it), for the status controller to tell why the
// instance does not run.
type AgentErrors map[string]AgentError

// AgentError is one agent's error, as first reported while it lasts.
type AgentError struct {
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// Messages are the errors by instance.
func (e AgentErrors) Messages() map[string]string {
	out := make(map[string]string, len(e))
	for pod, ae := range e {
		out[pod] = ae.Message
	}
	return out
}

// Upgrade is a major version upgrade: its primary's agent's phase, or, once that
// completed, ReplicasCloning until every instance runs the new major.
type Upgrade struct {
	From    string    `json:"from"`
	To      string    `json:"to"`
	Reason  string    `json:"reason"` // a dbv1.ReasonUpgrade* reason
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
	// WritesStoppedMillis is how long the primary refused writes for it.
	WritesStoppedMillis int64 `json:"writesStoppedMillis,omitempty"`
}

// DataGuard is what the agents last reported of their data's protection, by pod:
// refusals to replace it with another database's, and data directories they set aside.
type DataGuard struct {
	Refusals map[string]string   `json:"refusals,omitempty"`
	SetAside map[string][]string `json:"setAside,omitempty"`
}

// Streaming is why each replica that does not serve reads does not, by pod.
type Streaming map[string]StreamingProblem

// StreamingProblem is why a replica does not serve reads, as its agent reported it
// when first recorded: kept as is while the problem lasts, so the report is written
// only when a problem starts or ends.
type StreamingProblem struct {
	// Upstream is the primary the replica should stream from.
	Upstream string `json:"upstream"`
	// State is the WAL receiver's (agentapi.Receiver*), or StreamingLagging.
	State string `json:"state"`
	// Since is when the replica stopped streaming, or was first seen lagging.
	Since time.Time `json:"since"`
	// Reason is the agent's, at that first report.
	Reason string `json:"reason"`
}

// StreamingLagging is StreamingProblem.State for a replica that streams but replays
// beyond maxReadLag.
const StreamingLagging = "lagging"

// SameAs reports whether p and o are the same problem: the same upstream, and both
// lagging or both not streaming. The WAL receiver's state while it does not stream
// (stopped, starting, waiting, connecting) changes from one look to the next; the
// problem does not, and is not recorded or told again for it.
func (p StreamingProblem) SameAs(o StreamingProblem) bool {
	return p.Upstream == o.Upstream && (p.State == StreamingLagging) == (o.State == StreamingLagging)
}

// Describe is one problem for a person: who, since when, why.
func (p StreamingProblem) Describe(pod string) string {
	if p.State == StreamingLagging {
		return fmt.Sprintf("%s lags behind %s beyond maxReadLag since %s (%s)", pod, p.Upstream, p.Since.UTC().Format(time.RFC3339), p.Reason)
	}
	return fmt.Sprintf("%s has not streamed from %s since %s (%s)", pod, p.Upstream, p.Since.UTC().Format(time.RFC3339), p.Reason)
}

// Archiving is the primary's WAL archiving health.
type Archiving struct {
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// PendingRestart is what waits for a restart of postgres.
type PendingRestart struct {
	Pending bool   `json:"pending"`
	Blocked bool   `json:"blocked,omitempty"`
	Message string `json:"message"`
	// Instances are the settings waiting on each instance ("name: running → new").
	Instances map[string][]string `json:"instances,omitempty"`
	// Rejected is, by instance, what is wrong with the settings it was given
	// (agentapi.Status.ConfigRejected); empty when nothing is.
	Rejected map[string]string `json:"rejected,omitempty"`
}

// RejectedMessage says what is wrong with the settings on which instances.
func (p PendingRestart) RejectedMessage() string {
	var msgs []string
	for _, pod := range slices.Sorted(maps.Keys(p.Rejected)) {
		msgs = append(msgs, pod+": "+p.Rejected[pod])
	}
	return "Settings of spec.postgresql.parameters cannot be used as they are: " + strings.Join(msgs, "; ")
}

// Parse reads the ConfigMap; nil is an empty report.
func Parse(cm *corev1.ConfigMap) Report {
	var r Report
	if cm == nil {
		return r
	}
	d := cm.Data
	r.FailoverBlocked = d[string(KeyFailoverBlocked)]
	r.DataVersion = d[string(KeyDataVersion)]
	r.LastFailover = decode[dbv1.FailoverRecord](d[string(KeyLastFailover)])
	r.DataGuard = decode[DataGuard](d[string(KeyDataGuard)])
	if s := decode[Streaming](d[string(KeyStreaming)]); s != nil {
		r.Streaming = *s
	}
	r.Archiving = decode[Archiving](d[string(KeyArchiving)])
	r.PendingRestart = decode[PendingRestart](d[string(KeyPendingRestart)])
	r.Upgrade = decode[Upgrade](d[string(KeyUpgrade)])
	if e := decode[AgentErrors](d[string(KeyAgentErrors)]); e != nil {
		r.AgentErrors = *e
	}
	if h := decode[Health](d[string(KeyHealth)]); h != nil {
		r.Health = *h
	}
	r.BackupVerification = decode[dbv1.BackupVerification](d[string(KeyBackupVerification)])
	r.Replica = decode[dbv1.ReplicaStatus](d[string(KeyReplica)])
	return r
}

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

// Read reads cluster's report; a report not written yet is empty.
func Read(ctx context.Context, r client.Reader, cluster *dbv1.PostgresCluster) (Report, error) {
	var cm corev1.ConfigMap
	err := r.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.ReportName()}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return Report{}, nil
	case err != nil:
		return Report{}, fmt.Errorf("reading the report %s: %w", cluster.ReportName(), err)
	}
	return Parse(&cm), nil
}

// FieldManager is the field manager that owns key.
func FieldManager(key Key) string { return "pgpilot-report-" + string(key) }

// Write records v as cluster's report key: a string as it is, anything else as JSON;
// nil, a nil pointer, "" or an empty map removes the key. It creates the ConfigMap
// (owned by the cluster, so it goes with it) when it does not exist.
func Write(ctx context.Context, w client.Writer, cluster *dbv1.PostgresCluster, key Key, v any) error {
	value, err := encode(v)
	if err != nil {
		return fmt.Errorf("encoding the report %s: %w", key, err)
	}
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: cluster.ReportName(), Namespace: cluster.Namespace,
			Labels: map[string]string{dbv1.LabelCluster: cluster.Name},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: dbv1.GroupVersion.String(), Kind: "PostgresCluster", Name: cluster.Name, UID: cluster.UID,
			}},
		},
	}
	if value != "" {
		cm.Data = map[string]string{string(key): value}
	}
	if err := w.Patch(ctx, cm, client.Apply, client.FieldOwner(FieldManager(key)), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing the report %s of %s: %w", key, cluster.ReportName(), err)
	}
	return nil
}

func encode(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case Streaming:
		if len(x) == 0 {
			return "", nil
		}
	case AgentErrors:
		if len(x) == 0 {
			return "", nil
		}
	case Health:
		if len(x) == 0 {
			return "", nil
		}
	case *dbv1.FailoverRecord:
		if x == nil {
			return "", nil
		}
	case *dbv1.BackupVerification:
		if x == nil {
			return "", nil
		}
	case *dbv1.ReplicaStatus:
		if x == nil {
			return "", nil
		}
	case *DataGuard:
		if x == nil || len(x.Refusals) == 0 && len(x.SetAside) == 0 {
			return "", nil
		}
	case *Archiving:
		if x == nil {
			return "", nil
		}
	case *PendingRestart:
		if x == nil {
			return "", nil
		}
	}
	b, err := json.Marshal(v)
	return string(b), err
}
