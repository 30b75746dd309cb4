package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/paddock-dev/paddock/api"
)

// Requests lists egress requests: sandbox's (every sandbox's when
// empty), only those in state when it is not empty ("pending", ...).
func (c *Client) Requests(ctx context.Context, sandbox, state string) ([]api.EgressRequest, error) {
	path := "/v1/requests"
	if sandbox != "" {
		path = "/v1/sandboxes/" + url.PathEscape(sandbox) + "/requests"
	}
	if state != "" {
		path += "?state=" + url.QueryEscape(state)
	}
	var out []api.EgressRequest
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// ApproveRequest approves an egress request (its id is SANDBOX.N): the
// sandbox may reach its host at once, for d's duration, once, or (with
// neither) for the sandbox's life.
func (c *Client) ApproveRequest(ctx context.Context, id string, d api.RequestDecision) (*api.EgressRequest, error) {
	return c.decide(ctx, id, "approve", d)
}

// DenyRequest denies an egress request, or revokes its approval.
func (c *Client) DenyRequest(ctx context.Context, id, note string) (*api.EgressRequest, error) {
	return c.decide(ctx, id, "deny", api.RequestDecision{Note: note})
}

func (c *Client) decide(ctx context.Context, id, verb string, d api.RequestDecision) (*api.EgressRequest, error) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return nil, fmt.Errorf("%w: %q is not a request id (SANDBOX.N)", ErrInvalid, id)
	}
	var out api.EgressRequest
	path := "/v1/sandboxes/" + url.PathEscape(id[:i]) + "/requests/" + url.PathEscape(id) + "/" + verb
	return &out, c.do(ctx, http.MethodPost, path, d, &out)
}
