// Package cli owns paddock's command line: `paddock serve` runs the daemon,
// every other verb is a client of its API through the Go SDK.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/guestbin"
)

// exitError carries an exit code out of a command without printing.
type exitError struct{ code int }

// Version is this build's, stamped at link time (-ldflags "-X
// github.com/paddock-dev/paddock/internal/cli.Version=..."); the daemon
// gets it through its Config.
var Version = "dev"

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Run runs the CLI with args (without the program name) and returns the
// process exit code.
func Run(args []string) int {
	root := newRoot(os.Stdout, os.Stderr)
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintln(os.Stderr, "paddock:", oneLine(err))
		return 1
	}
}

func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}

type globals struct {
	host      string
	tokenFile string
	stdout    io.Writer
	stderr    io.Writer
}

func (g *globals) client() (*client.Client, error) {
	host := g.host
	if host == "" {
		host = os.Getenv("PADDOCK_HOST")
	}
	if host == "" {
		host = client.DefaultHost
	}
	opts := []client.Option{client.WithName("cli")}
	token, err := g.token()
	if err != nil {
		return nil, err
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	return client.New(host, opts...)
}

// token is the bearer token from --token-file or $PADDOCK_TOKEN.
func (g *globals) token() (string, error) {
	if g.tokenFile == "" {
		return os.Getenv("PADDOCK_TOKEN"), nil
	}
	b, err := os.ReadFile(g.tokenFile)
	if err != nil {
		return "", fmt.Errorf("reading token file: %w", err)
	}
	// A daemon's file may hold several tokens (one a line, while they
	// rotate): the first is the one to present.
	first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(first), nil
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "paddock",
		Short:         "Secure, fast sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.host, "host", "", "daemon address: unix:///path or tcp://HOST:PORT (default $PADDOCK_HOST or "+client.DefaultHost+")")
	root.PersistentFlags().StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token for a TCP daemon (default $PADDOCK_TOKEN)")
	root.AddCommand(
		serveCmd(),
		gatewayCmd(),
		clusterTLSCmd(),
		nodesCmd(g),
		versionCmd(g),
		runCmd(g),
		createCmd(g),
		execCmd(g),
		lsCmd(g),
		inspectCmd(g),
		rmCmd(g),
	)
	root.AddCommand(stateCmds(g)...)
	root.AddCommand(inContainer(processCmds(g))...)
	root.AddCommand(inContainer(fileCmds(g))...)
	root.AddCommand(portCmds(g)...) // one network namespace: a port is every container's
	root.AddCommand(snapshotCmd(g), forkCmd(g), volumeCmd(g))
	root.AddCommand(policyCmd(g), requestsCmd(g), secretCmd(g), e2bKeyCmd(g))
	root.AddCommand(telemetryCmds(g)...)
	root.AddCommand(imageCmd(g))
	root.AddCommand(templateCmd(g))
	root.AddCommand(poolCmd(g))
	root.AddCommand(mcpCmd(g))
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client and daemon versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			embedded := ""
			if guestbin.Embedded() {
				// The daemon this binary serves runs its slim guest.
				embedded = " (slim guest embedded)"
			}
			fmt.Fprintf(g.stdout, "client: %s%s\n", Version, embedded)
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.Version(cmd.Context())
			if err != nil {
				fmt.Fprintf(g.stdout, "daemon: unreachable (%s)\n", oneLine(err))
				return nil
			}
			fmt.Fprintf(g.stdout, "daemon: %s (runtime %s, cgroup v2 %v, idmapped mounts %v, %s)\n",
				v.Version, v.Runtime, v.CgroupV2, v.Idmapped, v.GoVersion)
			names := make([]string, 0, len(v.Runtimes))
			for n := range v.Runtimes {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(g.stdout, "runtime %s: %s\n", n, v.Runtimes[n])
			}
			return nil
		},
	}
}

// inContainer gives each command, and each below it, -c/--container: the
// container of the sandbox it works in (default the first).
func inContainer(cmds []*cobra.Command) []*cobra.Command {
	for _, cmd := range cmds {
		if cmd.HasSubCommands() {
			inContainer(cmd.Commands())
			continue
		}
		if cmd.RunE == nil {
			continue
		}
		var name string
		cmd.Flags().StringVarP(&name, "container", "c", "", "the container of the sandbox to work in (default its first)")
		run := cmd.RunE
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			cmd.SetContext(client.WithContainer(cmd.Context(), name))
			return run(cmd, args)
		}
	}
	return cmds
}
