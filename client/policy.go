package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/api"
)

// Policy returns a sandbox's network policy.
func (c *Client) Policy(ctx context.Context, id string) (*api.Policy, error) {
	var p api.Policy
	return &p, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/policy", nil, &p)
}

// SetPolicy replaces a sandbox's network policy; new connections follow it.
func (c *Client) SetPolicy(ctx context.Context, id string, p api.Policy) (*api.Policy, error) {
	var out api.Policy
	return &out, c.do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/policy", p, &out)
}

// CreateSecret stores a secret; sandboxes get it through policy bindings
// and never see its value.
func (c *Client) CreateSecret(ctx context.Context, name, value string) error {
	return c.do(ctx, http.MethodPost, "/v1/secrets", api.SecretRequest{Name: name, Value: value}, nil)
}

// Secrets lists the stored secrets' names.
func (c *Client) Secrets(ctx context.Context) ([]api.Secret, error) {
	var out []api.Secret
	return out, c.do(ctx, http.MethodGet, "/v1/secrets", nil, &out)
}

// DeleteSecret removes a secret.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil)
}
