package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
)

// Status is what kubectl pgpilot status shows (and prints with -o json).
type Status struct {
	Name      string     `json:"name"`
	Namespace string     `json:"namespace"`
	Phase     dbv1.Phase `json:"phase"`
	Version   string     `json:"version"`
	Wanted    int32      `json:"instances"`
	Ready     int32      `json:"readyInstances"`
	Primary   string     `json:"primary"`
	// Timeline is the primary's, from PostgreSQL; 0 when it could not be asked.
	Timeline     int64                `json:"timeline,omitempty"`
	Instances    []Instance           `json:"instancesStatus"`
	LastFailover *dbv1.FailoverRecord `json:"lastFailover,omitempty"`
	LastBackup   *Backup              `json:"lastBackup,omitempty"`
	// Backups counts the cluster's PostgresBackups by phase.
	Backups    map[dbv1.BackupPhase]int `json:"backups,omitempty"`
	Conditions []dbv1.Condition         `json:"conditions,omitempty"`
	// ReplicationError says why the primary could not be asked about its standbys.
	ReplicationError string `json:"replicationError,omitempty"`
	// Pooler is status.pooler (spec.pooler), with its Service; nil without one.
	Pooler *Pooler `json:"pooler,omitempty"`
	// LastVerification is status.lastBackupVerification (spec.backup.verify).
	LastVerification *dbv1.BackupVerification `json:"lastBackupVerification,omitempty"`
	// Replica is status.replica (spec.replica).
	Replica *dbv1.ReplicaStatus `json:"replica,omitempty"`
}

// Pooler is the cluster's pooler as its status reports it.
type Pooler struct {
	dbv1.PoolerStatus
	// Service is where clients connect: <name>-pooler-rw.
	Service string `json:"service"`
}

// Instance is one instance pod.
type Instance struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	Node  string `json:"node,omitempty"`
	// Restarts of its postgres container.
	Restarts int32 `json:"restarts"`
	// Message says why it does not run, as the cluster's status says.
	Message string `json:"message,omitempty"`
	// Replication is how the primary sees this standby (nil for the primary, or a
	// standby that does not stream).
	Replication *Replication `json:"replication,omitempty"`
}

// Replication is a standby as its primary sees it (pg_stat_replication).
type Replication struct {
	State     string `json:"state"`
	SyncState string `json:"syncState"`
	// LagBytes is how far its flush position is behind the primary's write position;
	// ReplayLagSeconds how long its replay took of recent WAL.
	LagBytes         int64   `json:"lagBytes"`
	ReplayLagSeconds float64 `json:"replayLagSeconds"`
}

// Backup is the newest completed PostgresBackup.
type Backup struct {
	Name      string        `json:"name"`
	Finished  time.Time     `json:"finished"`
	SizeBytes int64         `json:"sizeBytes"`
	Duration  time.Duration `json:"duration"`
}

// replicationQuery asks the primary, over its local socket as the superuser (the
// container's user, by peer authentication), for its timeline and its standbys, one
// line each: "timeline|<id>" then "replica|<name>|<state>|<sync state>|<lag bytes>|<replay lag s>".
const replicationQuery = `SELECT 'timeline|' || ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
UNION ALL
SELECT 'replica|' || application_name || '|' || state || '|' || sync_state || '|' ||
  coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn), 0)::bigint || '|' || coalesce(extract(epoch FROM replay_lag), 0)
  FROM pg_stat_replication WHERE application_name <> 'pgpilot_gate'`

// psqlCommand runs a query on the instance's postgres over its local socket.
func psqlCommand(query string) []string {
	return []string{"psql", "-X", "-q", "-A", "-t", "-h", "/run/postgresql", "-U", "postgres", "-d", "postgres", "-c", query}
}

// parseReplication reads replicationQuery's answer.
func parseReplication(out string) (int64, map[string]Replication, error) {
	var timeline int64
	standbys := map[string]Replication{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(strings.TrimSpace(line), "|")
		switch {
		case len(f) == 2 && f[0] == "timeline":
			tl, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, nil, fmt.Errorf("timeline %q: %w", f[1], err)
			}
			timeline = tl
		case len(f) == 6 && f[0] == "replica":
			lag, err := strconv.ParseInt(f[4], 10, 64)
			if err != nil {
				return 0, nil, fmt.Errorf("lag %q: %w", f[4], err)
			}
			replay, err := strconv.ParseFloat(f[5], 64)
			if err != nil {
				return 0, nil, fmt.Errorf("replay lag %q: %w", f[5], err)
			}
			r := Replication{State: f[2], SyncState: f[3], LagBytes: lag, ReplayLagSeconds: replay}
			if old, seen := standbys[f[1]]; !seen || old.LagBytes < lag {
				standbys[f[1]] = r // an old walsender not gone yet: the larger lag
			}
		case line == "":
		default:
			return 0, nil, fmt.Errorf("unexpected answer %q", line)
		}
	}
	return timeline, standbys, nil
}

