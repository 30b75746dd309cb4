package cli

import "github.com/spf13/cobra"

// portCmds are port.
func portCmds(g *globals) []*cobra.Command { return nil }
