package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Client defaults and limits.
const (
	// DefaultStatusTimeout bounds Client.Status when the caller's context has no deadline.
	DefaultStatusTimeout = 2 * time.Second
	// defaultClientActionTimeout bounds Promote, Fence and Demote when the caller's context
	// has no deadline: a little longer than the server's own bound, so the server's answer
	// (and its error message) arrives before the client gives up.
	defaultClientActionTimeout = DefaultActionTimeout + 5*time.Second

	maxStatusBody = 1 << 20
	maxErrorBody  = 4 << 10
)

// defaultHTTPClient is shared by every Client made without one, so that polling many
// agents reuses one transport and its idle connections.
var defaultHTTPClient = &http.Client{}

// Client calls one agent's API. It is safe for concurrent use; make one per agent and
// keep it.
type Client struct {
	base                                       string
	statusURL, promoteURL, fenceURL, demoteURL string
	freezeURL, confirmURL, restartURL          string

	token string
	http  *http.Client

	statusTimeout time.Duration
	actionTimeout time.Duration
}

// NewClient returns a client of the agent at baseURL (e.g. BaseURL(pod.Status.PodIP)),
// sending token on mutating calls. A nil httpClient means a transport shared by all such
// Clients.
func NewClient(baseURL, token string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = defaultHTTPClient
	}
	base := strings.TrimRight(baseURL, "/")
	return &Client{
		base:          base,
		statusURL:     base + PathStatus,
		promoteURL:    base + PathPromote,
		fenceURL:      base + PathFence,
		demoteURL:     base + PathDemote,
		freezeURL:     base + PathFreeze,
		confirmURL:    base + PathConfirm,
		restartURL:    base + PathRestart,
		token:         token,
		http:          httpClient,
		statusTimeout: DefaultStatusTimeout,
		actionTimeout: defaultClientActionTimeout,
	}
}

// Status returns the instance as its agent reports it. Without a deadline on ctx it gives
// up after DefaultStatusTimeout.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodGet, c.statusURL, c.statusTimeout)
}

// Promote asks the agent to promote its replica, and returns the Status after.
func (c *Client) Promote(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, c.promoteURL, c.actionTimeout)
}

// Fence asks the agent to make its primary stop accepting writes, and returns the
// Status after.
func (c *Client) Fence(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, c.fenceURL, c.actionTimeout)
}

// Demote asks the agent to stop its primary cleanly for a switchover, and returns the
// Status after.
func (c *Client) Demote(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, c.demoteURL, c.actionTimeout)
}

// Freeze asks a standby's agent to stop receiving WAL, and returns the Status after
// (its final position).
func (c *Client) Freeze(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, c.freezeURL, c.actionTimeout)
}

// Restart asks the agent to restart postgres in place (a standby, or the primary of a
// single-instance cluster), and returns the Status after; an error matching
// ErrConflict when the instance cannot be restarted so now.
func (c *Client) Restart(ctx context.Context) (Status, error) {
	return c.call(ctx, http.MethodPost, c.restartURL, c.actionTimeout)
}

// Confirm asks a standby whether it still follows req.Primary in req.Term; an error
// matching ErrConflict means it does not.
func (c *Client) Confirm(ctx context.Context, req ConfirmRequest) error {
	var ok struct{}
	return c.do(ctx, http.MethodPost, c.confirmURL, req, &ok, c.statusTimeout)
}

// HTTPError is an answer of the agent other than 200. For a 409 it matches ErrConflict
// with errors.Is.
type HTTPError struct {
	// Method and URL of the request.
	Method string
	URL    string
	// StatusCode is the HTTP status code of the answer.
	StatusCode int
	// Message is the server's error message.
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("agent %s %s: %d %s: %s", e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Is reports whether e is a 409 and target ErrConflict, or a 404 and target ErrNotFound.
func (e *HTTPError) Is(target error) bool {
	return (target == ErrConflict && e.StatusCode == http.StatusConflict) ||
		(target == ErrNotFound && e.StatusCode == http.StatusNotFound)
}

func (c *Client) call(ctx context.Context, method, url string, defaultTimeout time.Duration) (Status, error) {
	var st Status
	err := c.do(ctx, method, url, nil, &st, defaultTimeout)
	return st, err
}

// do sends body (JSON, when not nil) and decodes a 2xx answer into out.
func (c *Client) do(ctx context.Context, method, url string, body, out any, defaultTimeout time.Duration) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTimeout)
		defer cancel()
	}
	var reqBody io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("agent %s %s: %w", method, url, err)
		}
		reqBody = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, reqBody)
	if err != nil {
		return fmt.Errorf("agent %s %s: %w", method, url, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err // *url.Error: names method and URL, wraps the cause
	}
	defer func() {
		// Drain what is left so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxStatusBody))
		_ = resp.Body.Close()
	}()

	if resp.StatusCode/100 != 2 {
		return &HTTPError{
			Method:     method,
			URL:        url,
			StatusCode: resp.StatusCode,
			Message:    errorMessage(io.LimitReader(resp.Body, maxErrorBody)),
		}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBody)).Decode(out); err != nil {
		return fmt.Errorf("agent %s %s: decode the answer: %w", method, url, err)
	}
	return nil
}

// errorMessage is the "error" of a JSON error body, or else the body as text.
func errorMessage(body io.Reader) string {
	b, err := io.ReadAll(body)
	if err != nil && len(b) == 0 {
		return "read the answer: " + err.Error()
	}
	var e errorBody
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(b))
}
