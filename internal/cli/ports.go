package cli

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// portCmds are port and port rm.
func portCmds(g *globals) []*cobra.Command {
	var pv previewFlags
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
authentication and no host port: /v1/sandboxes/ID/ports/PORT/PATH.

With --url, port prints a preview URL for the port on the daemon's TCP listener
(/preview/PREVIEW/PATH): private to holders of the token it carries (which also
sets a cookie for the preview's path), scoped to that sandbox and port, until
--expires (default 1h) or --revoke; --public needs no token. --urls lists them.
A daemon started with --preview-domain prints each on a host name of its own
(http://PORT-PREVIEW.DOMAIN/), where the app's absolute links work.`,
		Example: `  paddock port 4f2k9x0a1b2c 3000
  curl http://$(paddock port 4f2k9x0a1b2c 3000)/
  paddock port 4f2k9x0a1b2c
  paddock port rm 4f2k9x0a1b2c 3000
  paddock port 4f2k9x0a1b2c 3000 --url --expires 8h
  paddock port 4f2k9x0a1b2c 3000 --revoke`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if pv.wanted() {
				return pv.run(cmd, g, c, args)
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
	pv.register(port)
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

// previewFlags are port's preview URLs: --url (with --expires and
// --public), --revoke, --urls.
type previewFlags struct {
	url, public, revoke, list bool
	expires                   time.Duration
}

func (f *previewFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.url, "url", false, "print a preview URL for the port on the daemon's TCP listener")
	fl.DurationVar(&f.expires, "expires", 0, "with --url: how long the URL works (default 1h)")
	fl.BoolVar(&f.public, "public", false, "with --url: anyone with the URL reaches the port, no token needed")
	fl.BoolVar(&f.revoke, "revoke", false, "revoke every preview URL of the port")
	fl.BoolVar(&f.list, "urls", false, "list the sandbox's preview URLs")
}

func (f *previewFlags) wanted() bool { return f.url || f.revoke || f.list }

func (f *previewFlags) run(cmd *cobra.Command, g *globals, c *client.Client, args []string) error {
	ctx := cmd.Context()
	if f.list {
		list, err := c.Previews(ctx, args[0])
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PREVIEW\tPORT\tPUBLIC\tEXPIRES\tURL")
		for _, p := range list {
			u := p.URL
			if u == "" {
				u = p.Path
			}
			fmt.Fprintf(tw, "%s\t%d\t%v\t%s\t%s\n", p.ID, p.Port, p.Public, p.ExpiresAt.Local().Format(time.DateTime), u)
		}
		return tw.Flush()
	}
	if len(args) != 2 {
		return fmt.Errorf("--url and --revoke need a PORT")
	}
	port, err := parsePortArg(args[1])
	if err != nil {
		return err
	}
	if f.revoke {
		n, err := c.RevokePreviews(ctx, args[0], port)
		if err != nil {
			return err
		}
		fmt.Fprintf(g.stdout, "revoked %d preview URL(s) of port %d\n", n, port)
		return nil
	}
	if f.expires < 0 || (f.expires > 0 && f.expires < time.Second) {
		return fmt.Errorf("--expires: %s is not a duration of a second or more", f.expires)
	}
	p, err := c.CreatePreview(ctx, args[0], api.PreviewRequest{Port: port, ExpiresSeconds: int64(f.expires / time.Second), Public: f.public})
	if err != nil {
		return err
	}
	if p.URL == "" {
		fmt.Fprintf(g.stderr, "paddock: the daemon has no TCP listener; serve this path on one (--listen tcp://...), with %s: %s\n", "the header Paddock-Preview-Token", p.Token)
		fmt.Fprintln(g.stdout, p.Path)
		return nil
	}
	fmt.Fprintln(g.stdout, p.URL)
	return nil
}
