//go:build linux

package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/daemon"
	"github.com/paddock-dev/paddock/internal/router"
	"github.com/paddock-dev/paddock/internal/server"
)

// gatewayCmd runs a cluster gateway: the /v1 API of many nodes as one.
// Its nodes come from --node flags or a JSON file (re-read when it
// changes); in a Kubernetes cluster a watch of the nodes' records feeds
// the same table.
func gatewayCmd() *cobra.Command {
	var e2bTLSCert, e2bTLSKey string
	var listen, e2bListen, e2bDomain, tokenFile, nodeTokenFile, nodesFile, tlsDir, debugSocket, level string
	var nodeFlags []string
	var pack bool
	var kube kubeNodes
	var httpCfg server.HTTPConfig
	var arch daemon.ArchiveConfig
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the API of a cluster of paddock nodes as one (placement, routing by sandbox id)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
			tokens, err := loadTokens(tokenFile, "--token-file", log)
			if err != nil {
				return err
			}
			nodeTokens, err := loadTokens(nodeTokenFile, "--node-token-file", log)
			if err != nil {
				return err
			}
			static, err := parseNodes(nodeFlags)
			if err != nil {
				return err
			}
			if listed := len(static) > 0 || nodesFile != ""; listed == kube.enabled {
				return errors.New("give the nodes with --node NAME=TAG@URL, --nodes-file, or --cluster (a watch of the cluster's PaddockNodes), not --cluster with the others")
			}
			u, err := url.Parse(listen)
			if err != nil || u.Scheme != "tcp" || u.Host == "" {
				return fmt.Errorf("--listen %q is not tcp://HOST:PORT", listen)
			}
			store, err := daemon.OpenArchive(arch)
			if err != nil {
				return err
			}
			var trust *clustertls.Gateway
			if tlsDir != "" {
				if trust, err = clustertls.LoadGateway(tlsDir, log.With("component", "cluster")); err != nil {
					return fmt.Errorf("--cluster-tls: %w", err)
				}
			}
			var drain func(context.Context, string, bool) error
			if kube.enabled {
				if drain, err = kube.drainer(); err != nil {
					return err
				}
			}
			rt := router.New(router.Config{
				Archive:    archiveOf(store),
				Version:    api.VersionInfo{Version: Version, Runtime: "gateway", GoVersion: goruntime.Version()},
				NodeTokens: nodeTokens,
				TLS:        trust,
				Pack:       pack,
				Drain:      drain,
				Defaults:   api.Resources{CPUs: float64(min(2, goruntime.NumCPU())), MemoryBytes: 1 << 30, DiskBytes: 10 << 30},
				E2BDomain:  e2bDomain,
				Log:        log,
			})
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if debugSocket != "" {
				stopDebug, err := daemon.ServeDebug(debugSocket, log)
				if err != nil {
					return err
				}
				defer stopDebug()
			}
			switch {
			case kube.enabled:
				if err := kube.watch(ctx, rt.SetNodes, log); err != nil {
					return err
				}
				kube.watchPresets(ctx, rt.SetPresets, log.With("component", "cluster"))
				go kube.runController(ctx, rt.Local(), log.With("component", "controller"))
			case nodesFile != "":
				if err := watchNodesFile(ctx, nodesFile, static, rt.SetNodes, log); err != nil {
					return err
				}
			default:
				rt.SetNodes(static)
			}
			l, err := net.Listen("tcp", u.Host)
			if err != nil {
				return err
			}
			errc := make(chan error, 2)
			// Until its token checks out, a client has 30 s to send its
			// request, as on a daemon's TCP listener. (The E2B listener's
			// envd calls are vouched for by the node's answer, after their
			// bodies: it has no such bound.)
			self, err := gatewaySelf(l, tokens)
			if err != nil {
				return err
			}
			defer self.Close()
			mcpH := daemon.MCPHandler(self, Version, log.With("component", "mcp"))
			hs := serveGateway(l, daemon.Surfaces(rt.Handler(tokens), self, mcpH, tokens.Present(), tokens, log), httpCfg, log, errc)
			log.Info("gateway serving", "listen", l.Addr().String())
			if e2bListen != "" {
				eu, err := url.Parse(e2bListen)
				if err != nil || eu.Scheme != "tcp" || eu.Host == "" {
					return fmt.Errorf("--e2b-listen %q is not tcp://HOST:PORT", e2bListen)
				}
				if (e2bTLSCert == "") != (e2bTLSKey == "") {
					return errors.New("--e2b-tls-cert and --e2b-tls-key go together")
				}
				var e2bTLS *tls.Config
				if e2bTLSCert != "" {
					// Loaded now, so that a bad pair fails the start.
					cert, err := tls.LoadX509KeyPair(e2bTLSCert, e2bTLSKey)
					if err != nil {
						return fmt.Errorf("the E2B listener's TLS certificate: %w", err)
					}
					e2bTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
				}
				el, err := net.Listen("tcp", eu.Host)
				if err != nil {
					return err
				}
				e2bCfg := httpCfg
				e2bCfg.ReadTimeout = -1
				es := serveGatewayTLS(el, rt.E2BHandler(tokens), e2bCfg, e2bTLS, log, errc)
				defer es.Close()
				log.Info("gateway serving the E2B API", "listen", el.Addr().String(), "tls", e2bTLS != nil)
			}
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "tcp://127.0.0.1:7300", "address clients call, tcp://HOST:PORT")
	f.StringVar(&e2bDomain, "e2b-domain", "", "with --e2b-listen: the nodes' --e2b-domain; PORT-ID.DOMAIN requests (ports, envd, signed URLs) go to the id's node with their Host")
	f.StringVar(&e2bTLSCert, "e2b-tls-cert", "", "with --e2b-listen: serve it over TLS with this certificate (PEM; a wildcard one for --e2b-domain's host names)")
	f.StringVar(&e2bTLSKey, "e2b-tls-key", "", "the --e2b-tls-cert's private key (PEM)")
	f.StringVar(&e2bListen, "e2b-listen", "", "also serve the E2B-compatible API on tcp://HOST:PORT (its key: paddock e2b-key of --token-file), routed to the nodes' facades")
	f.StringVar(&tokenFile, "token-file", "", "file of the bearer tokens clients may present, one a line (required; re-read when it changes, so tokens rotate without a restart)")
	f.StringVar(&nodeTokenFile, "node-token-file", "", "file of the nodes' bearer tokens, one a line: the gateway presents the first (their --token-file; required; re-read when it changes)")
	f.StringArrayVar(&nodeFlags, "node", nil, "a node, NAME=TAG@URL[,E2B_URL] (its tag starts its sandbox ids: paddock serve --id-prefix TAG; E2B_URL its --e2b-listen); repeatable")
	f.StringVar(&nodesFile, "nodes-file", "", "JSON file of nodes ([{name, tag, address, e2b_address, state, labels, capacity, allocated, pools}]), re-read when it changes")
	f.BoolVar(&kube.enabled, "cluster", false, "take the nodes from the cluster's Kubernetes API (PaddockNodes and their Leases, watched) instead of --node or --nodes-file")
	f.StringVar(&kube.kubeconfig, "kubeconfig", "", "with --cluster: kubeconfig of the cluster's API server (default $KUBECONFIG, or the pod's service account)")
	f.StringVar(&kube.namespace, "cluster-namespace", "paddock", "with --cluster: namespace of the nodes' Leases")
	f.BoolVar(&pack, "pack", false, "place creates on the fullest node that fits, instead of the emptiest")
	f.StringVar(&debugSocket, "debug-socket", "", "serve the Go runtime's profiles (pprof) on this unix socket, readable by the gateway's user alone")
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&tlsDir, "cluster-tls", "", "directory of the cluster's trust files for a gateway (ca.crt, gateway.crt, gateway.key: paddock cluster-tls; a mounted Secret, re-read when it changes): call nodes over mutual TLS only")
	f.IntVar(&httpCfg.Limits.Conns, "http-max-conns", 4096, "connections each listener holds at once")
	archiveFlags(f, &arch)
	return cmd
}

