package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"paddock/client"
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
