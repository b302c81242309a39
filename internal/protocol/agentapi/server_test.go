package agentapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
)

const testToken = "s3cret-t0ken-for-tests"

// fakeInstance is an Instance whose state the tests set and whose actions change it the
// way a real agent's would.
type fakeInstance struct {
	mu        sync.Mutex
	status    Status
	readyErr  error
	actionErr error // returned by every action, when set
	calls     []string
	deadlines map[string]time.Duration // time left on the ctx each method got, by method

	// entered, when set, receives the action's name as it starts; release, when set,
	// holds every action until it is closed or ctx ends.
	entered chan string
	release chan struct{}
}

func newFakeInstance(st Status) *fakeInstance {
	return &fakeInstance{status: st, deadlines: map[string]time.Duration{}}
}

func (f *fakeInstance) record(ctx context.Context, method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, method)
	if d, ok := ctx.Deadline(); ok {
		f.deadlines[method] = time.Until(d)
	} else {
		f.deadlines[method] = -1
	}
}

func (f *fakeInstance) Status(ctx context.Context) Status {
	f.record(ctx, "status")
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

func (f *fakeInstance) Ready(ctx context.Context) error {
	f.record(ctx, "ready")
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyErr
}

func (f *fakeInstance) act(ctx context.Context, name string, change func(*Status)) error {
	f.record(ctx, name)
	if f.entered != nil {
		f.entered <- name
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.actionErr != nil {
		return f.actionErr
	}
	change(&f.status)
	return nil
}

func (f *fakeInstance) Promote(ctx context.Context) error {
	return f.act(ctx, "promote", func(s *Status) { s.Role, s.Timeline = RolePrimary, s.Timeline+1 })
}

func (f *fakeInstance) Fence(ctx context.Context) error {
	return f.act(ctx, "fence", func(s *Status) { s.Role, s.Fenced = RoleFenced, true })
}

func (f *fakeInstance) Demote(ctx context.Context) error {
	return f.act(ctx, "demote", func(s *Status) { s.Role, s.Running, s.Ready = RoleStopped, false, false })
}

func (f *fakeInstance) Freeze(ctx context.Context) error {
	return f.act(ctx, "freeze", func(s *Status) { s.Frozen = true })
}

func (f *fakeInstance) Restart(ctx context.Context) error {
	return f.act(ctx, "restart", func(s *Status) { s.PendingRestart = nil })
}

func (f *fakeInstance) Confirm(ctx context.Context, req ConfirmRequest) error {
	return f.act(ctx, "confirm", func(s *Status) {
		s.FailsafeConfirmed = &FailsafeConfirmation{Primary: req.Primary, Term: req.Term}
	})
}

func (f *fakeInstance) role() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status.Role
}

func (f *fakeInstance) deadline(method string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deadlines[method]
}

// logRecorder keeps every entry a logr.Logger writes, as JSON objects.
type logRecorder struct {
	mu      sync.Mutex
	entries []string
}

func newLogRecorder() (*logRecorder, logr.Logger) {
	r := &logRecorder{}
	return r, funcr.NewJSON(func(obj string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.entries = append(r.entries, obj)
	}, funcr.Options{Verbosity: 10})
}

func (r *logRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entries)
}

// find returns the decoded entries whose fields include every one of want.
func (r *logRecorder) find(want map[string]any) []map[string]any {
	var found []map[string]any
	for _, e := range r.all() {
		var m map[string]any
		if json.Unmarshal([]byte(e), &m) != nil {
			continue
		}
		ok := true
		for k, v := range want {
			if m[k] != v {
				ok = false
				break
			}
		}
		if ok {
			found = append(found, m)
		}
	}
	return found
}

func replicaStatus() Status {
	started := time.Date(2025, 3, 4, 5, 6, 7, 800_000_000, time.UTC)
	return Status{
		Pod:             "my-db-1",
		Role:            RoleReplica,
		Running:         true,
		Ready:           true,
		Timeline:        3,
		ReceivedLSN:     "16/B374D848",
		ReplayedLSN:     "16/B3740000",
		LagBytes:        0xD848,
		PostgresVersion: 160011,
		StartedAt:       &started,
	}
}

