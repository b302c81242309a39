package pgconf

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

func TestPostgresqlConfPrecedence(t *testing.T) {
	in := ConfInput{
		Cluster: clusterconfig.Config{Replicas: 3, Parameters: map[string]string{
			"work_mem": "8MB", "wal_retrieve_retry_interval": "2s", "port": "6543",
		}},
		Pod: "db-1", Listen: "10.0.0.7", Port: 5432, Socket: "/run/postgresql", Role: AsStandby,
		ReplicationUser: "pgpilot_replication", TLS: TLSFiles{Source: "/etc/pgpilot/tls", Dir: "/run/postgresql/tls"},
	}
	in.Upstream = &Upstream{Host: "db-0.db-headless.prod.svc", Port: 5432, User: "pgpilot_replication", TLS: in.TLS}
	conf := PostgresqlConf(in)
	last := map[string]string{}
	for _, line := range strings.Split(conf, "\n") {
		if k, v, ok := strings.Cut(line, " = "); ok {
			last[k] = v // postgres uses the last occurrence
		}
	}
	want := map[string]string{
		"work_mem":                    "'8MB'",
		"wal_retrieve_retry_interval": "'2s'",   // the user's overrides pgpilot's default
		"port":                        "'5432'", // pgpilot's managed value wins
		"listen_addresses":            "'10.0.0.7'",
		"primary_slot_name":           "'pgpilot_db_1'",
		"max_wal_senders":             "'36'",
		"hot_standby":                 "'on'",
		"recovery_target_timeline":    "'latest'",
		"ssl":                         "'on'",
		"ssl_cert_file":               "'/run/postgresql/tls/server.crt'",
		"ssl_key_file":                "'/run/postgresql/tls/server.key'",
		"ssl_ca_file":                 "'/run/postgresql/tls/client-ca.crt'",
		"ssl_min_protocol_version":    "'TLSv1.2'",
	}
	for k, v := range want {
		if last[k] != v {
			t.Errorf("%s = %s, want %s", k, last[k], v)
		}
	}
	// Replication is by TLS, the primary verified by name, the standby logging in with
	// its certificate: no password.
	for _, kv := range []string{`host=''db-0.db-headless.prod.svc''`, `application_name=''db-1''`, `sslmode=''verify-full''`,
		`sslrootcert=''/run/postgresql/tls/server-ca.crt''`, `sslcert=''/run/postgresql/tls/replication.crt''`,
		`sslkey=''/run/postgresql/tls/replication.key''`} {
		if !strings.Contains(last["primary_conninfo"], kv) {
			t.Errorf("primary_conninfo = %s, without %s", last["primary_conninfo"], kv)
		}
	}
	for _, k := range []string{"password", "passfile", "hostaddr"} {
		if strings.Contains(last["primary_conninfo"], k+"=") {
			t.Errorf("primary_conninfo = %s, with %s", last["primary_conninfo"], k)
		}
	}
	in.Role = AsPrimary
	if strings.Contains(PostgresqlConf(in), "primary_conninfo") {
		t.Error("a primary's configuration names an upstream")
	}
}

