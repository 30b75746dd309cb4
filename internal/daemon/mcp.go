package daemon

import (
	"log/slog"
	"net"
	"net/http"

	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/console"
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

// MCPHandler is the MCP server (package mcp) for /mcp over the daemon's
// own client c; nil without one.
func MCPHandler(c *client.Client, version string, log *slog.Logger) http.Handler {
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

// Surfaces wraps api, a TCP or unix listener's handler behind tokens
// (nil: none), with the agent surfaces that ride on it: the console at
// /ui/ (its login takes token; "" needs none) with self for its
// terminal, and /mcp served by m (nil: none). A daemon and a cluster's
// gateway serve the same.
func Surfaces(api http.Handler, self *client.Client, m http.Handler, token string, tokens server.Tokens, log *slog.Logger) http.Handler {
	ui := console.New(console.Config{Token: token, Client: self, Log: log.With("component", "console")})
	return ui.Wrap(withMCP(api, m, tokens, log))
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
