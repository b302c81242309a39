package agent

import "time"

// volumeTrend remembers the data volume's free space over the last trendWindow, one
// sample every trendEvery, to say how long until the volume is full at that rate.
type volumeTrend struct {
	samples []volumeSample
}

type volumeSample struct {
	at   time.Time
	free uint64
}

const (
	trendEvery  = 10 * time.Second
	trendWindow = 10 * time.Minute
	// trendShortest is the shortest span a rate is given for: a checkpoint or a sort's
	// temporary files move free space for seconds, not minutes.
	trendShortest = time.Minute
)

// add records free at now, at most once every trendEvery.
func (v *volumeTrend) add(now time.Time, free uint64) {
	if n := len(v.samples); n > 0 && now.Sub(v.samples[n-1].at) < trendEvery {
		return
	}
	v.samples = append(v.samples, volumeSample{at: now, free: free})
	drop := 0
	for drop < len(v.samples)-1 && now.Sub(v.samples[drop].at) > trendWindow {
		drop++
	}
	v.samples = v.samples[drop:]
}

// fullIn is how long until the volume is full at the rate free space went down from
// the oldest sample to the newest; 0 when it did not go down, or the samples span less
// than trendShortest.
func (v *volumeTrend) fullIn() time.Duration {
	if len(v.samples) < 2 {
		return 0
	}
	first, last := v.samples[0], v.samples[len(v.samples)-1]
	span := last.at.Sub(first.at)
	if span < trendShortest || last.free >= first.free {
		return 0
	}
	perSecond := float64(first.free-last.free) / span.Seconds()
	return max(time.Duration(float64(last.free)/perSecond*float64(time.Second)), time.Second)
}
