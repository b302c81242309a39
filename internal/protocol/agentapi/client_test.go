package agentapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestClientStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status Status
		suffix string // appended to the base URL
	}{
		{name: "replica", status: replicaStatus()},
		{name: "primary with replicas", status: primaryStatus()},
		{name: "empty", status: Status{}},
		{name: "base URL with a trailing slash", status: replicaStatus(), suffix: "/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClient(serve(t, newFakeInstance(tc.status), ServerOptions{Token: testToken})+tc.suffix, testToken, nil)
			got, err := c.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.status, got); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClientActions(t *testing.T) {
	promote := (*Client).Promote
	fence := (*Client).Fence
	demote := (*Client).Demote
	for _, tc := range []struct {
		name         string
		call         func(*Client, context.Context) (Status, error)
		serverToken  string
		clientToken  string
		actionErr    error
		wantRole     string // in the Status returned, on success
		wantCode     int    // of the HTTPError, on failure
		wantMessage  string
		wantConflict bool
	}{
		{name: "promote", call: promote, serverToken: testToken, clientToken: testToken, wantRole: RolePrimary},
		{name: "fence", call: fence, serverToken: testToken, clientToken: testToken, wantRole: RoleFenced},
		{name: "demote", call: demote, serverToken: testToken, clientToken: testToken, wantRole: RoleStopped},
		{
			name: "conflict", call: promote, serverToken: testToken, clientToken: testToken,
			actionErr: fmt.Errorf("still cloning: %w", ErrConflict),
			wantCode:  http.StatusConflict, wantMessage: "still cloning: " + ErrConflict.Error(), wantConflict: true,
		},
		{
			name: "failure", call: fence, serverToken: testToken, clientToken: testToken,
			actionErr: errors.New("could not reach postgres"),
			wantCode:  http.StatusInternalServerError, wantMessage: "could not reach postgres",
		},
		{name: "wrong token", call: promote, serverToken: testToken, clientToken: "other", wantCode: http.StatusUnauthorized, wantMessage: "wrong bearer token"},
		{name: "no client token", call: demote, serverToken: testToken, wantCode: http.StatusUnauthorized, wantMessage: "missing bearer token"},
		{
			name: "no server token", call: fence, clientToken: testToken,
			wantCode: http.StatusUnauthorized, wantMessage: "wrong bearer token",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := newFakeInstance(replicaStatus())
			inst.actionErr = tc.actionErr
			c := NewClient(serve(t, inst, ServerOptions{Token: tc.serverToken}), tc.clientToken, nil)

			got, err := tc.call(c, context.Background())
			if tc.wantCode == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if got.Role != tc.wantRole || inst.role() != tc.wantRole {
					t.Errorf("role = %s (instance %s), want %s", got.Role, inst.role(), tc.wantRole)
				}
				return
			}
			var herr *HTTPError
			if !errors.As(err, &herr) {
				t.Fatalf("error = %v, want an *HTTPError", err)
			}
			if herr.StatusCode != tc.wantCode || herr.Message != tc.wantMessage {
				t.Errorf("error = %d %q, want %d %q", herr.StatusCode, herr.Message, tc.wantCode, tc.wantMessage)
			}
			if errors.Is(err, ErrConflict) != tc.wantConflict {
				t.Errorf("errors.Is(%v, ErrConflict) = %t, want %t", err, !tc.wantConflict, tc.wantConflict)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Errorf("error %q contains the token", err)
			}
			if diff := cmp.Diff(Status{}, got); diff != "" {
				t.Errorf("status on error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClientErrorsFromOtherServers(t *testing.T) {
	for _, tc := range []struct {
		name        string
		handler     http.HandlerFunc
		wantCode    int // of the HTTPError; 0 for another error
		wantMessage string
	}{
		{
			name: "plain text error",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "upstream connect error", http.StatusBadGateway)
			},
			wantCode: http.StatusBadGateway, wantMessage: "upstream connect error",
		},
		{
			name: "JSON without an error field",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"reason":"x"}`)
			},
			wantCode: http.StatusServiceUnavailable, wantMessage: `{"reason":"x"}`,
		},
		{
			name: "huge error body",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = io.WriteString(w, strings.Repeat("x", 1<<20))
			},
			wantCode: http.StatusInternalServerError, wantMessage: strings.Repeat("x", maxErrorBody),
		},
		{
			name: "not JSON",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, "<html>hello</html>")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.handler)
			defer ts.Close()
			_, err := NewClient(ts.URL, "", nil).Status(context.Background())
			if err == nil {
				t.Fatal("want an error")
			}
			var herr *HTTPError
			if isHTTP := errors.As(err, &herr); isHTTP != (tc.wantCode != 0) {
				t.Fatalf("error = %v (%T)", err, err)
			}
			if herr != nil && (herr.StatusCode != tc.wantCode || herr.Message != tc.wantMessage) {
				t.Errorf("error = %d %.40q, want %d %.40q", herr.StatusCode, herr.Message, tc.wantCode, tc.wantMessage)
			}
		})
	}
}

func TestClientUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = NewClient("http://"+addr, testToken, nil).Promote(context.Background())
	var herr *HTTPError
	if err == nil || errors.As(err, &herr) {
		t.Errorf("error = %v, want a connection error", err)
	}
}

// roundTripFunc is an http.RoundTripper that answers every request itself.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func okResponse(r *http.Request) *http.Response {
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"application/json"}},
		Body:       io.NopCloser(strings.NewReader(`{"pod":"my-db-0","role":"primary"}`)),
		Request:    r,
	}
}

func TestClientDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name     string
		call     func(*Client, context.Context) (Status, error)
		deadline time.Duration // on the caller's ctx; 0 for none
		want     time.Duration
	}{
		{name: "status default", call: (*Client).Status, want: DefaultStatusTimeout},
		{name: "status with the caller's deadline", call: (*Client).Status, deadline: time.Hour, want: time.Hour},
		{name: "promote default", call: (*Client).Promote, want: DefaultActionTimeout + 5*time.Second},
		{name: "fence with the caller's deadline", call: (*Client).Fence, deadline: 3 * time.Second, want: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var left time.Duration
			c := NewClient("http://agent", testToken, &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if d, ok := r.Context().Deadline(); ok {
					left = time.Until(d)
				}
				return okResponse(r), nil
			})})
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			if _, err := tc.call(c, ctx); err != nil {
				t.Fatal(err)
			}
			if left <= tc.want-time.Second || left > tc.want {
				t.Errorf("request had %v left, want a little under %v", left, tc.want)
			}
		})
	}
}

func TestClientRequests(t *testing.T) {
	for _, tc := range []struct {
		name     string
		token    string
		call     func(*Client, context.Context) (Status, error)
		wantReq  string // method and URL
		wantAuth string
	}{
		{name: "status", token: testToken, call: (*Client).Status, wantReq: "GET https://agent:8008/status", wantAuth: "Bearer " + testToken},
		{name: "promote", token: testToken, call: (*Client).Promote, wantReq: "POST https://agent:8008/promote", wantAuth: "Bearer " + testToken},
		{name: "fence", token: testToken, call: (*Client).Fence, wantReq: "POST https://agent:8008/fence", wantAuth: "Bearer " + testToken},
		{name: "demote", token: testToken, call: (*Client).Demote, wantReq: "POST https://agent:8008/demote", wantAuth: "Bearer " + testToken},
		{name: "no token, no header", call: (*Client).Demote, wantReq: "POST https://agent:8008/demote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotReq, gotAuth string
			c := NewClient(BaseURL("agent"), tc.token, &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				gotReq, gotAuth = r.Method+" "+r.URL.String(), r.Header.Get("Authorization")
				return okResponse(r), nil
			})})
			if _, err := tc.call(c, context.Background()); err != nil {
				t.Fatal(err)
			}
			if gotReq != tc.wantReq || gotAuth != tc.wantAuth {
				t.Errorf("request %q with Authorization %q, want %q with %q", gotReq, gotAuth, tc.wantReq, tc.wantAuth)
			}
		})
	}
}

// TestClientReusesConnections: polling every second must not open a connection per poll.
func TestClientReusesConnections(t *testing.T) {
	var conns atomic.Int32
	ts := httptest.NewUnstartedServer(NewServer(newFakeInstance(primaryStatus()), ServerOptions{Token: testToken}).Handler())
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	defer ts.Close()

	c := NewClient(ts.URL, testToken, nil)
	for i := 0; i < 20; i++ {
		if _, err := c.Status(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Fence(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A second Client of the same agent shares the transport too.
	if _, err := NewClient(ts.URL, testToken, nil).Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 22 sequential calls, want 1", n)
	}
}

func TestBaseURL(t *testing.T) {
	for _, tc := range []struct {
		name string
		host string
		want string
	}{
		{name: "IPv4", host: "10.244.0.17", want: "https://10.244.0.17:8008"},
		{name: "IPv6", host: "fd00:10:244::11", want: "https://[fd00:10:244::11]:8008"},
		{name: "host name", host: "my-db-0.my-db.default.svc", want: "https://my-db-0.my-db.default.svc:8008"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BaseURL(tc.host); got != tc.want {
				t.Errorf("BaseURL(%q) = %q, want %q", tc.host, got, tc.want)
			}
		})
	}
}
