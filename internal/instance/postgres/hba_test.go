package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
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
	}
}
