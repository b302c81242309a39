package testutil

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProbeTarget is one instance a Probe writes to directly: its name (the pod's) and
// the settings of a connection to its own address, not to a Service.
type ProbeTarget struct {
	Instance string
	Config   *pgx.ConnConfig
}

// ProbeOptions configures a Probe.
type ProbeOptions struct {
	// Table is written one row per attempt; it needs a text column instance. Default
	// "probe".
	Table string
	// Every is how often each instance is probed. Default 100 ms.
	Every time.Duration
	// Timeout bounds each attempt; it ends by closing the connection (see Connect).
	// Default 1 s.
	Timeout time.Duration
	// Refresh is how often the targets are listed again (pods come and go, and come
	// back with new addresses). Default 500 ms.
	Refresh time.Duration
	// MaxInFlight caps the attempts waiting on one instance (one that swallows packets
	// holds each attempt for Timeout). Default Timeout/Every + 1.
	MaxInFlight int
}

// ProbeResult is one probe attempt: a one-row commit on a fresh connection straight
// to one instance.
type ProbeResult struct {
	Instance   string
	Start, End time.Time
	// Err is nil when the commit was acknowledged.
	Err error
}

// OK reports whether the instance acknowledged the commit.
func (r ProbeResult) OK() bool { return r.Err == nil }

// Probe asks every instance, directly and all the time, whether it acknowledges a
// commit: the witness of two writable primaries, which a writer through a Service
// cannot see (the Service points at one of them).
type Probe struct {
	opts    ProbeOptions
	list    func(ctx context.Context) ([]ProbeTarget, error)
	targets atomic.Pointer[[]ProbeTarget]
	cancel  context.CancelFunc
	done    sync.WaitGroup

	mu       sync.Mutex
	results  []ProbeResult
	inFlight map[string]int
}

// StartProbe starts probing the instances that list returns; Stop ends it.
func StartProbe(list func(ctx context.Context) ([]ProbeTarget, error), opts ProbeOptions) *Probe {
	if opts.Table == "" {
		opts.Table = "probe"
	}
	if opts.Every == 0 {
		opts.Every = 100 * time.Millisecond
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.Refresh == 0 {
		opts.Refresh = 500 * time.Millisecond
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = int(opts.Timeout/opts.Every) + 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Probe{opts: opts, list: list, cancel: cancel, inFlight: map[string]int{}}
	p.refresh(ctx)
	p.done.Add(2)
	go p.refreshLoop(ctx)
	go p.probeLoop(ctx)
	return p
}

// Stop ends the probe, waits for the attempts under way, and returns every result.
func (p *Probe) Stop() []ProbeResult {
	p.cancel()
	p.done.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ProbeResult(nil), p.results...)
}

// Results returns the results recorded so far.
func (p *Probe) Results() []ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ProbeResult(nil), p.results...)
}

func (p *Probe) refresh(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// On an error the last list stays: the API server may be what the fault hit.
	if ts, err := p.list(lctx); err == nil {
		p.targets.Store(&ts)
	}
}

func (p *Probe) refreshLoop(ctx context.Context) {
	defer p.done.Done()
	t := time.NewTicker(p.opts.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.refresh(ctx)
		}
	}
}

func (p *Probe) probeLoop(ctx context.Context) {
	defer p.done.Done()
	t := time.NewTicker(p.opts.Every)
	defer t.Stop()
	for {
		if ts := p.targets.Load(); ts != nil {
			for _, target := range *ts {
				if p.reserve(target.Instance) {
					p.done.Add(1)
					go p.attempt(ctx, target)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reserve counts an attempt on instance in flight, unless MaxInFlight already are.
func (p *Probe) reserve(instance string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[instance] >= p.opts.MaxInFlight {
		return false
	}
	p.inFlight[instance]++
	return true
}

func (p *Probe) attempt(ctx context.Context, target ProbeTarget) {
	defer p.done.Done()
	r := ProbeResult{Instance: target.Instance, Start: time.Now()}
	actx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	conn, err := Connect(actx, target.Config, nil)
	if err == nil {
		_, err = conn.Exec(actx, "INSERT INTO "+pgx.Identifier{p.opts.Table}.Sanitize()+" (instance) VALUES ($1)", target.Instance)
		r.End = time.Now()
		closeQuietly(conn)
	} else {
		r.End = time.Now()
	}
	cancel()
	r.Err = err
	p.mu.Lock()
	p.inFlight[target.Instance]--
	// The probe's own end is no finding.
	if ctx.Err() == nil {
		p.results = append(p.results, r)
	}
	p.mu.Unlock()
}

// Moment is a two-writable moment: a bucket of time in which commits on two or more
// instances were acknowledged.
type Moment struct {
	// At is the bucket's start.
	At time.Time
	// Instances are the instances that acknowledged a commit in it, sorted.
	Instances []string
}

// TwoWritable returns the two-writable moments among results: the buckets of length
// bucket (100 ms in the chaos suite), aligned on multiples of bucket since the Unix
// epoch and placed by each attempt's End (when its acknowledgement arrived), in which
// acknowledged probe commits came from two or more different instances. Sorted by time.
//
// With a probe every 100 ms per instance, a primary that stops acknowledging before its
// successor starts (as the protocol requires: the successor is promoted only once the
// old one cannot acknowledge) never shares a bucket with it unless the handover itself
// takes less than a bucket.
func TwoWritable(results []ProbeResult, bucket time.Duration) []Moment {
	byBucket := map[int64]map[string]bool{}
	for _, r := range results {
		if !r.OK() {
			continue
		}
		k := r.End.UnixNano() / int64(bucket)
		if byBucket[k] == nil {
			byBucket[k] = map[string]bool{}
		}
		byBucket[k][r.Instance] = true
	}
	var moments []Moment
	for k, instances := range byBucket {
		if len(instances) < 2 {
			continue
		}
		m := Moment{At: time.Unix(0, k*int64(bucket))}
		for i := range instances {
			m.Instances = append(m.Instances, i)
		}
		slices.Sort(m.Instances)
		moments = append(moments, m)
	}
	slices.SortFunc(moments, func(a, b Moment) int { return a.At.Compare(b.At) })
	return moments
}
