package agent

import (
	"strings"
	"testing"
)

func TestUnsafeSynchronousCommit(t *testing.T) {
	for value, unsafe := range map[string]bool{
		"local": true, "off": true, "OFF": true, "false": true, "no": true, "0": true, "'local'": true,
		"on": false, "remote_write": false, "remote_apply": false, "true": false, "1": false,
	} {
		if got := unsafeSynchronousCommit(value); got != unsafe {
			t.Errorf("unsafeSynchronousCommit(%q) = %v, want %v", value, got, unsafe)
		}
	}
}

func TestDurabilityOverrideStatements(t *testing.T) {
	for _, tc := range []struct {
		o    DurabilityOverride
		want string
	}{
		{DurabilityOverride{Database: "app", Value: "local"}, `ALTER DATABASE "app" RESET synchronous_commit`},
		{DurabilityOverride{Role: "app", Value: "off"}, `ALTER ROLE "app" RESET synchronous_commit`},
		{DurabilityOverride{Database: "shop", Role: "Bob", Value: "off"}, `ALTER ROLE "Bob" IN DATABASE "shop" RESET synchronous_commit`},
		{DurabilityOverride{Value: "off"}, `ALTER ROLE ALL RESET synchronous_commit`},
		{DurabilityOverride{Database: "a\"b", Value: "off"}, `ALTER DATABASE "a""b" RESET synchronous_commit`},
	} {
		if got := tc.o.statement("RESET synchronous_commit"); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.o, got, tc.want)
		}
	}
	if got := (DurabilityOverride{Database: "app", Value: "local"}).String(); got != `ALTER DATABASE "app" SET synchronous_commit = local` {
		t.Errorf("String: %s", got)
	}
}

// A locked-out primary's pg_hba.conf lets in the agent's own local sessions and the
// standbys' replication, and no client.
func TestLockedOutHBAConf(t *testing.T) {
	conf := hbaLines(LockedOutHBAConf("repl"))
	for i, l := range conf {
		f := strings.Fields(l)
		method := f[len(f)-1]
		if method == "reject" || method == "map=pgpilot" {
			continue
		}
		switch {
		case f[0] == "local" && f[2] == "postgres" && method == "peer":
		case f[0] == "hostssl" && f[2] == "repl" && method == "cert":
		default:
			t.Errorf("line %d lets a client in: %q", i, l)
		}
	}
	if last := conf[len(conf)-1]; !strings.HasPrefix(last, "host ") || !strings.HasSuffix(last, "reject") {
		t.Errorf("the last line %q does not refuse every network connection", last)
	}
	in := ConfInput{ReplicationUser: "repl", LockedOut: true}
	if in.HBA() != LockedOutHBAConf("repl") {
		t.Errorf("ConfInput.HBA does not render the lockout")
	}
	in.LockedOut = false
	if in.HBA() != HBAConf("repl", false) {
		t.Errorf("ConfInput.HBA renders the lockout when not locked out")
	}
}
