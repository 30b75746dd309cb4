package client

import (
	"context"
	"net/http"

	"github.com/paddock-dev/paddock/api"
)

// Nodes lists a cluster's nodes as its gateway sees them (GET /v1/nodes;
// a single daemon has no such route).
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out []api.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", nil, &out)
}