func primaryStatus() Status {
	started := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	return Status{
		Pod:             "my-db-0",
		Role:            RolePrimary,
		Running:         true,
		Ready:           true,
		Timeline:        4,
		WriteLSN:        "1/0",
		PostgresVersion: 160011,
		StartedAt:       &started,
		Replicas: []ReplicaStatus{
			{Name: "my-db-1", State: "streaming", SyncState: "sync", SentLSN: "1/0", FlushLSN: "0/FFFFFF00", ReplayLSN: "0/FFFFF000", LagBytes: 256},
			{Name: "my-db-2", State: "catchup", SyncState: "async", SentLSN: "0/F0000000", LagBytes: 0x10000000},
		},
	}
}

// serve starts inst's API on a test server and returns its URL.
func serve(t *testing.T, inst Instance, opts ServerOptions) string {
	t.Helper()
	ts := httptest.NewServer(NewServer(inst, opts).Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

// request sends one request and returns the status code, headers and body.
func request(t *testing.T, method, url, authorization string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestHealthz(t *testing.T) {
	// Liveness is the agent's: it stays 200 while postgres is down.
	inst := newFakeInstance(Status{Role: RoleStopped})
	inst.readyErr = errors.New("postgres is not running")
	url := serve(t, inst, ServerOptions{})

	for _, tc := range []struct {
		name     string
		method   string
		wantCode int
		wantBody string
	}{
		{name: "get", method: http.MethodGet, wantCode: http.StatusOK, wantBody: "ok"},
		{name: "head", method: http.MethodHead, wantCode: http.StatusOK},
		{name: "post", method: http.MethodPost, wantCode: http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, body := request(t, tc.method, url+PathHealthz, "")
			if code != tc.wantCode {
				t.Errorf("code = %d, want %d", code, tc.wantCode)
			}
			if tc.wantBody != "" && body != tc.wantBody {
				t.Errorf("body = %q, want %q", body, tc.wantBody)
			}
		})
	}
}

func TestReadyz(t *testing.T) {
	for _, tc := range []struct {
		name     string
		readyErr error
		wantCode int
		wantBody string
	}{
		{name: "ready", wantCode: http.StatusOK, wantBody: "ok"},
		{name: "not ready", readyErr: errors.New("postgres is starting up"), wantCode: http.StatusServiceUnavailable, wantBody: "postgres is starting up"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := newFakeInstance(replicaStatus())
			inst.readyErr = tc.readyErr
			code, _, body := request(t, http.MethodGet, serve(t, inst, ServerOptions{})+PathReadyz, "")
			if code != tc.wantCode || body != tc.wantBody {
				t.Errorf("got %d %q, want %d %q", code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
}

func TestStatusEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status Status
	}{
		{name: "replica", status: replicaStatus()},
		{name: "primary with replicas", status: primaryStatus()},
		{name: "stopped with an error", status: Status{Pod: "my-db-2", Role: RoleStopped, Error: "initdb: exit status 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, header, body := request(t, http.MethodGet, serve(t, newFakeInstance(tc.status), ServerOptions{Token: testToken})+PathStatus, "Bearer "+testToken)
			if code != http.StatusOK {
				t.Fatalf("code = %d, body %q", code, body)
			}
			if ct := header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var got Status
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.status, got); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStatusJSONNames pins the wire names: the agent and the controller may run different
// versions during a rolling update.
func TestStatusJSONNames(t *testing.T) {
	b, err := json.Marshal(primaryStatus())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(maps.Keys(m))
	want := []string{"connections", "lagBytes", "pod", "postgresVersion", "ready", "replicas", "role", "running", "startedAt", "term", "timeline", "writeLSN"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	replica, _ := json.Marshal(primaryStatus().Replicas[0])
	wantReplica := `{"name":"my-db-1","state":"streaming","syncState":"sync","sentLSN":"1/0","flushLSN":"0/FFFFFF00","replayLSN":"0/FFFFF000","lagBytes":256}`
	if string(replica) != wantReplica {
		t.Errorf("replica = %s\nwant      %s", replica, wantReplica)
	}
}

func TestMutatingAuth(t *testing.T) {
	for _, tc := range []struct {
		name          string
		serverToken   string
		authorization string
		wantCode      int
	}{
		{name: "missing", serverToken: testToken, wantCode: http.StatusUnauthorized},
		{name: "wrong token", serverToken: testToken, authorization: "Bearer not-the-token", wantCode: http.StatusUnauthorized},
		{name: "token prefix", serverToken: testToken, authorization: "Bearer " + testToken[:5], wantCode: http.StatusUnauthorized},
		{name: "token with a suffix", serverToken: testToken, authorization: "Bearer " + testToken + "x", wantCode: http.StatusUnauthorized},
		{name: "empty bearer", serverToken: testToken, authorization: "Bearer ", wantCode: http.StatusUnauthorized},
		{name: "basic scheme", serverToken: testToken, authorization: "Basic " + testToken, wantCode: http.StatusUnauthorized},
		{name: "token without scheme", serverToken: testToken, authorization: testToken, wantCode: http.StatusUnauthorized},
		{name: "right token", serverToken: testToken, authorization: "Bearer " + testToken, wantCode: http.StatusOK},
		{name: "scheme in lower case", serverToken: testToken, authorization: "bearer " + testToken, wantCode: http.StatusOK},
		{name: "no server token, no header", wantCode: http.StatusUnauthorized},
		{name: "no server token, empty bearer", authorization: "Bearer ", wantCode: http.StatusUnauthorized},
		{name: "no server token, some bearer", authorization: "Bearer " + testToken, wantCode: http.StatusUnauthorized},
	} {
		for _, path := range []string{PathPromote, PathFence, PathDemote} {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				inst := newFakeInstance(replicaStatus())
				url := serve(t, inst, ServerOptions{Token: tc.serverToken})

				code, header, body := request(t, http.MethodPost, url+path, tc.authorization)
				if code != tc.wantCode {
					t.Fatalf("code = %d, want %d; body %q", code, tc.wantCode, body)
				}
				if got, want := header.Get("WWW-Authenticate"), map[bool]string{true: "Bearer"}[code == http.StatusUnauthorized]; got != want {
					t.Errorf("WWW-Authenticate = %q, want %q", got, want)
				}
				changed := inst.role() != RoleReplica
				if changed != (tc.wantCode == http.StatusOK) {
					t.Errorf("instance role = %s after a %d", inst.role(), code)
				}
				if code != http.StatusOK {
					var e errorBody
					if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
						t.Errorf("body %q is not a JSON error", body)
					}
					if strings.Contains(body, testToken) {
						t.Errorf("body %q contains the token", body)
					}
				}
			})
		}
	}
}

func TestMethods(t *testing.T) {
	for _, tc := range []struct {
		name      string
		method    string
		path      string
		wantCode  int
		wantAllow string
	}{
		{name: "get promote", method: http.MethodGet, path: PathPromote, wantCode: http.StatusMethodNotAllowed, wantAllow: "POST"},
		{name: "put fence", method: http.MethodPut, path: PathFence, wantCode: http.StatusMethodNotAllowed, wantAllow: "POST"},
		{name: "delete demote", method: http.MethodDelete, path: PathDemote, wantCode: http.StatusMethodNotAllowed, wantAllow: "POST"},
		{name: "post status", method: http.MethodPost, path: PathStatus, wantCode: http.StatusMethodNotAllowed, wantAllow: "GET, HEAD"},
		{name: "post readyz", method: http.MethodPost, path: PathReadyz, wantCode: http.StatusMethodNotAllowed, wantAllow: "GET, HEAD"},
		{name: "post metrics", method: http.MethodPost, path: PathMetrics, wantCode: http.StatusMethodNotAllowed, wantAllow: "GET, HEAD"},
		{name: "unknown path", method: http.MethodPost, path: "/reboot", wantCode: http.StatusNotFound},
		{name: "get restart", method: http.MethodGet, path: PathRestart, wantCode: http.StatusMethodNotAllowed, wantAllow: "POST"},
		{name: "subpath", method: http.MethodPost, path: PathPromote + "/now", wantCode: http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := newFakeInstance(replicaStatus())
			code, header, _ := request(t, tc.method, serve(t, inst, ServerOptions{Token: testToken})+tc.path, "Bearer "+testToken)
			if code != tc.wantCode {
				t.Errorf("code = %d, want %d", code, tc.wantCode)
			}
			if got := header.Get("Allow"); got != tc.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tc.wantAllow)
			}
			if inst.role() != RoleReplica {
				t.Errorf("instance role = %s, want it untouched", inst.role())
			}
		})
	}
}

func TestMutatingResults(t *testing.T) {
	for _, tc := range []struct {
		name      string
		path      string
		actionErr error
		wantCode  int
		wantBody  *Status // the JSON Status, on success
		wantError string  // the JSON error, on failure
	}{
		{
			name: "promote", path: PathPromote, wantCode: http.StatusOK,
			wantBody: func() *Status { s := replicaStatus(); s.Role, s.Timeline = RolePrimary, 4; return &s }(),
		},
		{
			name: "fence", path: PathFence, wantCode: http.StatusOK,
			wantBody: func() *Status { s := replicaStatus(); s.Role, s.Fenced = RoleFenced, true; return &s }(),
		},
		{
			name: "demote", path: PathDemote, wantCode: http.StatusOK,
			wantBody: func() *Status {
				s := replicaStatus()
				s.Role, s.Running, s.Ready = RoleStopped, false, false
				return &s
			}(),
		},
		{
			name: "conflict", path: PathPromote, wantCode: http.StatusConflict,
			actionErr: fmt.Errorf("promote while cloning: %w", ErrConflict),
			wantError: "promote while cloning: not possible in the instance's current state",
		},
		{
			name: "failure", path: PathDemote, wantCode: http.StatusInternalServerError,
			actionErr: errors.New("pg_ctl stop: exit status 1"),
			wantError: "pg_ctl stop: exit status 1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := newFakeInstance(replicaStatus())
			inst.actionErr = tc.actionErr
			code, header, body := request(t, http.MethodPost, serve(t, inst, ServerOptions{Token: testToken})+tc.path, "Bearer "+testToken)
			if code != tc.wantCode {
				t.Fatalf("code = %d, want %d; body %q", code, tc.wantCode, body)
			}
			if ct := header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if tc.wantBody != nil {
				var got Status
				if err := json.Unmarshal([]byte(body), &got); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(*tc.wantBody, got); diff != "" {
					t.Errorf("status after (-want +got):\n%s", diff)
				}
			} else {
				var got errorBody
				if err := json.Unmarshal([]byte(body), &got); err != nil {
					t.Fatal(err)
				}
				if got.Error != tc.wantError {
					t.Errorf("error = %q, want %q", got.Error, tc.wantError)
				}
			}
		})
	}
}

func TestMutatingCallsAreLoggedWithoutToken(t *testing.T) {
	rec, logger := newLogRecorder()
	inst := newFakeInstance(replicaStatus())
	url := serve(t, inst, ServerOptions{Token: testToken, Logger: logger})

	const wrong = "wrong-but-maybe-someone-elses-token"
	for _, tc := range []struct {
		name          string
		path          string
		authorization string
		actionErr     error
		wantResult    string
	}{
		{name: "missing", path: PathFence, wantResult: "missing bearer token"},
		{name: "wrong", path: PathFence, authorization: "Bearer " + wrong, wantResult: "wrong bearer token"},
		{name: "basic", path: PathFence, authorization: "Basic " + wrong, wantResult: "authorization is not a bearer token"},
		{name: "ok", path: PathPromote, authorization: "Bearer " + testToken, wantResult: "ok"},
		{name: "conflict", path: PathDemote, authorization: "Bearer " + testToken, actionErr: ErrConflict, wantResult: "conflict"},
		{name: "error", path: PathFence, authorization: "Bearer " + testToken, actionErr: errors.New("boom"), wantResult: "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst.mu.Lock()
			inst.actionErr = tc.actionErr
			inst.mu.Unlock()
			want := map[string]any{"action": strings.TrimPrefix(tc.path, "/"), "result": tc.wantResult}
			before := len(rec.find(want))
			request(t, http.MethodPost, url+tc.path, tc.authorization)

			found := rec.find(want)
			if len(found) != before+1 {
				t.Fatalf("want one more entry with action %s and result %q, log:\n%s", tc.path, tc.wantResult, strings.Join(rec.all(), "\n"))
			}
			if addr, _ := found[len(found)-1]["remoteAddr"].(string); !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Errorf("remoteAddr = %q", addr)
			}
		})
	}

	for _, e := range rec.all() {
		for _, secret := range []string{testToken, wrong, "Authorization"} {
			if strings.Contains(e, secret) {
				t.Errorf("log entry contains %q: %s", secret, e)
			}
		}
	}
}

