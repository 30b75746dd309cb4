// Package cli owns paddock's command line: `paddock serve` runs the daemon,
// every other verb is a client of its API through the Go SDK.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/daemon"
)

// exitError carries an exit code out of a command without printing.
type exitError struct{ code int }

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
	var opts []client.Option
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
	return strings.TrimSpace(string(b)), nil
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
		versionCmd(g),
		runCmd(g),
		createCmd(g),
		execCmd(g),
		lsCmd(g),
		inspectCmd(g),
		rmCmd(g),
	)
	root.AddCommand(stateCmds(g)...)
	root.AddCommand(processCmds(g)...)
	root.AddCommand(fileCmds(g)...)
	root.AddCommand(portCmds(g)...)
	root.AddCommand(snapshotCmd(g), forkCmd(g), volumeCmd(g))
	root.AddCommand(policyCmd(g), secretCmd(g), e2bKeyCmd(g))
	root.AddCommand(telemetryCmds(g)...)
	root.AddCommand(imageCmd(g))
	root.AddCommand(templateCmd(g))
	root.AddCommand(poolCmd(g))
	return root
}

func serveCmd() *cobra.Command {
	cfg := daemon.Defaults()
	var listen []string
	var level string
	var stop, uninstall bool
	var stopTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the paddock daemon (as root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(listen) > 0 {
				cfg.Listen = listen
			}
			if uninstall {
				log := slog.New(slog.NewTextHandler(os.Stderr, nil))
				if err := daemon.Uninstall(cmd.Context(), cfg, log); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed the paddock daemon of %s and every sandbox, mount, cgroup and network rule it made\n", cfg.StateDir)
				return nil
			}
			if stop {
				pid, err := daemon.Stop(cfg.RunDir, stopTimeout)
				switch {
				case err != nil:
					return err
				case pid == 0:
					fmt.Fprintf(cmd.OutOrStdout(), "no paddock daemon runs with run dir %s\n", cfg.RunDir)
				default:
					fmt.Fprintf(cmd.OutOrStdout(), "stopped the paddock daemon of %s (pid %d); its sandboxes keep running\n", cfg.RunDir, pid)
				}
				return nil
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return daemon.Run(ctx, cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.StateDir, "state-dir", envOr("PADDOCK_STATE_DIR", cfg.StateDir), "directory for the store, images and disks")
	f.StringVar(&cfg.RunDir, "run-dir", envOr("PADDOCK_RUN_DIR", cfg.RunDir), "directory for sockets and sandbox mount points")
	f.StringArrayVar(&listen, "listen", nil, "listen address, unix:///path or tcp://HOST:PORT; repeatable (default "+cfg.Listen[0]+")")
	f.StringVar(&cfg.TokenFile, "token-file", "", "file holding the bearer token TCP listeners require")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup under which sandboxes live")
	f.IntVar(&cfg.DiskPool, "disk-pool", cfg.DiskPool, "ready disks of the default size to keep")
	f.Float64Var(&cfg.DiskOvercommit, "disk-overcommit", cfg.DiskOvercommit, "how far disks' capacity may exceed the storage's free space: 1 allocates every disk (a full storage refuses creates; writes never fail for want of space below the disk), above 1 disks are thin")
	f.Var(sizeFlag{&cfg.StorageSize}, "storage-size", "size of the XFS image made for disks, snapshots and volumes when the state directory cannot reflink, e.g. 200g (default: its filesystem's size)")
	f.IntVar(&cfg.WarmGuests, "warm-guests", cfg.WarmGuests, "sandboxes of the default image to keep ready (its warm pool; templates set their own with warm: N)")
	f.IntVar(&cfg.BlankGuests, "blank-guests", cfg.BlankGuests, "guests of each kind (new sandboxes, resumes) to keep started but bound to no image: creates that no warm pool serves and resumes start from one")
	f.BoolVar(&cfg.Network.Disabled, "no-network", false, "give sandboxes loopback only (no egress gateway)")
	f.StringVar(&cfg.Network.Name, "network-name", "", `prefix of host interfaces and name of the nftables table (default "paddock"; distinct per daemon on one host)`)
	f.StringVar(&cfg.Network.Subnet, "network-subnet", "", "IPv4 subnet for sandboxes' links, a /30 each (default 10.224.0.0/16)")
	f.StringArrayVar(&cfg.Network.DNS, "dns-upstream", nil, "upstream DNS server ip:port for the sandboxes' resolver; repeatable (default: the host's)")
	f.StringVar(&cfg.Network.RootCA, "egress-root-ca", "", "PEM file of CAs that verify intercepted upstreams, instead of the host's roots")
	f.Var(sizeFlag{&cfg.Images.MaxArchiveBytes}, "image-import-limit", "largest image archive an import accepts, e.g. 8g (default 32g)")
	f.BoolVar(&cfg.Images.AllowInsecureRegistries, "allow-insecure-registries", false, "let pulls ask for plain HTTP to registries not on loopback")
	f.Int64Var(&cfg.OutputLimit, "output-limit", cfg.OutputLimit, "output retained per process, in bytes (oldest dropped first)")
	f.Uint32Var(&cfg.UIDStart, "uid-start", cfg.UIDStart, "first host uid given to sandboxes (each gets 65536)")
	telemetryFlags(f, &cfg.Telemetry)
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&stop, "stop", false, "stop the daemon running with this run dir (its pid file, "+daemon.PIDFile+"), as SIGTERM does: sandboxes keep running")
	f.BoolVar(&uninstall, "uninstall", false, "remove every trace of the daemon with these directories, cgroup parent and network name: stop it, kill its sandboxes, unmount its storage, delete its network rules, cgroups, state and run dirs")
	f.DurationVar(&stopTimeout, "stop-timeout", 30*time.Second, "how long --stop waits for the daemon to exit")
	f.DurationVar(&cfg.HTTP.ReadTimeout, "http-read-timeout", 30*time.Second, "time a TCP client has to send a request until its credentials are checked")
	f.DurationVar(&cfg.HTTP.IdleTimeout, "http-idle-timeout", 2*time.Minute, "close an API connection idle this long between requests")
	f.IntVar(&cfg.HTTP.Limits.Conns, "http-max-conns", 4096, "connections each TCP listener holds at once")
	f.IntVar(&cfg.HTTP.Limits.Unauthenticated, "http-max-unauthenticated", 1024, "connections each TCP listener holds before their credentials are checked (the oldest is closed for a new one)")
	f.IntVar(&cfg.HTTP.Limits.PerPeer, "http-max-unauthenticated-per-peer", 64, "such connections one client address holds (its oldest is closed for its new one)")
	f.StringVar(&cfg.E2BListen, "e2b-listen", "", "serve the E2B-compatible API on tcp://HOST:PORT (needs --token-file; see docs/e2b.md)")
	return cmd
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
			fmt.Fprintf(g.stdout, "client: %s\n", daemon.Version)
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
			return nil
		},
	}
}
