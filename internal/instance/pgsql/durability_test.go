package pgsql

import (
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
