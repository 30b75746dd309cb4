// Package daemon wires paddock's parts together for `paddock serve`, in
// start-up order (store, cgroups, disks, images, seccomp, runtime,
// manager, reconcile, listeners) and shuts them down in reverse. Sandboxes
// outlive the daemon: stopping it leaves them running for the next one.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/rundir"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/runtime/gvisor"
	"github.com/paddock-dev/paddock/internal/runtime/native"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/seccomp"
	"github.com/paddock-dev/paddock/internal/server"
	"github.com/paddock-dev/paddock/internal/snapshot"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/storage/oci"
	"github.com/paddock-dev/paddock/internal/store"
	"github.com/paddock-dev/paddock/internal/sysmon"
	"github.com/paddock-dev/paddock/internal/template"
	"github.com/paddock-dev/paddock/internal/volume"
	"github.com/paddock-dev/paddock/wire"
)

// Config is the daemon's configuration. Zero values take the defaults
// from Defaults; flags and environment map onto these fields.
type Config struct {
	// Version is this build's, reported by GET /v1/version and logged
	// (default "dev"; the CLI passes its build stamp).
	Version string
	// StateDir holds the store, images and disks (default /var/lib/paddock).
	StateDir string
	// RunDir holds sockets and per-sandbox mount points (default /run/paddock).
	RunDir string
	// Listen is unix:///path or tcp://HOST:PORT (default
	// unix:///run/paddock/paddock.sock). Several may be given.
	Listen []string
	// TokenFile holds the bearer tokens TCP listeners accept, one a line,
	// re-read when it changes (clustertls.Tokens).
	TokenFile string
	// IDPrefix starts the id of every sandbox and snapshot this daemon
	// makes: its node's tag in a cluster (api.Node.Tag), by which a
	// gateway routes calls. Empty: none.
	IDPrefix string
	// CgroupParent names the cgroup under which sandboxes live.
	CgroupParent string
	// Defaults fill the resources a create leaves at zero.
	Defaults api.Resources
	// DiskPool is how many ready disks of the default size to keep.
	DiskPool int
	// DiskOvercommit is how far the capacity of all disks may exceed the
	// storage's free space: 1 (the default) allocates every disk when it
	// is made, so a sandbox that fills its disk gets ENOSPC at its cap
	// and a disk the storage cannot back is refused; above 1 disks are
	// sparse (thin) and the metrics say when the storage runs short.
	DiskOvercommit float64
	// Network configures sandboxes' egress; Network.Disabled leaves them
	// with loopback only.
	Network NetworkConfig
	// StorageSize sizes the XFS image made for sandbox disks, snapshots
	// and volumes when the state directory's filesystem cannot reflink;
	// 0 means the size of that filesystem (the image is sparse).
	StorageSize int64
	// UIDStart is the first host uid given to sandboxes.
	UIDStart uint32
	// OutputLimit is the output retained per process, in bytes.
	OutputLimit int64
	// WarmGuests is how many sandbox init processes to start ahead of
	// time, so that a create does not wait for one to start.
	WarmGuests int
	// BlankGuests is how many guests to keep started but bound to no
	// image or disk, so that a start no warm pool serves (a template
	// without a pool, a snapshot, a resume, a fork) does not wait for a
	// guest process to start either.
	BlankGuests int
	// NoFastGuest starts every native guest as the Go guest, never as
	// the fast guest (internal/guestc) this build may embed.
	NoFastGuest bool
	// Runsc is gVisor's runsc for the gvisor runtime; "" finds one
	// (findRunsc). Without one, creates asking for gvisor are refused.
	Runsc string
	// DefaultRuntime is the runtime of creates that name none: "native"
	// (or "") or "gvisor".
	DefaultRuntime string
	// GvisorPool is how many gvisor sandboxes of the default image to
	// keep ready (runsc started, the guest prepared).
	GvisorPool int
	// Telemetry configures metrics, budgets and admission control.
	Telemetry TelemetryConfig
	// Images bounds OCI images and says where they may be pulled from.
	Images ImageConfig
	// PreviewListen, tcp://HOST:PORT, serves preview URLs (paddock port
	// --url) and nothing else: a previewed app's scripts must not share
	// an origin with the API or the console.
	PreviewListen string
	// PreviewDomain serves previews on host names of their own,
	// PORT-PREVIEW.DOMAIN (wildcard DNS to PreviewListen): "DOMAIN"
	// prints http://...DOMAIN:LISTENPORT/, "https://DOMAIN[:PORT]" is for
	// a TLS proxy in front of the listener.
	PreviewDomain string
	// E2BListen, tcp://HOST:PORT, serves the E2B-compatible facade
	// (package e2b); it needs TokenFile.
	E2BListen string
	// E2BDefaultEgress is the network of a facade sandbox whose create
	// says nothing of it: "none" (paddock's default) or "internet" (E2B's).
	E2BDefaultEgress string
	// E2BDomain is the domain of the facade's sandbox host names
	// (PORT-ID.DOMAIN, wildcard DNS pointing at the facade's listener);
	// E2BTLSCert and E2BTLSKey, when set, serve the listener over TLS (a
	// certificate for the domain and *.DOMAIN).
	E2BDomain, E2BTLSCert, E2BTLSKey string
	// HTTP bounds the API's and the facade's connections.
	HTTP server.HTTPConfig
	// Cluster makes the daemon a node of a cluster (off by default).
	Cluster ClusterConfig
	// Archive is the object store paused sandboxes go to (none by
	// default).
	Archive ArchiveConfig
	// Debug serves the Go runtime's CPU, heap, goroutine, mutex and block
	// profiles on RunDir/debug.sock (root only; see serveDebug). Off by
	// default.
	Debug bool
}

