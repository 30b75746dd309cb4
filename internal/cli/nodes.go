package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// nodesCmd lists a cluster's nodes through its gateway.
func nodesCmd(g *globals) *cobra.Command {
	cmd := listCmd(g, listing[api.Node]{
		short:  "List the nodes of a cluster (through its gateway): state, tag, capacity and allocation",
		fetch:  func(c *client.Client, ctx context.Context) ([]api.Node, error) { return c.Nodes(ctx) },
		key:    func(n api.Node) string { return n.Name },
		header: "NAME\tTAG\tSTATE\tADDRESS\tSANDBOXES\tCPUS\tMEMORY",
		row: func(n api.Node) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, n.Tag, n.State, n.Address,
				ofCapacity(fmt.Sprint(n.Allocated.Sandboxes), n.Capacity.Sandboxes > 0, fmt.Sprint(n.Capacity.Sandboxes)),
				ofCapacity(fmt.Sprintf("%g", n.Allocated.CPUs), n.Capacity.CPUs > 0, fmt.Sprintf("%g", n.Capacity.CPUs)),
				ofCapacity(formatSize(n.Allocated.MemoryBytes), n.Capacity.MemoryBytes > 0, formatSize(n.Capacity.MemoryBytes)))
		},
	})
	cmd.Use, cmd.Aliases = "nodes", nil
	cmd.AddCommand(drainCmd(g, true), drainCmd(g, false))
	return cmd
}

// drainCmd is `paddock nodes drain|undrain NAME...`: through a gateway
// started with --cluster, it sets the nodes' PaddockNodes draining (no
// new sandboxes placed on them; theirs keep serving) or ready again.
func drainCmd(g *globals, draining bool) *cobra.Command {
	use, short := "undrain NAME...", "Place creates on drained nodes again"
	if draining {
		use, short = "drain NAME...", "Place no more creates on nodes; their sandboxes keep serving"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := 0
			for _, name := range args {
				n, err := c.DrainNode(cmd.Context(), name, draining)
				if err != nil {
					fmt.Fprintf(g.stderr, "paddock: %s: %s\n", name, oneLine(err))
					failed++
					continue
				}
				fmt.Fprintf(g.stdout, "%s\t%s\n", n.Name, n.State)
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
}

// ofCapacity is "USED/CAPACITY", or USED when the capacity is not known.
func ofCapacity(used string, known bool, capacity string) string {
	if !known {
		return used
	}
	return used + "/" + capacity
}
