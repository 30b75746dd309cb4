package cli

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// portCmds are port and port rm.
func portCmds(g *globals) []*cobra.Command {
	port := &cobra.Command{
		Use:   "port ID [PORT]",
		Short: "Reach a TCP port of a sandbox from the host, or list the forwarded ports",
		Long: `With a PORT, port makes that port in the sandbox reachable at an address on the
daemon's host and prints it ("127.0.0.1:41234"). The daemon listens there, on the
loopback only, and carries every connection to 127.0.0.1:PORT (or [::1]:PORT)
inside the sandbox; nothing else of the sandbox, and nothing of the host, is
reachable through it. A server need not listen yet: connections made before it
does are reset. Asking again for the same port prints the same address.

Without a PORT, port lists the sandbox's forwarded ports.

A forward ends when the sandbox stops or is removed, with "paddock port rm ID
PORT", and when the daemon stops: a restarted daemon has no forwards (run
"paddock port ID PORT" again; the address may change).

HTTP and WebSocket traffic also reach a port through the daemon's API, with its
authentication and no host port: /v1/sandboxes/ID/ports/PORT/PATH.`,
		Example: `  paddock port 4f2k9x0a1b2c 3000
  curl http://$(paddock port 4f2k9x0a1b2c 3000)/
  paddock port 4f2k9x0a1b2c
  paddock port rm 4f2k9x0a1b2c 3000`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if len(args) == 2 {
				port, err := parsePortArg(args[1])
				if err != nil {
					return err
				}
				addr, err := c.ForwardPort(cmd.Context(), args[0], port)
				if err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, addr)
				return nil
			}
			fws, err := c.ListPorts(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PORT\tADDRESS\tCONNECTIONS")
			for _, f := range fws {
				fmt.Fprintf(tw, "%d\t%s\t%d\n", f.Port, f.HostAddress, f.Connections)
			}
			return tw.Flush()
		},
	}
	port.AddCommand(&cobra.Command{
		Use:   "rm ID PORT",
		Short: "End the forward of a sandbox's port and its connections",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parsePortArg(args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.ClosePort(cmd.Context(), args[0], p)
		},
	})
	return []*cobra.Command{port}
}

// parsePortArg reads a PORT argument. Range errors are left to the daemon,
// which names the field; this only catches what is not a number.
func parsePortArg(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("port: %q is not a port number (1-65535)", s)
	}
	return n, nil
}