// WAL kept for slots and between checkpoints is bounded by the volume's size, and a
// user parameter still overrides the bound.
func TestWALBoundsFollowTheVolume(t *testing.T) {
	settings := func(in ConfInput) map[string]string {
		last := map[string]string{}
		for _, line := range strings.Split(PostgresqlConf(in), "\n") {
			if k, v, ok := strings.Cut(line, " = "); ok {
				last[k] = v
			}
		}
		return map[string]string{"max_slot_wal_keep_size": last["max_slot_wal_keep_size"],
			"max_wal_size": last["max_wal_size"], "min_wal_size": last["min_wal_size"]}
	}
	cases := []struct {
		name   string
		volume uint64
		params map[string]string
		want   map[string]string
	}{
		{"the chart's default 1Gi", 1 << 30, nil,
			map[string]string{"max_slot_wal_keep_size": "'256MB'", "max_wal_size": "'256MB'", "min_wal_size": "'80MB'"}},
		{"100Gi: PostgreSQL's own max_wal_size", 100 << 30, nil,
			map[string]string{"max_slot_wal_keep_size": "'25600MB'", "max_wal_size": "'1024MB'", "min_wal_size": "'80MB'"}},
		{"a tiny volume", 100 << 20, nil,
			map[string]string{"max_slot_wal_keep_size": "'64MB'", "max_wal_size": "'64MB'", "min_wal_size": "'32MB'"}},
		{"the user's value wins", 1 << 30, map[string]string{"max_slot_wal_keep_size": "-1"},
			map[string]string{"max_slot_wal_keep_size": "'-1'", "max_wal_size": "'256MB'", "min_wal_size": "'80MB'"}},
		{"volume unknown: PostgreSQL's defaults", 0, nil,
			map[string]string{"max_slot_wal_keep_size": "", "max_wal_size": "", "min_wal_size": ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := ConfInput{Cluster: clusterconfig.Config{Replicas: 2, Parameters: tc.params}, Pod: "db-0", Port: 5432, Role: AsPrimary, VolumeBytes: tc.volume}
			if diff := cmp.Diff(tc.want, settings(in)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestQuoting(t *testing.T) {
	for _, tc := range []struct{ name, in, conf string }{
		{"plain", "8MB", "'8MB'"},
		{"quote", "it's", "'it''s'"},
		{"backslash", `a\b`, `'a\\b'`},
		{"newline is one line", "a\nb\rc", "'a b c'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := QuoteConf(tc.in); got != tc.conf {
				t.Errorf("QuoteConf(%q) = %s, want %s", tc.in, got, tc.conf)
			}
		})
	}
	got := Conninfo(map[string]string{"host": "h", "password": `p'w\x`, "user": "u"})
	if want := `host='h' password='p\'w\\x' user='u'`; got != want {
		t.Errorf("Conninfo = %s, want %s", got, want)
	}
}

func TestSlotName(t *testing.T) {
	for pod, want := range map[string]string{"db-0": "pgpilot_db_0", "My.DB-12": "pgpilot_my_db_12"} {
		if got := SlotName(pod); got != want {
			t.Errorf("SlotName(%q) = %q, want %q", pod, got, want)
		}
	}
}

func TestPassFileEscapes(t *testing.T) {
	got := PassFile(Credentials{
		Superuser:   Credential{Username: "postgres", Password: `a:b\c`},
		Replication: Credential{Username: "pgpilot_replication", Password: "x"},
	})
	want := "*:*:*:pgpilot_replication:x\n*:*:*:postgres:a\\:b\\\\c\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestScram(t *testing.T) {
	salt := strings.NewReader("0123456789abcdef")
	v, err := ScramVerifier("s3cret", salt)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$") {
		t.Errorf("verifier %s", v)
	}
	for _, tc := range []struct {
		name, verifier, password string
		want                     bool
	}{
		{"right", v, "s3cret", true},
		{"wrong", v, "s3cret!", false},
		{"md5", "md5abcdef", "s3cret", false},
		{"garbled", "SCRAM-SHA-256$x:y$z", "s3cret", false},
	} {
		if got := ScramMatches(tc.verifier, tc.password); got != tc.want {
			t.Errorf("%s: ScramMatches = %v", tc.name, got)
		}
	}
	if _, err := ScramVerifier("x", strings.NewReader("short")); err == nil {
		t.Error("a short random source gave a verifier")
	}
}

func TestSynchronousStandbyNames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		k        int
		standbys []string
		want     string
	}{
		{"async: the gate alone", 0, nil, `FIRST 1 ("pgpilot_gate")`},
		{"async keeps the gate alone", 0, []string{"db-0"}, `FIRST 1 ("pgpilot_gate", "db-0")`},
		{"one of two", 1, []string{"db-0", "db-2"}, `FIRST 2 ("pgpilot_gate", "db-0", "db-2")`},
		{"both", 2, []string{"db-0", "db-2"}, `FIRST 3 ("pgpilot_gate", "db-0", "db-2")`},
		{"never capped: commits wait", 2, []string{"db-0"}, `FIRST 3 ("pgpilot_gate", "db-0")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SynchronousStandbyNames(tc.k, tc.standbys); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// A standby already carries the rule it would start with as primary: the gate and
	// every other instance but its primary.
	c := clusterconfig.Config{ClusterName: "db", Replicas: 3, SynchronousReplicas: 1}
	in := ConfInput{Cluster: c, Pod: "db-1", Role: AsStandby, Upstream: &Upstream{Host: "db-0.svc"}, SyncRule: StandbyRule(c, "db-1", "db-0")}
	if !strings.Contains(PostgresqlConf(in), `synchronous_standby_names = 'FIRST 2 ("pgpilot_gate", "db-2")'`) {
		t.Error("a standby's configuration does not carry the synchronous rule for its promotion")
	}
	// A primary's is its rule.
	in = ConfInput{Cluster: c, Pod: "db-1", Role: AsPrimary, SyncRule: []string{"db-2"}}
	if !strings.Contains(PostgresqlConf(in), `synchronous_standby_names = 'FIRST 2 ("pgpilot_gate", "db-2")'`) {
		t.Error("a primary's configuration does not carry its rule")
	}
	// A frozen standby has no upstream.
	in = ConfInput{Cluster: c, Pod: "db-1", Role: AsStandby}
	if conf := PostgresqlConf(in); !strings.Contains(conf, "primary_conninfo = ''") || strings.Contains(conf, "primary_slot_name") {
		t.Errorf("a frozen standby's configuration:\n%s", conf)
	}
}

func lastSettings(conf string) map[string]string {
	last := map[string]string{}
	for _, line := range strings.Split(conf, "\n") {
		if k, v, ok := strings.Cut(line, " = "); ok {
			last[k] = v
		}
	}
	return last
}

// Archiving is always on, through the agent, so adding a backup store needs no restart;
// a recovery from a backup adds the restore command and the target.
func TestArchiveAndRecoverySettings(t *testing.T) {
	in := ConfInput{
		Cluster: clusterconfig.Config{Replicas: 1}, Pod: "db-0", Port: 5432, Role: AsPrimary,
		Commands: Commands{Agent: "/pgpilot/agent", ConfigPath: "/etc/pgpilot/config/config.json", StatusFile: "/run/postgresql/it's.json"},
	}
	last := lastSettings(PostgresqlConf(in))
	if last["archive_mode"] != "'always'" {
		t.Errorf("archive_mode = %s", last["archive_mode"])
	}
	wantArchive := `'''/pgpilot/agent'' ''archive-wal'' ''--config'' ''/etc/pgpilot/config/config.json'' ''--status-file'' ''/run/postgresql/it''\\''''s.json'' %p %f'` // the conf file escapes the shell's backslash
	if last["archive_command"] != wantArchive {
		t.Errorf("archive_command = %s\nwant %s", last["archive_command"], wantArchive)
	}
	for _, k := range []string{"restore_command", "recovery_target_time", "archive_timeout"} {
		if _, ok := last[k]; ok {
			t.Errorf("%s is set without a backup or a recovery", k)
		}
	}
	in.Cluster.Backup = &clusterconfig.Backup{}
	in.Recovery = &Recovery{TargetTime: "2026-11-21T14:13:21.123456789Z"}
	last = lastSettings(PostgresqlConf(in))
	for k, v := range map[string]string{
		"archive_timeout":          "'5min'",
		"recovery_target_time":     "'2026-11-21 14:13:21.123456+00'",
		"recovery_target_action":   "'promote'",
		"recovery_target_timeline": "'latest'",
		"restore_command":          `'''/pgpilot/agent'' ''restore-wal'' ''--config'' ''/etc/pgpilot/config/config.json'' %f %p'`,
	} {
		if last[k] != v {
			t.Errorf("%s = %s, want %s", k, last[k], v)
		}
	}
}

// A config.json the CRD did not check (made by hand, or under an older CRD) cannot add
// lines to postgresql.conf nor keep a managed setting in another case in force.
func TestUncheckedParametersAreLeftOut(t *testing.T) {
	in := ConfInput{
		Cluster: clusterconfig.Config{Replicas: 1, Parameters: map[string]string{
			"work_mem":                    "8MB",
			"pg_stat_statements.max":      "5000",
			"RESTORE_COMMAND":             "touch /tmp/x",
			"Archive_Cleanup_Command":     "touch /tmp/y",
			"x = 1\nrecovery_end_command": "touch /tmp/z",
			"shared_preload_libraries":    "/tmp/evil",
			"Dynamic_Library_Path":        "/var/lib/postgresql/data:$libdir",
			"session_preload_libraries":   "auto_explain",
		}},
		Pod: "db-0", Port: 5432, Role: AsPrimary,
	}
	conf := PostgresqlConf(in)
	for _, bad := range []string{"touch", "RESTORE_COMMAND", "Archive_Cleanup_Command", "recovery_end_command", "/tmp/evil", "Dynamic_Library_Path"} {
		if strings.Contains(conf, bad) {
			t.Errorf("postgresql.conf holds %q:\n%s", bad, conf)
		}
	}
	for _, good := range []string{"work_mem = '8MB'", "pg_stat_statements.max = '5000'", "session_preload_libraries = 'auto_explain'"} {
		if !strings.Contains(conf, good) {
			t.Errorf("postgresql.conf lacks %q", good)
		}
	}
}
