package cli

import "github.com/spf13/cobra"

// fileCmds are cp and files.
func fileCmds(g *globals) []*cobra.Command { return nil }
