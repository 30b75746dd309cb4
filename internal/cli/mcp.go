package cli

import (
	"context"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/internal/mcp"
)

func mcpCmd(g *globals) *cobra.Command {
	var cfg mcp.Config
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve paddock's tools to an MCP client over stdio",
		Long: `Serve paddock's tools (create, exec, files, snapshot, fork, pause, resume,
delete, logs, stats, denials) to a Model Context Protocol client on stdin and
stdout, as a client of the daemon (or a gateway) named by --host.

With --sandbox ID only that sandbox is served: no create, delete, fork or
list, and every tool refuses another id. Clients cannot widen a sandbox's
network policy unless --allow-policy-changes is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			cfg.Client, cfg.Version = c, Version
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if cfg.Sandbox != "" {
				// Fail now, not at the first tool call, on a wrong id.
				if _, err := c.Get(ctx, cfg.Sandbox); err != nil {
					return err
				}
			}
			return mcp.ServeStdio(ctx, cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.Sandbox, "sandbox", "", "serve only this sandbox")
	cmd.Flags().BoolVar(&cfg.AllowPolicyChanges, "allow-policy-changes", false, "let clients widen network policies (allow rules, set_policy)")
	return cmd
}
