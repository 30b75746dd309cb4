package cli

import "github.com/spf13/cobra"

// processCmds are ps, attach, kill and shell.
func processCmds(g *globals) []*cobra.Command { return nil }
