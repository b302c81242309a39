package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// WriteHBA writes pg_hba.conf only when the lockout state changes (each write is a
// reload of postgres), agrees with what WriteConfig wrote last, and writes again after
// ForgetHBA (a reload that failed).
func TestWriteHBAWritesOnlyChanges(t *testing.T) {
	p := &Postgres{PGData: t.TempDir()}
	file := filepath.Join(p.PGData, "pg_hba.conf")
	in := func(locked bool) pgconf.ConfInput {
		return pgconf.ConfInput{ReplicationUser: "streaming_replica", LockedOut: locked}
	}
	steps := []struct {
		name        string
		do          func() (bool, error)
		wantChanged bool
		wantLocked  bool
	}{
		{"the first write", func() (bool, error) { return p.WriteHBA(in(false)) }, true, false},
		{"the same state again", func() (bool, error) { return p.WriteHBA(in(false)) }, false, false},
		{"locked out", func() (bool, error) { return p.WriteHBA(in(true)) }, true, true},
		{"locked out again", func() (bool, error) { return p.WriteHBA(in(true)) }, false, true},
		{"after a failed reload", func() (bool, error) { p.ForgetHBA(); return p.WriteHBA(in(true)) }, true, true},
		{"WriteConfig let clients in", func() (bool, error) {
			if err := p.WriteConfig(in(false)); err != nil {
				return false, err
			}
			return p.WriteHBA(in(false))
		}, false, false},
		{"locked out after WriteConfig", func() (bool, error) { return p.WriteHBA(in(true)) }, true, true},
	}
	for _, s := range steps {
		changed, err := s.do()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if changed != s.wantChanged {
			t.Errorf("%s: changed %v, want %v", s.name, changed, s.wantChanged)
		}
		if got := p.HBALocked(); got != s.wantLocked {
			t.Errorf("%s: HBALocked %v, want %v", s.name, got, s.wantLocked)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if locked := strings.Contains(string(b), "clients are locked out"); locked != s.wantLocked {
			t.Errorf("%s: pg_hba.conf locks clients out: %v, want %v", s.name, locked, s.wantLocked)
		}
		// The pooler's lookup role is let in by its certificate, except while locked out.
		if pooler := strings.Contains(string(b), " "+poolerauth.Role+" "); pooler == s.wantLocked {
			t.Errorf("%s: pg_hba.conf has a line for %s: %v, want %v", s.name, poolerauth.Role, pooler, !s.wantLocked)
		}
	}
}

// Clients count as let in only once the postmaster loaded the pg_hba.conf that let
// them in after the last lockout: a load confirmed for an earlier write (one that raced
// a lockout and a later write) does not count for the later one.
func TestClientsLetInOnlyOnceLoaded(t *testing.T) {
	p := &Postgres{PGData: t.TempDir()}
	in := func(locked bool) pgconf.ConfInput {
		return pgconf.ConfInput{ReplicationUser: "streaming_replica", LockedOut: locked}
	}
	mustWrite := func(locked bool) {
		t.Helper()
		if _, err := p.WriteHBA(in(locked)); err != nil {
			t.Fatal(err)
		}
	}
	if p.ClientsLetIn() {
		t.Fatal("let in before any pg_hba.conf was written")
	}
	mustWrite(false)
	gen, pending := p.HBALetInPending()
	if !pending || p.ClientsLetIn() {
		t.Fatalf("written, not loaded: pending %v, let in %v; want pending, not let in", pending, p.ClientsLetIn())
	}
	p.HBALoaded(gen)
	if _, pending := p.HBALetInPending(); pending || !p.ClientsLetIn() {
		t.Fatalf("loaded: pending %v, let in %v; want let in", pending, p.ClientsLetIn())
	}
	// A configuration change writes the file again, clients still let in: by the old
	// file until the reload, by the new one after.
	if err := p.WriteConfig(in(false)); err != nil {
		t.Fatal(err)
	}
	if _, pending := p.HBALetInPending(); pending || !p.ClientsLetIn() {
		t.Fatalf("rewritten while let in: pending %v, let in %v; want let in", pending, p.ClientsLetIn())
	}
	mustWrite(true)
	if _, pending := p.HBALetInPending(); pending || p.ClientsLetIn() {
		t.Fatal("a lockout counts as let in, or as waiting to be")
	}
	if err := p.WriteConfig(in(false)); err != nil {
		t.Fatal(err)
	}
	racing, _ := p.HBALetInPending()
	mustWrite(true)
	mustWrite(false)
	p.HBALoaded(racing)
	if p.ClientsLetIn() {
		t.Fatal("a load confirmed for an earlier write let clients in for a later one")
	}
	last, pending := p.HBALetInPending()
	if !pending || last == racing {
		t.Fatalf("the later write: gen %d pending %v; want a newer gen than %d, pending", last, pending, racing)
	}
	p.HBALoaded(last)
	p.HBALoaded(racing) // late, and older: changes nothing
	if !p.ClientsLetIn() {
		t.Fatal("the last write loaded, and clients are not let in")
	}
}
