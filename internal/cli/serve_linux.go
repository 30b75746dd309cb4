package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/paddock-dev/paddock/internal/daemon"
)

func serveCmd() *cobra.Command {
	cfg := daemon.Defaults()
	cfg.Version = Version
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
	f.StringVar(&cfg.TokenFile, "token-file", "", "file of the bearer tokens TCP listeners accept, one a line (re-read when it changes: tokens rotate without a restart)")
	f.StringVar(&cfg.IDPrefix, "id-prefix", "", "start every sandbox and snapshot id with this node tag (1 to 4 of a-z, 0-9), by which a cluster gateway routes calls")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup under which sandboxes live")
	f.IntVar(&cfg.DiskPool, "disk-pool", cfg.DiskPool, "ready disks of the default size to keep")
	f.Float64Var(&cfg.DiskOvercommit, "disk-overcommit", cfg.DiskOvercommit, "how far disks' capacity may exceed the storage's free space: 1 allocates every disk (a full storage refuses creates; writes never fail for want of space below the disk), above 1 disks are thin")
	f.Var(sizeFlag{&cfg.StorageSize}, "storage-size", "size of the XFS image made for disks, snapshots and volumes when the state directory cannot reflink, e.g. 200g (default: its filesystem's size)")
	f.IntVar(&cfg.WarmGuests, "warm-guests", cfg.WarmGuests, "sandboxes of the default image to keep ready (its warm pool; templates set their own with warm: N)")
	f.IntVar(&cfg.BlankGuests, "blank-guests", cfg.BlankGuests, "guests of each kind (new sandboxes, resumes) to keep started but bound to no image: creates that no warm pool serves and resumes start from one")
	f.StringVar(&cfg.Runsc, "runsc", envOr("PADDOCK_RUNSC", ""), "gVisor's runsc for --runtime gvisor (default: runsc on PATH, else the newest that make runsc built)")
	f.IntVar(&cfg.GvisorPool, "gvisor-pool", 0, "gvisor sandboxes of the default image to keep ready (runsc started, the guest prepared), so that a gvisor create is a hand-out")
	f.StringVar(&cfg.DefaultRuntime, "default-runtime", "", `runtime of creates that name none: "native" (default) or "gvisor"`)
	f.BoolVar(&cfg.Network.Disabled, "no-network", false, "give sandboxes loopback only (no egress gateway)")
	f.BoolVar(&cfg.NoFastGuest, "no-fast-guest", false, "start every native sandbox's PID 1 as the Go guest, not as the fast guest in C that hands over to it for what it does not serve")
	f.StringVar(&cfg.Network.Name, "network-name", "", `prefix of host interfaces and name of the nftables table (default "paddock"; distinct per daemon on one host)`)
	f.StringVar(&cfg.Network.Subnet, "network-subnet", "", "IPv4 subnet for sandboxes' links, a /30 each (default 10.224.0.0/16)")
	f.StringArrayVar(&cfg.Network.DNS, "dns-upstream", nil, "upstream DNS server ip:port for the sandboxes' resolver; repeatable (default: the host's)")
	f.StringVar(&cfg.Network.RootCA, "egress-root-ca", "", "PEM file of CAs that verify intercepted upstreams, instead of the host's roots")
	f.Var(sizeFlag{&cfg.Images.MaxArchiveBytes}, "image-import-limit", "largest image archive an import accepts, e.g. 8g (default 32g)")
	f.BoolVar(&cfg.Images.AllowInsecureRegistries, "allow-insecure-registries", false, "let pulls ask for plain HTTP to registries not on loopback")
	f.Int64Var(&cfg.OutputLimit, "output-limit", cfg.OutputLimit, "output retained per process, in bytes (oldest dropped first)")
	f.Uint32Var(&cfg.UIDStart, "uid-start", cfg.UIDStart, "first host uid given to sandboxes (each gets 65536)")
	telemetryFlags(f, &cfg.Telemetry)
	f.BoolVar(&cfg.Debug, "debug-socket", false, "serve the Go runtime's profiles (pprof: CPU, heap, goroutines, mutex, block) on a root-only unix socket in the run dir, "+daemon.DebugSocket)
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&stop, "stop", false, "stop the daemon running with this run dir (its pid file, "+daemon.PIDFile+"), as SIGTERM does: sandboxes keep running")
	f.BoolVar(&uninstall, "uninstall", false, "remove every trace of the daemon with these directories, cgroup parent and network name: stop it, kill its sandboxes, unmount its storage, delete its network rules, cgroups, state and run dirs")
	f.DurationVar(&stopTimeout, "stop-timeout", 30*time.Second, "how long --stop waits for the daemon to exit")
	f.DurationVar(&cfg.HTTP.ReadTimeout, "http-read-timeout", 30*time.Second, "time a TCP client has to send a request until its credentials are checked")
	f.DurationVar(&cfg.HTTP.IdleTimeout, "http-idle-timeout", 2*time.Minute, "close an API connection idle this long between requests")
	f.IntVar(&cfg.HTTP.Limits.Conns, "http-max-conns", 4096, "connections each TCP listener holds at once")
	f.IntVar(&cfg.HTTP.Limits.Unauthenticated, "http-max-unauthenticated", 1024, "connections each TCP listener holds before their credentials are checked (the oldest is closed for a new one)")
	f.IntVar(&cfg.HTTP.Limits.PerPeer, "http-max-unauthenticated-per-peer", 64, "such connections one client address holds (its oldest is closed for its new one)")
	f.StringVar(&cfg.PreviewListen, "preview-listen", "", "serve preview URLs (paddock port --url) on tcp://HOST:PORT, a port of their own, apart from the API and console")
	f.StringVar(&cfg.PreviewDomain, "preview-domain", "", "serve each preview URL on a host name of its own, PORT-PREVIEW.DOMAIN (wildcard DNS to --preview-listen), where absolute links work: DOMAIN, or https://DOMAIN[:PORT] behind a TLS proxy")
	f.StringVar(&cfg.E2BListen, "e2b-listen", "", "serve the E2B-compatible API on tcp://HOST:PORT (needs --token-file; see docs/e2b.md)")
	f.StringVar(&cfg.E2BDomain, "e2b-domain", "", "domain of the E2B facade's sandbox host names, PORT-ID.DOMAIN (wildcard DNS to the facade): routes them to sandbox ports")
	f.StringVar(&cfg.E2BTLSCert, "e2b-tls-cert", "", "serve the E2B facade over TLS with this certificate (for the domain and *.DOMAIN; with --e2b-tls-key)")
	f.StringVar(&cfg.E2BTLSKey, "e2b-tls-key", "", "the E2B facade's TLS key (with --e2b-tls-cert)")
	f.StringVar(&cfg.E2BDefaultEgress, "e2b-default-egress", "none", "network of an E2B sandbox whose create says nothing of it: none (paddock's default) or internet (E2B's)")
	clusterFlags(f, &cfg.Cluster)
	archiveFlags(f, &cfg.Archive)
	f.DurationVar(&cfg.Archive.After, "archive-after", 0, "archive paused sandboxes idle this long (0: only on request: paddock archive, pause ?archive=true)")
	return cmd
}