func TestNoTokenIsLoggedAtStart(t *testing.T) {
	rec, logger := newLogRecorder()
	NewServer(newFakeInstance(Status{}), ServerOptions{Logger: logger})
	if len(rec.find(map[string]any{"msg": "No API token configured: every call but the probes will be refused"})) != 1 {
		t.Errorf("want a warning about the missing token, log:\n%s", strings.Join(rec.all(), "\n"))
	}
}

func TestRequestDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   ServerOptions
		method string
		path   string
		call   string // the Instance method the request reaches
		want   time.Duration
	}{
		{name: "status default", method: http.MethodGet, path: PathStatus, call: "status", want: DefaultRequestTimeout},
		{name: "readyz default", method: http.MethodGet, path: PathReadyz, call: "ready", want: DefaultRequestTimeout},
		{name: "promote default", method: http.MethodPost, path: PathPromote, call: "promote", want: DefaultActionTimeout},
		{name: "fence set", opts: ServerOptions{ActionTimeout: 7 * time.Second}, method: http.MethodPost, path: PathFence, call: "fence", want: 7 * time.Second},
		{name: "status set", opts: ServerOptions{RequestTimeout: 3 * time.Second}, method: http.MethodGet, path: PathStatus, call: "status", want: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := newFakeInstance(replicaStatus())
			tc.opts.Token = testToken
			request(t, tc.method, serve(t, inst, tc.opts)+tc.path, "Bearer "+testToken)
			// Generous lower bound: the request itself took some of the time.
			if got := inst.deadline(tc.call); got <= tc.want-2*time.Second || got > tc.want {
				t.Errorf("%s got a context with %v left, want a little under %v", tc.call, got, tc.want)
			}
		})
	}
}

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunStopsWhenContextEnds(t *testing.T) {
	rec, logger := newLogRecorder()
	s := NewServer(newFakeInstance(replicaStatus()), ServerOptions{Logger: logger})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, "127.0.0.1:0") }()

	var addr string
	eventually(t, "the server to start", func() bool {
		for _, e := range rec.find(map[string]any{"msg": "Started serving the agent API"}) {
			addr, _ = e["address"].(string)
		}
		return addr != ""
	})
	if code, _, body := request(t, http.MethodGet, "http://"+addr+PathHealthz, ""); code != http.StatusOK {
		t.Fatalf("healthz = %d %q", code, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if resp, err := http.Get("http://" + addr + PathHealthz); err == nil {
		resp.Body.Close()
		t.Error("the server still answers after Run returned")
	}
}

func TestRunFailsWhenAddressIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = NewServer(newFakeInstance(Status{}), ServerOptions{}).Run(context.Background(), l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "listen for the agent API") {
		t.Errorf("Run = %v, want a listen error", err)
	}
}

func TestServeLetsRequestsInFlightFinish(t *testing.T) {
	inst := newFakeInstance(replicaStatus())
	inst.entered = make(chan string, 1)
	inst.release = make(chan struct{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- NewServer(inst, ServerOptions{Token: testToken}).Serve(ctx, l) }()

	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+PathPromote, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-inst.entered

	cancel()
	// Shutdown has begun once the listener refuses new connections.
	eventually(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a request was in flight", err)
	default:
	}

	close(inst.release)
	if code := <-answered; code != http.StatusOK {
		t.Errorf("in-flight promote = %d, want 200", code)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if inst.role() != RolePrimary {
		t.Errorf("role = %s, want the promotion done", inst.role())
	}
}
