//go:build !linux

package cli

import (
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// e2bKeyCmd, in a client-only build: the key is derived by the E2B
// facade's package, which runs with the daemon, on Linux.
func e2bKeyCmd(*globals) *cobra.Command {
	return &cobra.Command{
		Use:   "e2b-key",
		Short: "Print the E2B API key (on Linux; this build is a client)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errdefs.New(errdefs.ErrUnavailable, "this client-only build cannot derive the E2B key: run paddock e2b-key on the daemon's host")
		},
	}
}
