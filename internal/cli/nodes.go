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
	return cmd
}

// ofCapacity is "USED/CAPACITY", or USED when the capacity is not known.
func ofCapacity(used string, known bool, capacity string) string {
	if !known {
		return used
	}
	return used + "/" + capacity
}
