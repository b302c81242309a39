package agent

import (
	"testing"
	"time"
)

func TestVolumeTrend(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	const gib = 1 << 30
	tests := []struct {
		name string
		// free is the free space at t0, t0+10s, t0+20s, ...
		free []uint64
		want time.Duration
	}{
		{name: "no sample", want: 0},
		{name: "one sample", free: []uint64{gib}, want: 0},
		{name: "under a minute of samples", free: []uint64{gib, gib - 100<<20, gib - 200<<20}, want: 0},
		{name: "steady", free: repeat(gib, 13), want: 0},
		{name: "freed", free: []uint64{gib / 2, gib / 2, gib / 2, gib / 2, gib / 2, gib / 2, gib}, want: 0},
		// 60 MiB in 60 s: 1 MiB/s, 1024-60 MiB left.
		{name: "filling", free: linear(gib, 10<<20, 7), want: (1024 - 60) * time.Second},
		// Only the last 10 minutes count: 60 samples later, the fill stopped long ago.
		{name: "old fill forgotten", free: append(linear(gib, 10<<20, 7), repeat(gib-60<<20, 62)...), want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v volumeTrend
			for i, f := range tt.free {
				v.add(t0.Add(time.Duration(i)*10*time.Second), f)
				// A second sample within trendEvery is ignored.
				v.add(t0.Add(time.Duration(i)*10*time.Second+time.Second), 0)
			}
			if got := v.fullIn(); got != tt.want {
				t.Errorf("fullIn() = %s, want %s", got, tt.want)
			}
		})
	}
}

func repeat(v uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// linear is n samples starting at from, step less each time.
func linear(from, step uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from - uint64(i)*step
	}
	return out
}
