//go:build !linux

package cli

import (
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// serveCmd, in a client-only build: the daemon needs Linux (namespaces,
// cgroups, nftables), so here it only says so.
func serveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the paddock daemon (Linux only; this build is a client)",
		Args:  cobra.ArbitraryArgs,
		RunE: func(*cobra.Command, []string) error {
			return errdefs.New(errdefs.ErrUnavailable, "this paddock is a client-only build: the daemon runs on Linux; point --host (or PADDOCK_HOST) at one")
		},
		DisableFlagParsing: true,
	}
}