// gatewaySelf is a client of the gateway's own API on l, for the agent
// surfaces it serves as a daemon does (/mcp, the console's terminal): so
// they place, route and splice as any client's calls. It keeps the token
// presented at start (a rotation that removes it needs a restart for
// them, as on a daemon).
func gatewaySelf(l net.Listener, tokens *clustertls.Tokens) (*client.Client, error) {
	c, err := client.New("tcp://"+l.Addr().String(), client.WithToken(tokens.Present()))
	if err != nil {
		return nil, fmt.Errorf("the gateway's own client: %w", err)
	}
	return c, nil
}

// serveGateway serves h on l, its connections bounded as the daemon's
// TCP listeners' are; Serve's end goes to errc.
func serveGateway(l net.Listener, h http.Handler, cfg server.HTTPConfig, log *slog.Logger, errc chan<- error) *http.Server {
	return serveGatewayTLS(l, h, cfg, nil, log, errc)
}

// serveGatewayTLS is serveGateway speaking TLS with tc (none when nil),
// inside the connection guard as a daemon's E2B facade does.
func serveGatewayTLS(l net.Listener, h http.Handler, cfg server.HTTPConfig, tc *tls.Config, log *slog.Logger, errc chan<- error) *http.Server {
	hs := server.NewHTTPServer(h, cfg, log)
	l = server.Guard(hs, l, cfg, log)
	if tc != nil {
		hs.TLSConfig = tc
		l = tls.NewListener(l, tc)
	}
	go func() { errc <- hs.Serve(l) }()
	return hs
}

