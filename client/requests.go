package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/api"
)

// Requests lists egress requests: sandbox's (every sandbox's when
// empty), only those in state when it is not empty ("pending", ...).
func (c *Client) Requests(ctx context.Context, sandbox, state string) ([]api.EgressRequest, error) {
	list, _, _, err := c.GatheredRequests(ctx, sandbox, state)
	return list, err
}

// GatheredRequests is Requests that also says, when c calls a cluster's
// gateway, which nodes did not answer (their sandboxes' requests are not
// in the list) and how many of the oldest requests the gateway left out
// to bound its answer. A daemon answers with neither.
func (c *Client) GatheredRequests(ctx context.Context, sandbox, state string) (_ []api.EgressRequest, missing []string, leftOut int, _ error) {
	path := "/v1/requests"
	if sandbox != "" {
		path = "/v1/sandboxes/" + url.PathEscape(sandbox) + "/requests"
	}
	if state != "" {
		path += "?state=" + url.QueryEscape(state)
	}
	var out []api.EgressRequest
	h, err := c.doHeader(ctx, http.MethodGet, path, nil, &out)
	if err != nil {
		return nil, nil, 0, err
	}
	if m := h.Get(MissingNodesHeader); m != "" {
		missing = strings.Split(m, ", ")
	}
	leftOut, _ = strconv.Atoi(h.Get(LeftOutHeader))
	return out, missing, leftOut, nil
}

// MissingNodesHeader and LeftOutHeader are how a cluster's gateway says
// that a list it gathered from its nodes is not whole: the nodes that did
// not answer, and how many items it left out to bound the answer.
const (
	MissingNodesHeader = "Paddock-Missing-Nodes"
	LeftOutHeader      = "Paddock-Left-Out"
)

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
