package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/api"
)

// BuildOptions configure a template build from a build context.
type BuildOptions struct {
	// File names the spec in the context; default paddock.yaml.
	File string
	// Name overrides the spec's name.
	Name string
	// Progress receives each line of the build's log as it arrives.
	Progress func(api.TemplateEvent)
}

// BuildTemplate builds a template from a spec whose copy steps carry
// their content inline.
func (c *Client) BuildTemplate(ctx context.Context, spec api.TemplateSpec, progress func(api.TemplateEvent)) (*api.Template, error) {
	req, err := c.newRequest(ctx, http.MethodPost, "/v1/templates", spec)
	if err != nil {
		return nil, err
	}
	return c.build(req, progress)
}

// BuildTemplateContext builds a template from a tar build context that
// holds the spec and the files its copy steps name.
func (c *Client) BuildTemplateContext(ctx context.Context, tarball io.Reader, opts BuildOptions) (*api.Template, error) {
	q := url.Values{}
	if opts.File != "" {
		q.Set("file", opts.File)
	}
	if opts.Name != "" {
		q.Set("name", opts.Name)
	}
	path := "/v1/templates"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := c.newRequest(ctx, http.MethodPost, path, nil)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(tarball)
	req.Header.Set("Content-Type", "application/x-tar")
	return c.build(req, opts.Progress)
}

// build sends a build request and follows its log to the end.
func (c *Client) build(req *http.Request, progress func(api.TemplateEvent)) (*api.Template, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, readError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e api.TemplateEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("decoding the build log: %w", err)
		}
		if progress != nil {
			progress(e)
		}
		switch {
		case e.Error != nil:
			return nil, &Error{Status: http.StatusOK, Code: e.Error.Code, Message: e.Error.Message}
		case e.Template != nil:
			return e.Template, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the build log: %w", err)
	}
	return nil, errors.New("the build log ended without a result")
}

// Templates lists the templates.
func (c *Client) Templates(ctx context.Context) ([]api.Template, error) {
	var out []api.Template
	return out, c.do(ctx, http.MethodGet, "/v1/templates", nil, &out)
}

// GetTemplate describes one template.
func (c *Client) GetTemplate(ctx context.Context, name string) (*api.Template, error) {
	var t api.Template
	return &t, c.do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, &t)
}

// DeleteTemplate removes a template, its warm pool and the step snapshots
// no other template uses.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil)
}

// Pools reports the warm pools.
func (c *Client) Pools(ctx context.Context) (*api.Pools, error) {
	var p api.Pools
	return &p, c.do(ctx, http.MethodGet, "/v1/pools", nil, &p)
}

// SetPool keeps size sandboxes ready in the pool name ("image:NAME" or
// "template:NAME"); size 0 removes the pool.
func (c *Client) SetPool(ctx context.Context, name string, size int) (*api.Pool, error) {
	var p api.Pool
	return &p, c.do(ctx, http.MethodPut, "/v1/pools", api.PoolRequest{Name: name, Size: size}, &p)
}
