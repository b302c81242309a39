package agentapi

import (
	"context"
	"net/http"
	"time"
)

// PathPoolerPause is the pooler agent's pause endpoint (docs/pooler.md): a primary's
// agent, before it hands over, asks each pooler pod to hold its clients' queries, with
// the agents' peer token.
const PathPoolerPause = "/pause"

// PoolerPauseRequest is the body of a pause: hold queries while the primary Lease names
// Primary in Term (a pooler resumes on its own after a while, should the handover be
// abandoned).
type PoolerPauseRequest struct {
	Primary string `json:"primary"`
	Term    int32  `json:"term"`
}

// PoolerStatus is a pooler agent's answer to a pause and to GET /status.
type PoolerStatus struct {
	// Pool is "rw" or "ro".
	Pool string `json:"pool"`
	// Primary is the instance the read-write pool sends queries to.
	Primary string `json:"primary,omitempty"`
	Paused  bool   `json:"paused"`
	Held    bool   `json:"held"`
	Ready   bool   `json:"ready"`
}

// PausePooler asks the pooler agent at c's base URL to hold its clients' queries for
// req's primary; it returns once the pool is paused (the transactions in flight ended).
func (c *Client) PausePooler(ctx context.Context, req PoolerPauseRequest) (PoolerStatus, error) {
	var st PoolerStatus
	err := c.do(ctx, http.MethodPost, c.base+PathPoolerPause, req, &st, 2*time.Second)
	return st, err
}