// clusterFlags make `paddock serve` a node of a cluster.
func clusterFlags(f *pflag.FlagSet, cc *daemon.ClusterConfig) {
	f.BoolVar(&cc.Enabled, "cluster", false, "be a node of a paddock cluster: register with the Kubernetes API (a Lease and a PaddockNode) and start every sandbox id with the node's tag")
	f.StringVar(&cc.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster's API server (default $KUBECONFIG, or the pod's service account)")
	f.StringVar(&cc.Namespace, "cluster-namespace", "paddock", "namespace of the nodes' Leases")
	f.StringVar(&cc.NodeName, "node-name", "", "the node's name in the cluster (default: the host's name)")
	f.StringVar(&cc.NodeAddress, "node-address", "", "URL gateways call this node at, http(s)://HOST:PORT (one of its --listen addresses, as reached from the gateways)")
	f.StringVar(&cc.NodeE2BAddress, "node-e2b-address", "", "URL gateways call this node's E2B facade at, http(s)://HOST:PORT (its --e2b-listen, as reached from the gateways)")
	f.StringToStringVar(&cc.NodeLabels, "node-labels", nil, "labels creates may select the node by, KEY=VALUE,...")
	f.StringVar(&cc.TLSDir, "cluster-tls", "", "directory of the cluster's trust files for a node (ca.crt, node-ca.crt, node-ca.key: paddock cluster-tls; a mounted Secret, re-read when it changes): TCP listeners speak TLS for the hosts of --node-address and --node-e2b-address (https) and take only gateways' client certificates")
}

// telemetryFlags are `paddock serve`'s admission and budget settings.
func telemetryFlags(f *pflag.FlagSet, tc *daemon.TelemetryConfig) {
	f.Float64Var(&tc.CPUOvercommit, "cpu-overcommit", tc.CPUOvercommit, "admission control: CPU limits of all sandboxes together per host CPU")
	f.Float64Var(&tc.MemoryOvercommit, "memory-overcommit", tc.MemoryOvercommit, "admission control: memory limits of all sandboxes together per byte of host memory (1: strict)")
	f.Var(sizeFlag{&tc.MemoryCapacity}, "admission-memory", "memory admission control hands out, e.g. 16g (default: the host's)")
	f.Float64Var(&tc.Prices.CPUSecond, "price-cpu-second", 0, "price of a CPU-second, for cost budgets")
	f.Float64Var(&tc.Prices.MemoryGBHour, "price-memory-gb-hour", 0, "price of a GB-hour of memory limit, for cost budgets")
	f.Float64Var(&tc.Prices.EgressGB, "price-egress-gb", 0, "price of a GB through the egress proxy, for cost budgets")
}
