package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/api"
)

// Nodes lists a cluster's nodes as its gateway sees them (GET /v1/nodes;
// a single daemon has no such route).
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out []api.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", nil, &out)
}

// DrainNode marks the node named name draining, through a cluster's
// gateway (started with --cluster): no new sandboxes are placed on it,
// and those it holds keep serving. With draining false it takes creates
// again. It returns the node as the gateway sees it afterwards.
func (c *Client) DrainNode(ctx context.Context, name string, draining bool) (api.Node, error) {
	verb := "/undrain"
	if draining {
		verb = "/drain"
	}
	var out api.Node
	return out, c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(name)+verb, nil, &out)
}
