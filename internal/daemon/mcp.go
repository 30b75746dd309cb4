package daemon

import (
	"log/slog"
	"net"
	"net/http"

	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/mcp"
	"github.com/paddock-dev/paddock/internal/server"
)

// selfClient is a client of this daemon's own API, for the adapters it
// serves (/mcp, the console's terminal), so that they own no path into the
// manager of their own. It dials the first unix listener, or a plain TCP
// one with the token; a node whose TCP takes only gateways' TLS and has no
// unix listener has none (nil): its gateway is the way in.
func selfClient(listeners []net.Listener, token string, tlsOnly bool, log *slog.Logger) *client.Client {
	var c *client.Client
	var err error
	for _, l := range listeners {
		if l.Addr().Network() == "unix" {
			c, err = client.New("unix://" + l.Addr().String())
			break
		}
	}
	if c == nil && err == nil && !tlsOnly {
		for _, l := range listeners {
			if l.Addr().Network() == "tcp" {
				c, err = client.New("tcp://"+l.Addr().String(), client.WithToken(token))
				break
			}
		}
	}
	if c == nil || err != nil {
		log.Info("no /mcp and no console terminal: no listener this daemon can reach itself on", "err", err)
		return nil
	}
	return c
}

// mcpHandler is the MCP server (package mcp) for /mcp over the daemon's
// own client c; nil without one.
func mcpHandler(c *client.Client, version string, log *slog.Logger) http.Handler {
	if c == nil {
		return nil
	}
	h, err := mcp.Handler(mcp.Config{Client: c, Version: version, Log: log})
	if err != nil {
		log.Warn("no /mcp", "err", err)
		return nil
	}
	return h
}

// withMCP routes /mcp to m, behind the listener's token, and the rest to
// api.
func withMCP(api, m http.Handler, tokens server.Tokens, log *slog.Logger) http.Handler {
	if m == nil {
		return api
	}
	m = server.RequireTokens(tokens, log, m)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mcp" {
			m.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}
