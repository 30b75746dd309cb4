// Package client is paddock's Go SDK: a typed client of the daemon's /v1
// API. The paddock CLI is built on it.
//
//	c, err := client.FromEnv()
//	sb, err := c.Create(ctx, api.CreateRequest{})
//	st, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}}, client.ExecIO{Stdout: os.Stdout})
//	err = c.Delete(ctx, sb.ID, true)
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Error categories: test with errors.Is(err, client.ErrNotFound).
var (
	ErrNotFound    = errdefs.ErrNotFound
	ErrInvalid     = errdefs.ErrInvalid
	ErrConflict    = errdefs.ErrConflict
	ErrDenied      = errdefs.ErrDenied
	ErrUnavailable = errdefs.ErrUnavailable
	ErrTooLarge    = errdefs.ErrTooLarge
	ErrTooMany     = errdefs.ErrTooMany
	ErrNoSpace     = errdefs.ErrNoSpace
)

// DefaultHost is where the daemon listens by default.
const DefaultHost = "unix:///run/paddock/paddock.sock"

// Error is an error answer from the daemon.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the error's category sentinel.
func (e *Error) Unwrap() error { return errdefs.FromCode(e.Code) }

// Client talks to one daemon.
type Client struct {
	base  string // scheme://authority, no trailing slash
	token string
	name  string // sent as Paddock-Client
	http  *http.Client
	tr    *transport
	lanes lanes
	dial  func(ctx context.Context) (net.Conn, error)
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends token as a bearer token (required on TCP listeners).
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithName names the client to the daemon (Paddock-Client: "cli",
// "console"), for the audit of what it decides.
func WithName(name string) Option { return func(c *Client) { c.name = name } }

// New returns a client for host: "unix:///path/to.sock" or
// "tcp://HOST:PORT" (also accepted: http://HOST:PORT).
func New(host string, opts ...Option) (*Client, error) {
	c := &Client{}
	switch {
	case strings.HasPrefix(host, "unix://"):
		path := strings.TrimPrefix(host, "unix://")
		if path == "" {
			return nil, fmt.Errorf("%w: host %q has no socket path", ErrInvalid, host)
		}
		c.base = "http://paddock"
		c.dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	case strings.HasPrefix(host, "tcp://"), strings.HasPrefix(host, "http://"):
		u, err := url.Parse(host)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: host %q is not tcp://HOST:PORT", ErrInvalid, host)
		}
		addr := u.Host
		c.base = "http://" + addr
		c.dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	default:
		return nil, fmt.Errorf("%w: host %q must start with unix:// or tcp://", ErrInvalid, host)
	}
	c.tr = &transport{dial: c.dial, fallback: &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
		MaxIdleConnsPerHost: 64,
		DisableCompression:  true,
	}}
	c.http = &http.Client{Transport: c.tr}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// FromEnv returns a client for $PADDOCK_HOST (default DefaultHost) with
// the token in $PADDOCK_TOKEN, if set.
func FromEnv() (*Client, error) {
	host := os.Getenv("PADDOCK_HOST")
	if host == "" {
		host = DefaultHost
	}
	var opts []Option
	if t := os.Getenv("PADDOCK_TOKEN"); t != "" {
		opts = append(opts, WithToken(t))
	}
	return New(host, opts...)
}

// Close releases idle connections.
func (c *Client) Close() {
	c.tr.close()
	c.lanes.closeIdle()
}

func (c *Client) newRequest(ctx context.Context, method, path string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+inContainer(ctx, path), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.name != "" {
		req.Header.Set("Paddock-Client", c.name)
	}
	return req, nil
}

// do sends a request and decodes a JSON answer into out (if non-nil).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	_, err := c.doHeader(ctx, method, path, body, out)
	return err
}

// doHeader is do that returns the answer's header too.
func (c *Client) doHeader(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return resp.Header, readError(resp)
	}
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return resp.Header, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.Header, fmt.Errorf("decoding %s %s answer: %w", method, path, err)
	}
	// Read to the end (the newline after the JSON), so that the
	// connection is kept for the next request.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return resp.Header, nil
}

func readError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e api.Error
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = resp.Status
		}
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	return &Error{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return "not_found"
	case http.StatusBadRequest:
		return "invalid_argument"
	case http.StatusConflict:
		return "conflict"
	case http.StatusUnauthorized, http.StatusForbidden:
		return "permission_denied"
	case http.StatusServiceUnavailable:
		return "unavailable"
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	case http.StatusInsufficientStorage:
		return "no_space"
	}
	return "internal"
}

// Version returns the daemon's version information.
func (c *Client) Version(ctx context.Context) (*api.VersionInfo, error) {
	var v api.VersionInfo
	return &v, c.do(ctx, http.MethodGet, "/v1/version", nil, &v)
}

// Create creates a sandbox and returns it running.
func (c *Client) Create(ctx context.Context, req api.CreateRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes", req, &sb)
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, &sb)
}

// ListOptions filters List.
type ListOptions struct {
	Labels map[string]string
	State  api.State
}

// List returns the sandboxes matching opts.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", string(opts.State))
	}
	for k, v := range opts.Labels {
		q.Add("label", k+"="+v)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []api.Sandbox
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// Delete removes a sandbox; a running one only with force.
func (c *Client) Delete(ctx context.Context, id string, force bool) error {
	path := "/v1/sandboxes/" + url.PathEscape(id)
	if force {
		path += "?force=true"
	}
	err := c.do(ctx, http.MethodDelete, path, nil, nil)
	if err == nil {
		c.lanes.drop(id)
	}
	return err
}

// Stop ends a sandbox's processes and keeps its filesystem.
func (c *Client) Stop(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "stop")
}

// Update changes a running sandbox's limits (and budget or autoscale
// bounds) in place.
func (c *Client) Update(ctx context.Context, id string, req api.UpdateRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/update", req, &sb)
}

// Pause hibernates a sandbox: its processes end, its memory and CPU are
// released, its files, environment and limits are kept.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "pause")
}

// Resume starts a paused or stopped sandbox again with the same id (or
// thaws a frozen one).
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "resume")
}

// Archive moves a paused sandbox's disk to the cluster's object store:
// it can then be resumed on any node, with the same id.
func (c *Client) Archive(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "archive")
}

// Freeze stops a sandbox's processes in place (memory kept).
func (c *Client) Freeze(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "freeze")
}

// Thaw lets a frozen sandbox's processes run again.
func (c *Client) Thaw(ctx context.Context, id string) (*api.Sandbox, error) {
	return c.lifecycle(ctx, id, "thaw")
}

func (c *Client) lifecycle(ctx context.Context, id, verb string) (*api.Sandbox, error) {
	var sb api.Sandbox
	err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, nil, &sb)
	switch verb {
	case "freeze", "pause", "stop":
		// A bound lane is served by the guest alone: a frozen one cannot
		// answer it, and no wake comes through it. The next exec takes the
		// daemon's lane, which thaws or resumes a sandbox that auto-resumes.
		c.lanes.drop(id)
	}
	return &sb, err
}

// IsNotFound is errors.Is(err, ErrNotFound), for brevity.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
