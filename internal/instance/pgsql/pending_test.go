package pgsql

import "testing"

func TestSameValue(t *testing.T) {
	for _, tc := range []struct {
		running, pending string
		want             bool
	}{
		{"128MB", "131072kB", true},
		{"100", "100", true},
		{"128MB", "160MB", false},
		{"100", "200", false},
		{"1min", "60s", false}, // not memory: left to the restart
		{"0", "0kB", false},
	} {
		if got := sameValue(tc.running, tc.pending); got != tc.want {
			t.Errorf("sameValue(%q, %q) = %v, want %v", tc.running, tc.pending, got, tc.want)
		}
	}
}