// Observed is what a Status is made of.
type Observed struct {
	Cluster *dbv1.PostgresCluster
	Pods    []corev1.Pod
	Backups []dbv1.PostgresBackup
	// Replication is the primary's answer to replicationQuery; ReplicationErr why there
	// is none.
	Replication    string
	ReplicationErr error
}

// observe reads the cluster, its pods and backups, and asks its primary.
func (o *Options) observe(ctx context.Context, name string) (Observed, error) {
	var obs Observed
	c, err := o.cluster(ctx, name)
	if err != nil {
		return obs, err
	}
	obs.Cluster = c
	var pods corev1.PodList
	if err := o.Client.List(ctx, &pods, client.InNamespace(c.Namespace), client.MatchingLabels{dbv1.LabelCluster: c.Name}); err != nil {
		return obs, err
	}
	obs.Pods = pods.Items
	var backups dbv1.PostgresBackupList
	if err := o.Client.List(ctx, &backups, client.InNamespace(c.Namespace), client.MatchingLabels{dbv1.LabelCluster: c.Name}); err != nil {
		return obs, err
	}
	obs.Backups = backups.Items
	switch primary := c.Status.CurrentPrimary; {
	case primary == "":
		obs.ReplicationErr = fmt.Errorf("no primary")
	case o.Exec == nil:
		obs.ReplicationErr = fmt.Errorf("cannot run commands in pods")
	default:
		obs.Replication, obs.ReplicationErr = o.Exec(ctx, c.Namespace, primary, psqlCommand(replicationQuery))
	}
	return obs, nil
}

// Summarize makes the Status of what was observed.
func Summarize(o Observed) Status {
	c := o.Cluster
	st := Status{Name: c.Name, Namespace: c.Namespace, Phase: c.Status.Phase, Version: c.Spec.Version, Wanted: c.Spec.Replicas,
		Ready: c.Status.ReadyInstances, Primary: c.Status.CurrentPrimary, LastFailover: c.Status.LastFailover,
		Conditions: c.Status.Conditions, Backups: map[dbv1.BackupPhase]int{}}
	timeline, standbys, err := int64(0), map[string]Replication{}, o.ReplicationErr
	if err == nil {
		timeline, standbys, err = parseReplication(o.Replication)
	}
	if err != nil {
		st.ReplicationError = err.Error()
	}
	st.Timeline = timeline
	pods := append([]corev1.Pod(nil), o.Pods...)
	sort.Slice(pods, func(i, j int) bool { return ordinalLess(pods[i].Name, pods[j].Name) })
	for i := range pods {
		p := &pods[i]
		in := Instance{Name: p.Name, Role: p.Labels[dbv1.LabelRole], Ready: clusterpods.IsReady(p), Node: p.Spec.NodeName}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "postgres" {
				in.Restarts = cs.RestartCount
			}
		}
		if r, ok := standbys[p.Name]; ok {
			in.Replication = &r
		}
		for _, is := range c.Status.Instances {
			if is.Name == p.Name {
				in.Message = is.Message
			}
		}
		st.Instances = append(st.Instances, in)
	}
	st.LastVerification = c.Status.LastBackupVerification
	st.Replica = c.Status.Replica
	if c.Spec.Pooler != nil {
		st.Pooler = &Pooler{Service: c.Names().PoolerReadWrite()}
		if p := c.Status.Pooler; p != nil {
			st.Pooler.PoolerStatus = *p
		}
	}
	for _, b := range o.Backups {
		st.Backups[b.Status.Phase]++
		if b.Status.Phase != dbv1.BackupCompleted || b.Status.StoppedAt == nil {
			continue
		}
		if st.LastBackup == nil || b.Status.StoppedAt.After(st.LastBackup.Finished) {
			st.LastBackup = &Backup{Name: b.Name, Finished: b.Status.StoppedAt.Time, SizeBytes: b.Status.SizeBytes}
			if b.Status.StartedAt != nil {
				st.LastBackup.Duration = b.Status.StoppedAt.Sub(b.Status.StartedAt.Time)
			}
		}
	}
	return st
}

