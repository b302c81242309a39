package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

const streamedLabel = "START WAL LOCATION: 0/4000028 (file 000000010000000000000004)\n" +
	"CHECKPOINT LOCATION: 0/4000060\nBACKUP METHOD: streamed\nBACKUP FROM: standby\n" +
	"START TIME: 2026-11-24 10:00:00 UTC\nLABEL: pg_basebackup base backup\nSTART TIMELINE: 1\n"

// Only a standby clone that postgres refused before it ever ran is cloned again: not a
// directory that ran (backup_label renamed), not a rewound former primary, not one
// without standby.signal, not another failure.
func TestCloneRefused(t *testing.T) {
	inconsistent := errors.New("postgres exited while starting: backup_label contains data inconsistent with control file")
	for _, tc := range []struct {
		name    string
		files   map[string]string
		err     error
		refused bool
	}{
		{"a clone refused at its first start", map[string]string{"standby.signal": "", "backup_label": streamedLabel}, inconsistent, true},
		{"no checkpoint record", map[string]string{"standby.signal": "", "backup_label": streamedLabel},
			errors.New("postgres exited while starting: could not locate required checkpoint record"), true},
		{"another failure", map[string]string{"standby.signal": "", "backup_label": streamedLabel},
			errors.New("postgres exited while starting: could not bind IPv4 address"), false},
		{"no failure", map[string]string{"standby.signal": "", "backup_label": streamedLabel}, nil, false},
		{"a directory that ran", map[string]string{"standby.signal": "", "backup_label.old": streamedLabel}, inconsistent, false},
		{"a rewound former primary", map[string]string{"standby.signal": "",
			"backup_label": "START WAL LOCATION: 0/3000028\nCHECKPOINT LOCATION: 0/3000060\nBACKUP METHOD: pg_rewind\nBACKUP FROM: standby\n"}, inconsistent, false},
		{"not a standby", map[string]string{"backup_label": streamedLabel}, inconsistent, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pgdata := filepath.Join(t.TempDir(), "pgdata")
			if err := os.MkdirAll(pgdata, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(pgdata, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if why := cloneRefused(pgdata, tc.err); (why != "") != tc.refused {
				t.Errorf("cloneRefused = %q, want refused %v", why, tc.refused)
			}
		})
	}
}
