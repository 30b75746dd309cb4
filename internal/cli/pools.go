package cli

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// poolCmd is `paddock pool ls|set`.
func poolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "List and size warm pools (sandboxes of an image or a template kept ready, idle)",
	}
	ls := listCmd(g, listing[api.Pool]{
		short:  "List warm pools: ready sandboxes and the size each is kept at",
		fetch:  pools,
		key:    func(p api.Pool) string { return p.Name },
		header: "POOL\tREADY\tTARGET",
		row:    func(p api.Pool) string { return fmt.Sprintf("%s\t%d\t%d", p.Name, p.Ready, p.Target) },
	})
	set := &cobra.Command{
		Use:   "set image:NAME|template:NAME SIZE",
		Short: "Keep SIZE sandboxes ready (0 removes the pool); image pools survive a daemon restart",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("SIZE %q is not a whole number", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.SetPool(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s\t%d/%d ready\n", p.Name, p.Ready, p.Target)
			return nil
		},
	}
	cmd.AddCommand(ls, set)
	return cmd
}

// pools lists the warm pools by name.
func pools(c *client.Client, ctx context.Context) ([]api.Pool, error) {
	p, err := c.Pools(ctx)
	if err != nil {
		return nil, err
	}
	list := make([]api.Pool, 0, len(p.Target))
	for name, target := range p.Target {
		list = append(list, api.Pool{Name: name, Target: target, Ready: p.Ready[name]})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	return list, nil
}