// ordinalLess orders my-db-2 before my-db-10.
func ordinalLess(a, b string) bool {
	ia, ib := a[strings.LastIndex(a, "-")+1:], b[strings.LastIndex(b, "-")+1:]
	na, ea := strconv.Atoi(ia)
	nb, eb := strconv.Atoi(ib)
	if ea != nil || eb != nil || a[:len(a)-len(ia)] != b[:len(b)-len(ib)] {
		return a < b
	}
	return na < nb
}

// replicaLine says where a replica cluster stands.
func replicaLine(r *dbv1.ReplicaStatus, now time.Time) string {
	switch {
	case r.PromotedAt != nil:
		return fmt.Sprintf("%s, promoted %s ago: %s", r.Source, ago(now, r.PromotedAt.Time), r.Message)
	case r.Streaming:
		return fmt.Sprintf("%s, %s streams from it, %d s behind", r.Source, orDash(r.DesignatedPrimary), r.LagSeconds)
	}
	return fmt.Sprintf("%s, not streaming: %s", r.Source, orDash(r.Message))
}

// printStatus writes st for a person.
func printStatus(w io.Writer, st Status, now time.Time) error {
	fmt.Fprintf(w, "Cluster %s in %s: %s, PostgreSQL %s, %d of %d instances ready\n", st.Name, st.Namespace, orDash(string(st.Phase)), st.Version, st.Ready, st.Wanted)
	primary := orDash(st.Primary)
	if st.Timeline > 0 {
		primary += fmt.Sprintf(" (timeline %d)", st.Timeline)
	}
	fmt.Fprintf(w, "Primary:       %s\n", primary)
	if f := st.LastFailover; f != nil {
		fmt.Fprintf(w, "Last failover: %s → %s, %s ago, took %s: %s\n", orDash(f.From), f.To, ago(now, f.Time.Time), orDash(f.Duration), f.Reason)
	} else {
		fmt.Fprintln(w, "Last failover: none")
	}
	if b := st.LastBackup; b != nil {
		fmt.Fprintf(w, "Last backup:   %s, %s ago, %s in %s", b.Name, ago(now, b.Finished), humanize.IBytes(uint64(max(b.SizeBytes, 0))), b.Duration.Round(time.Second))
	} else {
		fmt.Fprint(w, "Last backup:   none")
	}
	fmt.Fprintf(w, " (backups: %d completed, %d failed, %d running)\n", st.Backups[dbv1.BackupCompleted], st.Backups[dbv1.BackupFailed],
		st.Backups[dbv1.BackupRunning]+st.Backups[dbv1.BackupPending])
	if v := st.LastVerification; v != nil {
		when := "unknown"
		if v.FinishedAt != nil {
			when = ago(now, v.FinishedAt.Time) + " ago"
		}
		fmt.Fprintf(w, "Verified:      %s, %s, backup %s: %s\n", v.Result, when, orNone(v.Backup), v.Message)
	}
	if r := st.Replica; r != nil {
		fmt.Fprintln(w, "Replica of:    "+replicaLine(r, now))
	}
	if st.ReplicationError != "" {
		fmt.Fprintf(w, "Replication:   unknown (%s)\n", st.ReplicationError)
	}
	if p := st.Pooler; p != nil {
		fmt.Fprintf(w, "Pooler:        %s, %d of %d pods ready", p.Service, p.ReadyInstances, p.Instances)
		if p.Message != "" {
			fmt.Fprintf(w, " (%s)", p.Message)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tROLE\tREADY\tRESTARTS\tNODE\tREPLICATION\tLAG\tREPLAY LAG")
	for _, in := range st.Instances {
		repl, lag, replay := "-", "-", "-"
		switch r := in.Replication; {
		case r != nil:
			repl = r.State + " (" + r.SyncState + ")"
			lag = humanize.IBytes(uint64(max(r.LagBytes, 0)))
			replay = strconv.FormatFloat(r.ReplayLagSeconds, 'f', 3, 64) + "s"
		case in.Name != st.Primary && st.ReplicationError == "":
			repl = "not streaming"
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%s\t%s\t%s\t%s\n", in.Name, orDash(in.Role), in.Ready, in.Restarts, orDash(in.Node), repl, lag, replay)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, in := range st.Instances {
		if in.Message != "" {
			fmt.Fprintf(w, "%s %s\n", in.Name, in.Message)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONDITION\tSTATUS\tREASON\tMESSAGE")
	for _, c := range st.Conditions {
		// One line each: the Helm manager's Deployed message carries the chart's notes.
		msg, _, _ := strings.Cut(c.Message, "\n")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Type, c.Status, orDash(c.Reason), msg)
	}
	return tw.Flush()
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func ago(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
