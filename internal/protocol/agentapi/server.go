package agentapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults of ServerOptions and the fixed limits of the HTTP server.
const (
	DefaultRequestTimeout = 10 * time.Second
	DefaultActionTimeout  = 60 * time.Second

	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 5 * time.Second
	maxHeaderBytes    = 64 << 10
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Credentials authenticate every call but /healthz and /readyz (the kubelet's
	// probes, which say nothing but ok). Nil means Token alone, for Control.
	Credentials Credentials
	// Token is the Control token when Credentials is nil. With neither, every
	// authenticated call is refused: the API is never open.
	Token string
	// TLS serves the API over TLS when set.
	TLS *tls.Config
	// Logger receives one entry per mutating call and the server's own events. It never
	// receives the token or the Authorization header.
	Logger logr.Logger
	// Registry is what GET /metrics serves; NewServer registers the instance collector and
	// the Go and process collectors on it. Nil means a new registry.
	Registry *prometheus.Registry
	// RequestTimeout bounds the context of each read-only request, and of the Status call
	// made at each scrape. Zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// ActionTimeout bounds the context of each mutating request. Zero means
	// DefaultActionTimeout.
	ActionTimeout time.Duration
	// StatsCacheFor is how long one query batch of a StatsInstance's statistics answers
	// scrapes. Zero means DefaultStatsCacheFor.
	StatsCacheFor time.Duration
}

// Server is the agent's HTTP API over an Instance.
type Server struct {
	inst           Instance
	creds          Credentials
	tls            *tls.Config
	log            logr.Logger
	requestTimeout time.Duration
	actionTimeout  time.Duration
	handler        http.Handler
}

// NewServer returns the API of inst. It registers its collectors on opts.Registry and
// panics if that registry already holds another Server's instance collector.
func NewServer(inst Instance, opts ServerOptions) *Server {
	s := &Server{
		inst:           inst,
		creds:          opts.Credentials,
		tls:            opts.TLS,
		log:            opts.Logger,
		requestTimeout: opts.RequestTimeout,
		actionTimeout:  opts.ActionTimeout,
	}
	if s.creds == nil {
		// Only a digest of the token is kept: comparing digests of equal length keeps
		// the comparison constant-time even in the token's length.
		s.creds = Tokens(map[Purpose]string{Control: opts.Token})
		if opts.Token == "" {
			s.log.Info("No API token configured: every call but the probes will be refused")
		}
	}
	if s.requestTimeout <= 0 {
		s.requestTimeout = DefaultRequestTimeout
	}
	if s.actionTimeout <= 0 {
		s.actionTimeout = DefaultActionTimeout
	}

	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			s.log.Error(err, "Failed to register runtime metrics")
		}
	}
	reg.MustRegister(&instanceCollector{inst: inst, timeout: s.requestTimeout, log: s.log})
	if si, ok := inst.(StatsInstance); ok {
		cache := &statsCache{inst: si, cacheFor: opts.StatsCacheFor, timeout: s.requestTimeout, now: time.Now}
		if cache.cacheFor <= 0 {
			cache.cacheFor = DefaultStatsCacheFor
		}
		reg.MustRegister(&statsCollector{cache: cache, log: s.log}, &customCollector{cache: cache, log: s.log})
	}

	mux := http.NewServeMux()
	// A "GET" pattern also serves HEAD; other methods get 405 with an Allow header.
	mux.Handle("GET "+PathHealthz, http.HandlerFunc(s.healthz))
	mux.Handle("GET "+PathReadyz, s.bounded(s.requestTimeout, http.HandlerFunc(s.readyz)))
	mux.Handle("GET "+PathStatus, s.bounded(s.requestTimeout, s.guarded(http.HandlerFunc(s.status), Control, Peer, Metrics)))
	mux.Handle("POST "+PathPromote, s.bounded(s.actionTimeout, s.action("promote", inst.Promote)))
	mux.Handle("POST "+PathFence, s.bounded(s.actionTimeout, s.action("fence", inst.Fence)))
	mux.Handle("POST "+PathDemote, s.bounded(s.actionTimeout, s.action("demote", inst.Demote)))
	mux.Handle("POST "+PathFreeze, s.bounded(s.actionTimeout, s.action("freeze", inst.Freeze)))
	mux.Handle("POST "+PathRestart, s.bounded(s.actionTimeout, s.action("restart", inst.Restart)))
	mux.Handle("POST "+PathConfirm, s.bounded(s.requestTimeout, s.guarded(http.HandlerFunc(s.confirm), Peer)))
	mux.Handle("GET "+PathMetrics, s.bounded(s.requestTimeout, s.guarded(promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      promErrorLog{s.log},
		ErrorHandling: promhttp.ContinueOnError,
	}), Control, Metrics)))
	if b, ok := inst.(BackupInstance); ok {
		s.registerBackups(mux, b)
	}
	if ri, ok := inst.(RolesInstance); ok {
		s.registerRoles(mux, ri)
	}
	s.handler = mux
	return s
}