// ImageConfig configures OCI images.
type ImageConfig struct {
	// MaxArchiveBytes caps an archive given to an import (0: the image
	// store's default, 32 GiB).
	MaxArchiveBytes int64
	// AllowInsecureRegistries lets a pull use plain HTTP to a registry
	// that is not on loopback.
	AllowInsecureRegistries bool
}

// NetworkConfig configures the egress gateway.
type NetworkConfig struct {
	Disabled bool
	// Name prefixes host interfaces and names the nftables table; Subnet
	// holds the sandboxes' addresses. Two daemons on one host need
	// distinct ones.
	Name   string
	Subnet string
	// DNS lists upstream resolvers ("ip:port"); empty: the host's.
	DNS []string
	// RootCA, a PEM file, replaces the host's roots for verifying the
	// upstreams of intercepted TLS (for tests and private CAs).
	RootCA string
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Version:      "dev",
		StateDir:     "/var/lib/paddock",
		RunDir:       "/run/paddock",
		Listen:       []string{"unix:///run/paddock/paddock.sock"},
		CgroupParent: "paddock",
		Defaults: api.Resources{
			CPUs:        float64(min(2, goruntime.NumCPU())),
			MemoryBytes: 1 << 30,
			Pids:        4096,
			DiskBytes:   10 << 30,
		},
		DiskPool:       4,
		DiskOvercommit: 1,
		WarmGuests:     2,
		BlankGuests:    2,
		UIDStart:       1 << 28,
		OutputLimit:    16 << 20,
		Telemetry: TelemetryConfig{
			CPUOvercommit:    DefaultCPUOvercommit,
			MemoryOvercommit: DefaultMemoryOvercommit,
		},
	}
}

