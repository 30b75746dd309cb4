package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/client"
)

// listing says how an `ls` command gets and prints one kind of thing:
// a table by default, JSON with --json, the keys alone with -q.
type listing[T any] struct {
	short  string // the command's one-line help
	fetch  func(*client.Client, context.Context) ([]T, error)
	key    func(T) string // what -q prints
	header string         // tab-separated column names
	row    func(T) string // tab-separated cells
}

func listCmd[T any](g *globals, l listing[T]) *cobra.Command {
	var asJSON, quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   l.short,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := l.fetch(c, cmd.Context())
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return writeJSON(g.stdout, list)
			case quiet:
				for _, v := range list {
					fmt.Fprintln(g.stdout, l.key(v))
				}
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, l.header)
			for _, v := range list {
				fmt.Fprintln(tw, l.row(v))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only names (ids)")
	return cmd
}

// removeCmd is an `rm NAME...` command: it removes each named thing in turn,
// printing its name, and stops at the first that cannot be removed.
func removeCmd(g *globals, use, short string, remove func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: []string{"remove"},
		Short:   short,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, n := range args {
				if err := remove(c, cmd.Context(), n); err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
				fmt.Fprintln(g.stdout, n)
			}
			return nil
		},
	}
}
