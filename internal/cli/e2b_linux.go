package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/internal/e2b"
)

func e2bKeyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "e2b-key",
		Short: "Print the E2B API key that stands for the daemon's token (--token-file or $PADDOCK_TOKEN)",
		Long: `Print the E2B API key that the facade (paddock serve --e2b-listen) accepts: it is
derived from the daemon's bearer token, so give the same --token-file the daemon has.
Then: E2B_API_KEY=$(paddock e2b-key --token-file FILE).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, err := g.token()
			if err != nil {
				return err
			}
			if tok == "" {
				return errors.New("no token: give --token-file (the daemon's) or set PADDOCK_TOKEN")
			}
			_, err = fmt.Fprintln(g.stdout, e2b.APIKey(tok))
			return err
		},
	}
}