// loadTokens loads a token file (one token a line, each at least 16
// characters), re-read when it changes.
func loadTokens(path, flag string, log *slog.Logger) (*clustertls.Tokens, error) {
	if path == "" {
		return nil, fmt.Errorf("%s is required", flag)
	}
	t, err := clustertls.LoadTokens(path, log.With("component", "auth"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return t, nil
}

// parseNodes reads --node NAME=TAG@URL[,E2B_URL] flags: ready nodes of unknown
// capacity.
func parseNodes(flags []string) ([]api.Node, error) {
	var out []api.Node
	for _, f := range flags {
		name, rest, ok1 := strings.Cut(f, "=")
		tag, addrs, ok2 := strings.Cut(rest, "@")
		addr, e2bAddr, _ := strings.Cut(addrs, ",")
		if !ok1 || !ok2 || name == "" || !api.IsNodeTag(tag) || addr == "" {
			return nil, fmt.Errorf("--node %q is not NAME=TAG@URL[,E2B_URL] (TAG: 1 to %d of a-z, 0-9)", f, api.MaxNodeTag)
		}
		out = append(out, api.Node{Name: name, Tag: tag, Address: addr, E2BAddress: e2bAddr, State: api.NodeReady})
	}
	return out, nil
}

// watchNodesFile loads the nodes file (with the static nodes) into the
// table now, and again whenever its contents change, until ctx ends. A
// file that does not parse keeps the last table.
func watchNodesFile(ctx context.Context, path string, static []api.Node, set func([]api.Node), log *slog.Logger) error {
	load := func() ([]byte, []api.Node, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, err
		}
		var nodes []api.Node
		if err := json.Unmarshal(b, &nodes); err != nil {
			return b, nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		for i := range nodes {
			if nodes[i].State == "" {
				nodes[i].State = api.NodeReady
			}
		}
		return b, append(nodes, static...), nil
	}
	last, nodes, err := load()
	if err != nil {
		return err
	}
	set(nodes)
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			b, nodes, err := load()
			if bytes.Equal(b, last) {
				continue
			}
			last = b
			if err != nil {
				log.Warn("nodes file unusable; keeping the last table", "err", err)
				continue
			}
			log.Info("nodes file changed", "nodes", len(nodes))
			set(nodes)
		}
	}()
	return nil
}

// archiveOf is the router's view of the archive store (nil: none).
func archiveOf(s *archive.Store) router.Archive {
	if s == nil {
		return nil
	}
	return s
}
