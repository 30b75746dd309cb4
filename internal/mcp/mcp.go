// Package mcp is paddock's Model Context Protocol server: tools that
// create, run and inspect sandboxes, served over stdio (`paddock mcp`) or
// streamable HTTP (the daemon's /mcp). It is an adapter: every tool is a
// call of the Go SDK (package client) and owns no behaviour of its own, so
// the same server works against a daemon or a cluster's gateway.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/paddock-dev/paddock/client"
)

// Config is what a server serves and what it allows.
type Config struct {
	// Client reaches the daemon (or a gateway); required.
	Client *client.Client
	// Sandbox, when set, is the only sandbox the server serves: no
	// create, delete, fork or list of others, and every tool refuses
	// another id.
	Sandbox string
	// AllowPolicyChanges lets clients widen a policy: allow rules on
	// create and the set_policy tool. Without it a client can only name
	// the daemon's presets when it creates a sandbox.
	AllowPolicyChanges bool
	// Version is reported to clients.
	Version string
	// Log gets the server's own errors; nil discards them.
	Log *slog.Logger
}

// sessionIdle closes an HTTP session no request has used for this long.
const sessionIdle = 30 * time.Minute

// ErrScope is the category of a call for a sandbox the server does not
// serve.
var ErrScope = errors.New("outside this server's scope")

// New returns a server with paddock's tools.
func New(cfg Config) (*sdk.Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("mcp: no client")
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "paddock", Version: cfg.Version}, &sdk.ServerOptions{
		Instructions: instructions(cfg),
		Logger:       cfg.Log,
	})
	t := &tools{cfg: cfg, c: cfg.Client}
	t.register(s)
	return s, nil
}

func instructions(cfg Config) string {
	if cfg.Sandbox != "" {
		return fmt.Sprintf("paddock sandbox %s: run commands (exec), read and write its files, snapshot it, read its exec log, stats and egress denials. The sandbox argument may be omitted.", cfg.Sandbox)
	}
	return "paddock: secure sandboxes. create one, exec commands in it, read and write its files, snapshot, fork, pause, resume and delete it."
}

// ServeStdio serves one client on stdin and stdout until it leaves or ctx
// ends.
func ServeStdio(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx, &sdk.StdioTransport{})
}

// Handler serves the MCP streamable HTTP transport. It does no
// authentication: mount it behind the API's (server.RequireToken).
func Handler(cfg Config) (http.Handler, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{
		Logger: cfg.Log,
		// A client that leaves without closing its session must not
		// hold it forever.
		SessionTimeout: sessionIdle,
	}), nil
}
