package agent

import (
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
		if got := (ClusterConfig{IdleSlotTimeout: tc.in}).SlotTimeout(); got != tc.want {
			t.Errorf("SlotTimeout(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
