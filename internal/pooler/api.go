package pooler

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// serveAPI serves the pooler agent's HTTPS API until ctx ends:
//
//	GET  /healthz  PgBouncer answered within 30 s (the liveness probe; no token)
//	GET  /readyz   PgBouncer answers and the pod is not stopping (readiness; no token)
//	POST /pause    hold queries while a primary hands over (the agents' peer token)
//	GET  /status   agentapi.PoolerStatus (the operator's or a peer's token)
//	GET  /metrics  Prometheus series (the metrics or the operator's token)
func (p *poolerAgent) serveAPI(ctx context.Context) error {
	creds := p.opts.Credentials
	guard := func(h http.HandlerFunc, allowed ...agentapi.Purpose) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if code, reason := agentapi.Authorize(creds, r, allowed...); code != http.StatusOK {
				p.log.V(1).Info("Refused unauthorised call", "result", reason, "code", code, "path", r.URL.Path, "remoteAddr", r.RemoteAddr)
				http.Error(w, reason, code)
				return
			}
			h(w, r)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.Live() {
			http.Error(w, "PgBouncer has not answered its admin console for "+unanswered.String(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !p.Ready(r.Context()) {
			http.Error(w, "not ready: PgBouncer does not answer, or the pod is stopping", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("POST "+agentapi.PathPoolerPause, guard(p.pause, agentapi.Peer))
	mux.HandleFunc("GET /status", guard(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.status(r.Context()))
	}, agentapi.Control, agentapi.Peer))
	if p.opts.Registry != nil {
		mux.Handle("GET /metrics", guard(promhttp.HandlerFor(p.opts.Registry, promhttp.HandlerOpts{}).ServeHTTP, agentapi.Metrics, agentapi.Control))
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	ln, err := net.Listen("tcp", p.opts.APIAddr)
	if err != nil {
		return err
	}
	if p.opts.TLSDir != "" {
		certs := &certFiles{cert: filepath.Join(p.opts.TLSDir, "tls.crt"), key: filepath.Join(p.opts.TLSDir, "tls.key")}
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get})
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// pause holds the read-write pool for the primary that asks: it answers once the pool
// is paused (the transactions in flight ended) or with why not.
func (p *poolerAgent) pause(w http.ResponseWriter, r *http.Request) {
	if p.follower == nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": "the read-only pool does not follow the primary"})
		return
	}
	var req agentapi.PoolerPauseRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.Primary == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want {\"primary\": pod, \"term\": n}"})
		return
	}
	start := time.Now()
	if err := p.follower.Hold(r.Context(), req.Primary, req.Term, HoldTimeout); err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	p.log.Info("Holding clients' queries while the primary hands over", "primary", req.Primary, "term", req.Term,
		"paused in", time.Since(start).Round(time.Millisecond).String())
	writeJSON(w, http.StatusOK, p.status(r.Context()))
}

func (p *poolerAgent) status(ctx context.Context) agentapi.PoolerStatus {
	s := agentapi.PoolerStatus{Pool: "ro", Ready: p.Ready(ctx)}
	if p.follower != nil {
		st := p.follower.State()
		s.Pool, s.Primary, s.Paused, s.Held = "rw", st.Pointed, st.Paused, st.Held
	}
	return s
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// certFiles serves a certificate from files, read again when they change (a renewal
// by the operator reaches the pod's mount without a restart).
type certFiles struct {
	cert, key string

	mu    sync.Mutex
	stamp time.Time
	pair  *tls.Certificate
}

func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	st, err := os.Stat(c.cert)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pair != nil && st.ModTime().Equal(c.stamp) {
		return c.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, err
	}
	c.pair, c.stamp = &pair, st.ModTime()
	return c.pair, nil
}

var (
	pausedDesc = prometheus.NewDesc("pgpilot_pooler_paused",
		"1 while the read-write pool holds clients' queries (the primary moving).", nil, nil)
	heldDesc = prometheus.NewDesc("pgpilot_pooler_held",
		"1 while the read-write pool is held for a primary that hands over.", nil, nil)
	pointedDesc = prometheus.NewDesc("pgpilot_pooler_primary",
		"1 for the instance the read-write pool sends queries to.", []string{"primary"}, nil)
)

// followerCollector is the follower's state as series.
type followerCollector struct{ f *Follower }

func (c followerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pausedDesc
	ch <- heldDesc
	ch <- pointedDesc
}

func (c followerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.f.State()
	ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, bool01(s.Paused))
	ch <- prometheus.MustNewConstMetric(heldDesc, prometheus.GaugeValue, bool01(s.Held))
	if s.Pointed != "" {
		ch <- prometheus.MustNewConstMetric(pointedDesc, prometheus.GaugeValue, 1, s.Pointed)
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collector is the pooler's own series; PgBouncer's statistics are NewCollector's.
func (p *poolerAgent) collector() prometheus.Collector {
	cs := collectors{}
	if p.follower != nil {
		cs = append(cs, followerCollector{p.follower})
	}
	return cs
}

// collectors is several collectors registered as one.
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
