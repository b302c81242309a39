package clusterconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSlotTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", DefaultIdleSlotTimeout},
		{"30m", 30 * time.Minute},
		{"1h30m", 90 * time.Minute},
		{"0s", 0},
		{"-5m", DefaultIdleSlotTimeout},
		{"soon", DefaultIdleSlotTimeout},
	} {
		if got := (Config{IdleSlotTimeout: tc.in}).SlotTimeout(); got != tc.want {
			t.Errorf("SlotTimeout(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestReadLagBound(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{{"", DefaultMaxReadLag}, {"10s", 10 * time.Second}, {"0s", DefaultMaxReadLag}, {"soon", DefaultMaxReadLag}, {"2m", 2 * time.Minute}} {
		if got := (Config{MaxReadLag: tc.in}).ReadLagBound(); got != tc.want {
			t.Errorf("ReadLagBound(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestLoad reads config.json as the chart renders it, and refuses one without the
// fields every agent needs.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		wantErr    []string // substrings of the error; none means it loads
	}{
		{name: "complete", json: `{"clusterName":"db","replicas":3,"primaryLease":"db-primary",
			"bootstrap":{"database":"app","owner":"app"},"backup":{"store":{"directory":"/b","prefix":"pg/db"}}}`},
		{name: "empty", json: `{}`,
			wantErr: []string{"clusterName", "primaryLease", "bootstrap.database", "bootstrap.owner", "replicas"}},
		{name: "no instances", json: `{"clusterName":"db","replicas":0,"primaryLease":"db-primary",
			"bootstrap":{"database":"app","owner":"app"}}`, wantErr: []string{"lacks replicas"}},
		{name: "not JSON", json: `clusterName: db`, wantErr: []string{"not valid JSON"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(path, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(path)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if c.ClusterName != "db" || c.Replicas != 3 || c.Backup == nil || c.Backup.Store.Prefix != "pg/db" {
					t.Fatalf("Load = %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded, want an error naming %v", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.json")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}