// Run runs the daemon until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if os.Geteuid() != 0 {
		return errors.New("paddock serve must run as root")
	}
	if err := sysmon.Calm(); err != nil {
		log.Debug("calming the runtime's monitor thread", "err", err)
	}
	for _, d := range []string{cfg.StateDir, cfg.RunDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := rundir.Mount(cfg.RunDir, log); err != nil {
		return err
	}
	node, err := joinCluster(ctx, &cfg, log.With("component", "cluster"))
	if err != nil {
		return err
	}
	if err := runtime.SetIDPrefix(cfg.IDPrefix); err != nil {
		return err
	}
	releasePID, err := holdPIDFile(cfg.RunDir)
	if err != nil {
		return err
	}
	defer releasePID()
	if cfg.Debug {
		stopDebug, err := serveDebug(cfg.RunDir, log)
		if err != nil {
			return err
		}
		defer stopDebug()
	} else {
		// Without the debug socket nothing reads this process's heap
		// profile, which the Go runtime keeps by default: a sample of
		// every 512 KiB allocated, each new call stack a record that is
		// never freed, found through a 1.4 MiB hash table whose pages
		// it touches at random. A thousand sandboxes made and removed
		// left 0.9 MiB more of that table resident (issue 21).
		goruntime.MemProfileRate = 0
	}
	if err := liftHostCaps(log); err != nil {
		// A host whose /proc/sys is read-only (a daemon in a container)
		// still runs sandboxes; they can deny each other these tables.
		log.Warn("host-wide caps stay: one sandbox can use up the host's open files or AIO contexts", "err", err)
	}
	trust, err := nodeTLS(cfg.Cluster, log.With("component", "cluster"))
	if err != nil {
		return err
	}
	listeners, tokens, err := listen(cfg, log.With("component", "auth"))
	if err != nil {
		return err
	}
	e2bL, e2bTokens, err := listenE2B(cfg, tokens, log.With("component", "auth"))
	if err != nil {
		for _, l := range listeners {
			l.Close()
		}
		return err
	}
	if e2bL != nil {
		defer e2bL.Close()
	}
	previewL, err := listenPreviews(cfg)
	if err != nil {
		for _, l := range listeners {
			l.Close()
		}
		return err
	}
	if previewL != nil {
		defer previewL.Close()
	}
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()

	st, err := store.Open(filepath.Join(cfg.StateDir, "paddock.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	cgroups, err := cgroup.NewManager(cfg.CgroupParent, log)
	if err != nil {
		return fmt.Errorf("setting up cgroups: %w", err)
	}
	// Disks, snapshots and volumes share one filesystem, so that a
	// snapshot or a fork clones blocks instead of copying them.
	storage := filepath.Join(cfg.StateDir, "storage")
	sub, err := disk.PrepareSubstrate(storage, disk.SubstrateOptions{Size: cfg.StorageSize}, log.With("component", "disk"))
	if err != nil {
		return fmt.Errorf("setting up storage: %w", err)
	}
	disks, err := disk.NewPool(disk.Config{
		Dir:         filepath.Join(storage, "disks"),
		Substrate:   sub,
		DefaultSize: cfg.Defaults.DiskBytes,
		PoolSize:    cfg.DiskPool,
		Overcommit:  cfg.DiskOvercommit,
		Logger:      log.With("component", "disk"),
	})
	if err != nil {
		return fmt.Errorf("setting up disks: %w", err)
	}
	defer disks.Close()
	volPool, err := disk.NewPool(disk.Config{Dir: filepath.Join(storage, "volumes"), Substrate: sub, DefaultSize: cfg.Defaults.DiskBytes, Overcommit: cfg.DiskOvercommit, Logger: log.With("component", "volume")})
	if err != nil {
		return fmt.Errorf("setting up volumes: %w", err)
	}
	vols, err := volume.Open(volume.Config{Disks: volPool, Store: st, DefaultSize: cfg.Defaults.DiskBytes, Logger: log.With("component", "volume")})
	if err != nil {
		volPool.Close()
		return fmt.Errorf("loading volumes: %w", err)
	}
	defer vols.Close()
	snapMounts, err := disk.NewPool(disk.Config{Dir: filepath.Join(storage, "snapmounts"), Substrate: sub, DefaultSize: cfg.Defaults.DiskBytes, Overcommit: cfg.DiskOvercommit, Logger: log.With("component", "snapshot")})
	if err != nil {
		return fmt.Errorf("setting up snapshot mounts: %w", err)
	}
	snaps, err := snapshot.Open(snapshot.Config{Dir: filepath.Join(storage, "snapshots"), Store: st, Mounts: snapMounts, Removed: disks.Forget, Logger: log.With("component", "snapshot")})
	if err != nil {
		snapMounts.Close()
		return fmt.Errorf("loading snapshots: %w", err)
	}
	defer snaps.Close()
	images, err := image.NewStore(filepath.Join(cfg.StateDir, "images"), log.With("component", "image"))
	if err != nil {
		return err
	}
	if _, err := images.Get(image.HostImage); err != nil {
		return err
	}
	ociImages, err := images.OpenOCI(log.With("component", "image"), oci.WithLimits(oci.Limits{MaxArchiveSize: cfg.Images.MaxArchiveBytes}))
	if err != nil {
		return err
	}
	defer ociImages.Close()
	prog, err := seccomp.Compile(seccomp.SandboxCaps)
	if err != nil {
		return fmt.Errorf("compiling seccomp profile: %w", err)
	}
	// The same filter as a base the forkers load once and a tail each
	// guest loads; where it cannot be split, each guest loads it whole.
	split, err := seccomp.CompileSplit(seccomp.SandboxCaps)
	if err != nil {
		log.Info("each guest loads the whole seccomp filter", "reason", err)
	}
	secrets, err := openSecrets(cfg)
	if err != nil {
		return err
	}
	gw, err := startGateway(cfg, secrets, log.With("component", "egress"))
	if err != nil {
		return err
	}
	if gw != nil {
		defer gw.Close()
	}
	tpls, err := template.Open(st, log.With("component", "template"))
	if err != nil {
		return err
	}
	arch, err := OpenArchive(cfg.Archive)
	if err != nil {
		return err
	}
	mgr := sandbox.NewManager(sandbox.Config{
		Archive:                 arch,
		ArchiveAfter:            cfg.Archive.After,
		Images:                  images,
		Store:                   st,
		Volumes:                 vols,
		Snapshots:               snaps,
		Templates:               tpls,
		Egress:                  egressOf(gw),
		Defaults:                cfg.Defaults,
		UIDStart:                cfg.UIDStart,
		Node:                    cfg.Cluster.NodeName,
		AllowInsecureRegistries: cfg.Images.AllowInsecureRegistries,
		Logger:                  log,
	})
	defer mgr.Close()
	tel, err := startTelemetry(cfg, cgroups, mgr, disks, log.With("component", "telemetry"))
	if err != nil {
		return err
	}
	defer tel.Close()
	// Records first: the runtime's warm guests take uid ranges, which
	// must not collide with those of recorded sandboxes.
	if err := mgr.Load(); err != nil {
		return err
	}
	rt, err := native.New(native.Config{
		RunDir:      cfg.RunDir,
		Cgroups:     cgroups,
		Disks:       disks,
		IDs:         mgr,
		Seccomp:     prog,
		SeccompBase: split.Base,
		SeccompTail: split.Tail,
		Caps:        seccomp.SandboxCaps,
		OutputLimit: cfg.OutputLimit,
		WarmGuests:  cfg.WarmGuests,
		BlankGuests: cfg.BlankGuests,
		NoFastGuest: cfg.NoFastGuest,
		WarmImage: func() (*image.Image, error) {
			return images.Get(image.HostImage)
		},
		WarmDiskBytes: cfg.Defaults.DiskBytes,
		WarmLimits:    cfg.Defaults,
		Network:       networkOf(gw),
		Logger:        log.With("component", "runtime"),
	})
	if err != nil {
		return err
	}
	defer rt.Close()
	tiers, err := runtimeTiers(cfg, rt, gvisor.Config{
		RunDir:      cfg.RunDir,
		Cgroups:     cgroups,
		Disks:       disks,
		IDs:         mgr,
		Caps:        seccomp.SandboxCaps,
		Seccomp:     prog,
		OutputLimit: cfg.OutputLimit,
		Network:     networkOf(gw),
		Logger:      log.With("component", "gvisor"),
	}, log)
	if err != nil {
		return err
	}
	defer tiers.CloseOthers()
	mgr.SetRuntime(tiers)
	// Containers' control sockets answer 503 until the API serves them,
	// below; the reconcile opens those of running sandboxes again.
	ctl, err := server.NewControlSockets(filepath.Join(cfg.RunDir, "control"), log.With("component", "control"))
	if err != nil {
		return err
	}
	defer ctl.Close()
	mgr.SetControls(ctl)
	if err := mgr.Reconcile(ctx); err != nil {
		return err
	}
	ctl.Prune(func(id string) bool {
		_, err := mgr.Get(ctx, id)
		return err == nil
	})
	mgr.Templates().Restore(ctx)
	mgr.Pools().Restore(ctx)
	if gw != nil {
		gw.Prune(func(id string) bool {
			_, err := mgr.Get(ctx, id)
			return err == nil || rt.IsWarm(id)
		})
		gatewayTelemetry(gw, tel, mgr, log.With("component", "egress"))
		gw.SetRequests(mgr)
	}
	// After the reconcile and the prune: what an earlier daemon kept
	// ready was a leftover, what this one builds is not.
	keepGvisorReady(tiers, cfg, images)

	tel.Prune(func(id string) bool {
		_, err := mgr.Get(ctx, id)
		return err == nil
	})
	tel.Run()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchStorage(watchCtx, disks, log.With("component", "disk"))
	// After a mass removal: the network slots kept for churn beyond
	// those made ahead, and the store's mapped pages.
	release := func() error {
		if gw != nil {
			gw.TrimSlots()
		}
		return st.Release()
	}
	// The disks' teardowns go on behind the sandboxes' (a thousand took
	// seconds more): counted, the last trim waits for them, and what
	// they allocated is returned too (issue 21).
	count := func() int { return mgr.Len() + disks.Reaping() }
	go trimMemory(watchCtx, count, release, log)

	srv := server.New(mgr, api.VersionInfo{
		Version:   cfg.Version,
		Runtime:   tiers.Name(),
		Runtimes:  tiers.Versions(cfg.Version),
		CgroupV2:  cgroups.Mode() == cgroup.V2,
		Idmapped:  rt.Idmapped(),
		GoVersion: goruntime.Version(),
	}, log.With("component", "server"))
	if gw != nil {
		srv.SetSecrets(gw.Secrets())
	}
	srv.SetTelemetry(tel)
	ctl.Serve(srv)
	errc := make(chan error, len(listeners)+2) // and the facade's and the previews' listeners
	var servers []*http.Server
	if previewL != nil {
		srv.SetPreviewBase(previewBase(previewL))
		if cfg.PreviewDomain != "" {
			if err := srv.SetPreviewDomain(previewDomainBase(cfg.PreviewDomain, previewL)); err != nil {
				return fmt.Errorf("--preview-domain: %w", err)
			}
		}
		hs := server.NewHTTPServer(srv.PreviewHandler(), cfg.HTTP, log)
		pl := server.Guard(hs, previewL, cfg.HTTP, log)
		servers = append(servers, hs)
		go func() { errc <- hs.Serve(pl) }()
		log.Info("serving preview URLs", "addr", "tcp://"+previewL.Addr().String())
	}
	if e2bL != nil {
		hs, err := serveE2B(e2bL, trust, e2bTokens, cfg, mgr, st, secrets, tel, log.With("component", "e2b"), errc)
		if err != nil {
			return err
		}
		servers = append(servers, hs)
	}
	// The API takes every token of the file as it is now; the daemon's
	// own client and the console's sessions keep the one presented at
	// start (a token rotation that removes it needs a restart for them).
	var token string
	if tokens != nil {
		token = tokens.Present()
	}
	self := selfClient(listeners, token, trust != nil, log)
	if self != nil {
		defer self.Close()
	}
	mcpH := MCPHandler(self, cfg.Version, log.With("component", "mcp"))
	for _, l := range listeners {
		tok, toks := "", server.Tokens(nil)
		if l.Addr().Network() == "tcp" {
			tok, toks = token, tokens
		}
		hs := server.NewHTTPServer(Surfaces(srv.TokensHandler(toks), self, mcpH, tok, toks, log), cfg.HTTP, log)
		if tok != "" {
			l = guardTCP(hs, l, trust, cfg.HTTP, log)
		} else {
			// Exec output streams through the API's connections.
			hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
				wire.SetSendBuffer(c)
				return ctx
			}
		}
		servers = append(servers, hs)
		go func(l net.Listener) { errc <- hs.Serve(l) }(l)
		log.Info("listening", "addr", l.Addr().Network()+"://"+l.Addr().String())
	}
	log.Info("paddock ready", "version", cfg.Version, "state_dir", cfg.StateDir, "cgroup_v2", cgroups.Mode() == cgroup.V2, "idmapped", rt.Idmapped(), "storage", sub.Mode(), "reflink", sub.Reflink())

	// In a cluster the node is announced once it serves, and withdrawn
	// (its Lease released) before it stops serving.
	stopNode := func() {}
	if node != nil {
		nctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			node.Run(nctx, nodeStatus(tel, mgr, disks, log.With("component", "cluster")))
			close(done)
		}()
		objectsDone := make(chan struct{})
		go func() {
			reconcileObjects(nctx, &cfg, node, mgr, secrets, log.With("component", "reconcile"))
			close(objectsDone)
		}()
		stopNode = func() { cancel(); <-done; <-objectsDone }
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopNode()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range servers {
		hs.Shutdown(sctx)
	}
	// Removals answered before the stop finish their teardowns here, or
	// at the next start (they are recorded).
	if err := mgr.Settle(sctx); err != nil {
		log.Warn("stopping with teardowns unfinished; the next start finishes them", "err", err)
	}
	log.Info("paddock stopped; sandboxes keep running")
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listenPreviews opens the preview listener (--preview-listen), early
// with the others.
func listenPreviews(cfg Config) (net.Listener, error) {
	if cfg.PreviewListen == "" {
		if cfg.PreviewDomain != "" {
			return nil, errors.New("--preview-domain needs --preview-listen, the listener its host names reach")
		}
		return nil, nil
	}
	u, err := url.Parse(cfg.PreviewListen)
	if err != nil || u.Scheme != "tcp" || u.Host == "" {
		return nil, fmt.Errorf("--preview-listen %q is not tcp://HOST:PORT", cfg.PreviewListen)
	}
	for _, addr := range cfg.Listen {
		if strings.TrimPrefix(addr, "tcp://") == u.Host {
			return nil, fmt.Errorf("--preview-listen %s is also a --listen address: previews need a port of their own", u.Host)
		}
	}
	l, err := net.Listen("tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.PreviewListen, err)
	}
	return l, nil
}

// previewDomainBase is --preview-domain as a URL: a bare domain is
// plain HTTP on the preview listener's port.
func previewDomainBase(domain string, l net.Listener) string {
	if strings.Contains(domain, "://") {
		return domain
	}
	return "http://" + net.JoinHostPort(domain, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
}

// previewBase is the URL previews are printed under: the preview
// listener's (the host's name for an unspecified address).
func previewBase(l net.Listener) string {
	a := l.Addr().(*net.TCPAddr)
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		if host, _ = os.Hostname(); host == "" {
			host = "localhost"
		}
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// guardTCP bounds a TCP listener's connections (server.Guard) and, on a
// cluster node with trust, takes only gateways' TLS connections.
func guardTCP(hs *http.Server, l net.Listener, trust *clustertls.Node, cfg server.HTTPConfig, log *slog.Logger) net.Listener {
	l = server.Guard(hs, l, cfg, log)
	if trust != nil {
		l = tls.NewListener(l, trust.ServerConfig())
	}
	return l
}

// listen opens every listener before anything else, so that a second
// daemon on the same socket fails fast instead of reconciling the first
// one's sandboxes away.
func listen(cfg Config, log *slog.Logger) ([]net.Listener, *clustertls.Tokens, error) {
	var out []net.Listener
	var tokens *clustertls.Tokens
	fail := func(err error) ([]net.Listener, *clustertls.Tokens, error) {
		for _, l := range out {
			l.Close()
		}
		return nil, nil, err
	}
	for _, addr := range cfg.Listen {
		switch {
		case strings.HasPrefix(addr, "unix://"):
			path := strings.TrimPrefix(addr, "unix://")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fail(err)
			}
			if c, err := net.Dial("unix", path); err == nil {
				c.Close()
				return fail(fmt.Errorf("another daemon is serving %s", path))
			}
			os.Remove(path)
			l, err := net.Listen("unix", path)
			if err != nil {
				return fail(fmt.Errorf("listening on %s: %w", addr, err))
			}
			if err := os.Chmod(path, 0o660); err != nil {
				l.Close()
				return fail(err)
			}
			out = append(out, l)
		case strings.HasPrefix(addr, "tcp://"):
			u, err := url.Parse(addr)
			if err != nil || u.Host == "" {
				return fail(fmt.Errorf("listen address %q is not tcp://HOST:PORT", addr))
			}
			if cfg.TokenFile == "" {
				return fail(fmt.Errorf("listening on %s needs --token-file: TCP clients must present a bearer token", addr))
			}
			if tokens == nil {
				if tokens, err = clustertls.LoadTokens(cfg.TokenFile, log); err != nil {
					return fail(fmt.Errorf("--token-file: %w", err))
				}
			}
			l, err := net.Listen("tcp", u.Host)
			if err != nil {
				return fail(fmt.Errorf("listening on %s: %w", addr, err))
			}
			out = append(out, l)
		default:
			return fail(fmt.Errorf("listen address %q must start with unix:// or tcp://", addr))
		}
	}
	return out, tokens, nil
}
