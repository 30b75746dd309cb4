package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
)

func requestsCmd(g *globals) *cobra.Command {
	var state string
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "requests [SANDBOX]",
		Aliases: []string{"request"},
		Short:   "List sandboxes' requests for hosts their policy refuses; approve or deny them",
		Long: "A sandbox asks for a host from inside (POST http://paddock.internal/v1/self/requests), or its\n" +
			"policy's mode \"ask\" files a request on each refusal. `paddock requests approve ID` lets it\n" +
			"reach the host at once (--for a time, --once, or for the sandbox's life); `deny` refuses, or\n" +
			"revokes an approval. Each decision is an event of the sandbox (type request) naming who decided.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sandbox := ""
			if len(args) == 1 {
				sandbox = args[0]
			}
			list, missing, leftOut, err := c.GatheredRequests(cmd.Context(), sandbox, state)
			if err != nil {
				return err
			}
			// Through a cluster's gateway the list may not be whole.
			if len(missing) > 0 {
				fmt.Fprintf(g.stderr, "warning: node(s) %s did not answer: their sandboxes' requests are not listed\n", strings.Join(missing, ", "))
			}
			if leftOut > 0 {
				fmt.Fprintf(g.stderr, "warning: the gateway left out the %d oldest requests; filter with --state or name a sandbox\n", leftOut)
			}
			if asJSON {
				return writeJSON(g.stdout, list)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tHOST\tSTATE\tAGE\tREASON")
			for _, r := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, r.Host, requestState(r), time.Since(r.Created).Round(time.Second), oneLineText(r.Reason, 60))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only requests in this state: pending, approved, denied, expired")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var d api.RequestDecision
	var dur time.Duration
	approve := &cobra.Command{
		Use:   "approve ID",
		Short: "Let the sandbox reach the request's host (--for 1h, --once, or for its life)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dur < 0 || (dur > 0 && dur < time.Second) {
				return fmt.Errorf("--for: %s is not a duration of a second or more", dur)
			}
			if dur > 0 && d.Once {
				return fmt.Errorf("--for and --once exclude each other")
			}
			d.DurationSeconds = int64(dur / time.Second)
			c, err := g.client()
			if err != nil {
				return err
			}
			return printDecided(g)(c.ApproveRequest(cmd.Context(), args[0], d))
		},
	}
	approve.Flags().DurationVar(&dur, "for", 0, "how long the approval lasts (default: the sandbox's life)")
	approve.Flags().BoolVar(&d.Once, "once", false, "allow one connection or request (the grant ends seconds after its first use)")
	approve.Flags().StringVar(&d.Note, "note", "", "a note for the audit event")
	var note string
	deny := &cobra.Command{
		Use:   "deny ID",
		Short: "Refuse a request, or revoke its approval",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return printDecided(g)(c.DenyRequest(cmd.Context(), args[0], note))
		},
	}
	deny.Flags().StringVar(&note, "note", "", "a note for the audit event")
	cmd.AddCommand(approve, deny)
	return cmd
}

// printDecided prints a decided request on one line.
func printDecided(g *globals) func(*api.EgressRequest, error) error {
	return func(r *api.EgressRequest, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stdout, "%s %s: %s\n", r.ID, r.Host, requestState(*r))
		return nil
	}
}

// requestState is a request's state with its terms.
func requestState(r api.EgressRequest) string {
	s := r.State
	switch {
	case r.State != api.RequestApproved:
	case r.Once:
		s += " once"
	case r.Until != nil:
		s += " until " + r.Until.Local().Format(time.DateTime)
	}
	if r.DecidedBy != "" {
		s += " by " + r.DecidedBy
	}
	return s
}

// oneLineText cuts s (a sandbox's words, checked by the daemon) to n runes
// on one line.
func oneLineText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
