//go:build !linux

package cli

import (
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// gatewayCmd, in a client-only build: the gateway shares the daemon's
// API code, which is Linux's, so here it only says so.
func gatewayCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gateway",
		Short: "Serve the API of a cluster of paddock nodes as one (Linux only; this build is a client)",
		Args:  cobra.ArbitraryArgs,
		RunE: func(*cobra.Command, []string) error {
			return errdefs.New(errdefs.ErrUnavailable, "this paddock is a client-only build: the gateway runs on Linux")
		},
		DisableFlagParsing: true,
	}
}
