package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// processCmds are ps, attach, kill and shell.
func processCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{psCmd(g), attachCmd(g), killCmd(g), shellCmd(g)}
}

func psCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps ID",
		Short: "List the processes started in a sandbox, running and recently finished",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			procs, err := c.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, procs)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PID\tSTATE\tSTARTED\tEXIT\tUSER\tOUTPUT\tCOMMAND")
			for _, p := range procs {
				exit := ""
				if p.Exit != nil {
					exit = strconv.Itoa(p.Exit.ExitCode)
					if p.Exit.Signal != "" {
						exit += " (" + p.Exit.Signal + ")"
					}
				}
				user := p.User
				if user == "" {
					user = "root"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", p.PID, p.State, ago(p.StartedAt), exit, user,
					formatSize(p.OutputBytes), strings.Join(p.Cmd, " "))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func attachCmd(g *globals) *cobra.Command {
	var interactive, noReplay bool
	var offset int64
	cmd := &cobra.Command{
		Use:   "attach [flags] ID PID",
		Short: "Stream a process's output (replaying what is retained) until it exits",
		Long: "attach works on running processes and on ones that finished while nobody watched, " +
			"and after the daemon restarted; it exits with the process's exit code. " +
			"A process on a terminal gets the local terminal in raw mode.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil || pid <= 0 {
				return fmt.Errorf("%q is not a process id", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.Process(cmd.Context(), args[0], pid)
			if err != nil {
				return err
			}
			if noReplay {
				offset = p.OutputBytes
			}
			input := interactive || p.TTY
			s, err := c.Attach(cmd.Context(), args[0], pid, client.AttachOptions{Offset: offset, Interactive: input && p.State == "running"})
			if err != nil {
				return err
			}
			defer s.Close()
			return g.follow(cmd.Context(), s, input && p.State == "running", p.TTY)
		},
	}
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "send stdin to the process")
	cmd.Flags().BoolVar(&noReplay, "no-replay", false, "only new output, not what was retained")
	cmd.Flags().Int64Var(&offset, "offset", 0, "replay from this byte offset")
	return cmd
}

func killCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "kill ID PID [SIGNAL]",
		Short: "Send a signal (default TERM) to a process and its group",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil || pid <= 0 {
				return fmt.Errorf("%q is not a process id", args[1])
			}
			sig := "TERM"
			if len(args) == 3 {
				sig = args[2]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.Signal(cmd.Context(), args[0], pid, sig)
		},
	}
}

// startDetached is exec -d: it starts the command in the background and
// prints its PID, which ps, attach, logs --exec and kill take. With -i the
// process's stdin stays open for a later attach -i; with -t it gets a
// terminal of the local size (80x24 when there is none).
func startDetached(ctx context.Context, g *globals, c *client.Client, id string, command []string, o execOptions) error {
	req := api.StartRequest{Cmd: command, Env: o.env, Cwd: o.cwd, User: o.user, Stdin: o.interactive}
	if o.tty {
		req.TTY = localSize()
	}
	p, err := c.StartProcess(ctx, id, req)
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, p.PID)
	return nil
}

// loginShell runs bash as a login shell where there is one, sh otherwise.
var loginShell = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}

func shellCmd(g *globals) *cobra.Command {
	var o execOptions
	cmd := &cobra.Command{
		Use:   "shell [flags] ID",
		Short: "Open an interactive login shell in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			o.interactive, o.tty = true, true
			return runExec(cmd.Context(), g, c, args[0], loginShell, o)
		},
	}
	cmd.Flags().StringVarP(&o.user, "user", "u", "", "user to log in as (default root)")
	cmd.Flags().StringVarP(&o.cwd, "workdir", "w", "", "directory to start in")
	return cmd
}