// Handler is the API as an http.Handler, for tests and for serving it on a listener of
// one's own.
func (s *Server) Handler() http.Handler { return s.handler }

// Run listens on addr (host:port) and serves the API until ctx ends, then shuts down,
// letting requests in flight finish for up to 5 seconds. It returns nil after a clean
// shutdown.
func (s *Server) Run(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for the agent API: %w", err)
	}
	return s.Serve(ctx, l)
}

// Serve is Run on a listener of the caller's; it closes l.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       s.requestTimeout,
		// Longer than the longest handler, so a slow action still gets its answer out.
		WriteTimeout:   s.actionTimeout + 5*time.Second,
		IdleTimeout:    idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       log.New(logWriter{s.log}, "", 0),
	}
	if s.tls != nil {
		l = tls.NewListener(l, s.tls)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	s.log.Info("Started serving the agent API", "address", l.Addr().String())

	select {
	case err := <-served:
		return fmt.Errorf("serve the agent API: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if err != nil {
		// Requests still running after the grace period are cut off.
		_ = srv.Close()
		err = fmt.Errorf("shut down the agent API: %w", err)
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("serving the agent API: %w", serr) // as soon as Shutdown or Close began, else
	}
	s.log.Info("Stopped serving the agent API")
	return err
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.inst.Ready(r.Context()); err != nil {
		writeText(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.inst.Status(r.Context()))
}

// action serves one mutating call: authenticate, act, answer with the Status after.
func (s *Server) action(name string, act func(context.Context) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		log := s.log.WithValues("action", name, "remoteAddr", r.RemoteAddr)
		if code, reason := s.authorize(r, Control); code != http.StatusOK {
			s.refuse(w, r, log, code, reason)
			return
		}

		err := act(r.Context())
		switch {
		case err == nil:
			st := s.inst.Status(r.Context())
			log.Info("Performed action", "result", "ok", "role", st.Role, "duration", time.Since(start))
			writeJSON(w, http.StatusOK, st)
		case errors.Is(err, ErrConflict):
			log.Info("Refused action in the instance's current state", "result", "conflict",
				"reason", err.Error(), "duration", time.Since(start))
			writeJSONError(w, http.StatusConflict, err.Error())
		default:
			log.Error(err, "Failed action", "result", "error", "duration", time.Since(start))
			writeJSONError(w, http.StatusInternalServerError, err.Error())
		}
	})
}

// confirm serves a primary's failsafe question. It is asked every second while the API
// server is away, so only refusals are logged, and only at V(1).
func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	var req ConfirmRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "decode the request: "+err.Error())
		return
	}
	if err := s.inst.Confirm(r.Context(), req); err != nil {
		s.log.V(1).Info("Refused a failsafe confirmation", "primary", req.Primary, "term", req.Term, "reason", err.Error())
		code := http.StatusInternalServerError
		if errors.Is(err, ErrConflict) {
			code = http.StatusConflict
		}
		writeJSONError(w, code, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// bounded gives each request handled by h a context that ends after d.
func (s *Server) bounded(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// errorBody is the JSON body of every error answer of the mutating calls.
type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, "encode the answer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	// Marshalling a struct holding one string cannot fail.
	b, _ := json.Marshal(errorBody{Error: msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg))
}

// logWriter passes the http.Server's own error messages (bad requests, panics in
// handlers) to the logger.
type logWriter struct{ log logr.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.log.Info("HTTP server reported an error", "message", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// promErrorLog passes promhttp's errors (a collector that failed) to the logger.
type promErrorLog struct{ log logr.Logger }

func (l promErrorLog) Println(v ...any) {
	l.log.Info("Metrics scrape reported an error", "message", fmt.Sprint(v...))
}
