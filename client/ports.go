package client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/netpipe"
)

// Reaching a TCP port that listens inside a sandbox. The daemon connects
// to 127.0.0.1:PORT (or [::1]:PORT) in the sandbox's own network; nothing
// else is reachable this way, and the sandbox's egress stays closed.

// PortForward is a host forward: a listener on the daemon host's loopback
// that carries each connection to a port in a sandbox.
type PortForward = api.PortForward

func portsPath(id string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/ports"
}

func portPath(id string, port int) string {
	return portsPath(id) + "/" + strconv.Itoa(port)
}

// ForwardPort makes port in the sandbox reachable at a host address on the
// daemon's machine ("127.0.0.1:41234") and returns it. Nothing needs to
// listen yet: connections made before a server listens are reset. Asking
// again for the same port returns the same address. The forward ends when
// the sandbox stops or is removed, on ClosePort, and with the daemon (a
// restarted daemon has none; ask again).
func (c *Client) ForwardPort(ctx context.Context, id string, port int) (string, error) {
	var f PortForward
	if err := c.do(ctx, http.MethodPost, portsPath(id), api.PortRequest{Port: &port}, &f); err != nil {
		return "", err
	}
	return f.HostAddress, nil
}

// ListPorts returns a sandbox's host forwards by port.
func (c *Client) ListPorts(ctx context.Context, id string) ([]PortForward, error) {
	var out []PortForward
	return out, c.do(ctx, http.MethodGet, portsPath(id), nil, &out)
}

// ClosePort ends the host forward of a port and every connection it
// carries. A port without a forward is ErrNotFound.
func (c *Client) ClosePort(ctx context.Context, id string, port int) error {
	return c.do(ctx, http.MethodDelete, portPath(id, port), nil, nil)
}

// DialPort connects to port in the sandbox through the daemon's API
// connection (no host port is opened): POST /v1/sandboxes/{id}/ports/{port}
// with "Connection: Upgrade" and "Upgrade: tcp", answered by a 101 after
// which the connection carries the TCP stream's bytes. ctx bounds the
// connect only. CloseWrite on the returned conn (it has one) half-closes
// the connection in the sandbox. Nothing listening is ErrNotFound.
func (c *Client) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	req, err := c.newRequest(ctx, http.MethodPost, portPath(id, port), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	fail := func(err error) (net.Conn, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := req.Write(conn); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrUnavailable, err))
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("%w: reading the answer to connect: %v", ErrUnavailable, err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		err := readError(resp)
		resp.Body.Close()
		return fail(err)
	}
	if !stop() {
		conn.Close()
		return nil, ctx.Err()
	}
	// The first bytes of the stream may have come in the same read as
	// the answer.
	return netpipe.WithBuffered(conn, br), nil
}

// PortURL returns the URL at which the daemon proxies HTTP and WebSocket
// traffic to port in the sandbox, with path (which may carry a query)
// appended: PortURL(id, 3000, "/api?x=1") is
// http://HOST/v1/sandboxes/ID/ports/3000/api?x=1. On a unix socket the
// host part is a placeholder: send the request with PortHTTPClient, which
// also carries the token.
func (c *Client) PortURL(id string, port int, path string) string {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return c.base + portPath(id, port) + path
}

// PortHTTPClient returns an HTTP client for PortURL addresses: it dials
// the daemon (whatever the URL's host) and adds the bearer token. The
// proxy takes the token off before the request reaches the sandbox.
func (c *Client) PortHTTPClient() *http.Client {
	return &http.Client{Transport: tokenTransport{token: c.token, next: c.tr.fallback}}
}

type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.next.RoundTrip(r)
}

// CreatePreview makes a preview URL for a port of a sandbox (see
// api.Preview); the answer holds its token, which is never shown again.
func (c *Client) CreatePreview(ctx context.Context, id string, req api.PreviewRequest) (*api.Preview, error) {
	var out api.Preview
	return &out, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/previews", req, &out)
}

// Previews lists a sandbox's previews (without tokens).
func (c *Client) Previews(ctx context.Context, id string) ([]api.Preview, error) {
	var out []api.Preview
	return out, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/previews", nil, &out)
}

// RevokePreviews revokes every preview of a port of a sandbox and returns
// how many there were.
func (c *Client) RevokePreviews(ctx context.Context, id string, port int) (int, error) {
	var out struct {
		Revoked int `json:"revoked"`
	}
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id)+"/previews?port="+strconv.Itoa(port), nil, &out)
	return out.Revoked, err
}

// RevokePreview revokes one preview.
func (c *Client) RevokePreview(ctx context.Context, id, preview string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id)+"/previews/"+url.PathEscape(preview), nil, nil)
}
