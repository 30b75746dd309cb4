// Package gateway is each sandbox's way out: it runs the egress proxy, the
// DNS resolver and the self endpoint on the host, wires every sandbox's
// network namespace to them (package network), and keeps per sandbox what
// that needs: its CA (for the hosts whose TLS the proxy intercepts), the
// resolv.conf, hosts and CA bundle bound into it, the /run/paddock tree the
// agent reads about itself, and its policy in the egress engine.
//
// Layout under Config.Dir:
//
//	secrets/                the encrypted secret store (package egress)
//	ca/<generation>/        the current CA generation: ca.pem, ca.key (0600), ca-bundle.crt
//	sandboxes/<id>/ca.pem   the sandbox's CA certificate (and ca.key, 0600), bound read-only
//	sandboxes/<id>/files/   hosts, ca-bundle.crt (bound read-only)
//	resolv/<host addr>.conf the resolv.conf of the sandboxes on that address (bound read-only)
//	sandboxes/<id>/self/    the /run/paddock tree (bound read-only, kept current)
//	sandboxes/<id>/.next-*  the self tree files' next versions, exchanged in (spare.go)
//	self/                   a new self tree's files, linked into it (see selfDefaults)
//	spare/.spare-<n>/       a removed sandbox's directory, emptied for the next (spare.go)
//
// A sandbox with no policy reaches nothing: the network's nftables rules
// send all of its TCP to the proxy and its DNS to the resolver, which
// allow nothing without a rule.
package gateway

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/connlimit"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/egress/dns"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/spare"
)

// Inside the sandbox.
const (
	bundlePath = "/etc/ssl/certs/ca-certificates.crt"
	caPath     = "/etc/paddock/ca.pem"
	selfPath   = "/run/paddock"
	// SelfHost is the name that reaches the self endpoint.
	SelfHost = "paddock.internal"
)

// Config configures a Gateway.
type Config struct {
	// Dir holds secrets and per-sandbox files (StateDir/gateway).
	Dir string
	// Name and Subnet configure the network (defaults: "paddock",
	// 10.224.0.0/16). Daemons on one host need distinct ones.
	Name   string
	Subnet netip.Prefix
	// Upstream lists the DNS servers ("ip:port") the resolver asks;
	// empty reads the host's /etc/resolv.conf.
	Upstream []string
	// RootCAs verifies upstream TLS of intercepted hosts; nil: the host's.
	RootCAs *x509.CertPool
	// SystemBundle is the host's CA bundle, the base of every sandbox's
	// bundle. Default /etc/ssl/certs/ca-certificates.crt.
	SystemBundle string
	// Secrets are the secrets bindings inject; nil opens Dir/secrets.
	Secrets *egress.SecretStore
	Logger  *slog.Logger
}

// Event is one egress decision (Egress set) or DNS query (DNS set).
type Event struct {
	Egress *egress.Event
	DNS    *dns.Query
}

// Gateway is the running egress path.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	net     *network.Manager
	eng     *egress.Engine
	secrets *egress.SecretStore
	proxy   *egress.Proxy
	dns     *dns.Server
	self    *http.Server
	selfLn  net.Listener
	proxyLn net.Listener
	bundle  []byte // the host's CA bundle

	mu       sync.Mutex
	events   func(id string, e Event)
	selfFn   func(id string) (api.Self, error)
	requests Requests
	cas      map[string]*egress.CA
	denials  map[string][]egress.Event // recent denials per sandbox, newest last
	// casPeak and denialsPeak are for shrink.Map.
	casPeak, denialsPeak int

	// genMu orders the hand-out of the current CA generation against its
	// replacement, which removes the old generation's directory: links
	// to its files are made under it.
	genMu sync.Mutex
	gen   *caGen

	// selfMu orders the self writer against Attach and Forget: the
	// writer writes only into a tree in selfTrees, which Attach (or
	// Restore) made and Forget takes out before it removes the files, so
	// no write can land in a directory being removed.
	selfMu    sync.Mutex
	selfTrees map[string]*selfTree
	selfPeak  int // for shrink.Map

	spares *spare.Pool // removed sandboxes' directories (spare.go)

	stop chan struct{}
	wake chan struct{} // refresh the self trees of dirty now
	asks chan autoAsk  // refusals that ask for their host (askLoop)
	wg   sync.WaitGroup

	// dirty are the sandboxes whose self trees poke asked to refresh
	// before the next tick.
	dirtyMu sync.Mutex
	dirty   map[string]struct{}
}

var (
	_ runtime.NetSlots    = (*Gateway)(nil)
	_ runtime.Readdresser = (*Gateway)(nil)
)

// netSlots is how many network slots the network keeps ready ahead of
// the guests that take them; recycled ones come back on top (up to the
// network's MaxSlots), so under churn few are made.
const netSlots = 8

// maxDenials is how many recent denials each sandbox's self view keeps.
const maxDenials = 50

// Start starts the proxy, resolver and self endpoint and installs the
// network's rules.
func Start(cfg Config) (_ *Gateway, retErr error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SystemBundle == "" {
		cfg.SystemBundle = "/etc/ssl/certs/ca-certificates.crt"
	}
	if len(cfg.Upstream) == 0 {
		cfg.Upstream = hostResolvers("/etc/resolv.conf")
	}
	// A CA generation is never taken up again after a restart: the
	// sandboxes that use one hold links to its files.
	os.RemoveAll(filepath.Join(cfg.Dir, "ca"))
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "sandboxes"), filepath.Join(cfg.Dir, "resolv"), filepath.Join(cfg.Dir, "self"), filepath.Join(cfg.Dir, "ca"), filepath.Join(cfg.Dir, "spare")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, cas: map[string]*egress.CA{}, denials: map[string][]egress.Event{}, selfTrees: map[string]*selfTree{}, stop: make(chan struct{}), wake: make(chan struct{}, 1), asks: make(chan autoAsk, 64)}
	var cleanups []func()
	defer func() {
		if retErr != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	var err error
	if g.spares, err = spare.Open(filepath.Join(cfg.Dir, "spare")); err != nil {
		return nil, err
	}
	if g.bundle, err = os.ReadFile(cfg.SystemBundle); err != nil {
		g.log.Warn("no host CA bundle; sandboxes trust only their own CA", "path", cfg.SystemBundle, "err", err)
	}
	if err := g.writeSelfDefaults(); err != nil {
		return nil, err
	}
	if g.secrets = cfg.Secrets; g.secrets == nil {
		if g.secrets, err = egress.OpenSecretStore(filepath.Join(cfg.Dir, "secrets")); err != nil {
			return nil, err
		}
	}
	g.eng = egress.NewEngine(egress.EngineConfig{GrantUsed: g.grantUsed})

	// The listeners take any port; the network's rules redirect to them.
	// The proxy's is kept across restarts where it can be: it is in the
	// sandboxes' HTTP_PROXY, which running processes keep.
	if g.proxyLn, err = listenProxy(filepath.Join(cfg.Dir, "proxy-port")); err != nil {
		return nil, fmt.Errorf("listening for the egress proxy: %w", err)
	}
	cleanups = append(cleanups, func() { g.proxyLn.Close() })
	if g.selfLn, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
		return nil, fmt.Errorf("listening for the self endpoint: %w", err)
	}
	cleanups = append(cleanups, func() { g.selfLn.Close() })
	g.dns, err = dns.Start(dns.Config{
		Addr:     "0.0.0.0:0",
		Upstream: cfg.Upstream,
		Sandbox:  g.lookup,
		Allowed: func(id, name string) (bool, string) {
			d := g.eng.DecideName(id, name)
			return d.Allow, d.Rule
		},
		Special: map[string]func(string) []netip.Addr{SelfHost: g.hostAddr},
		Log: func(id string, q dns.Query) {
			if !q.Allowed && q.Rcode == "REFUSED" {
				// A refused name is the first thing an agent's curl hits:
				// its self view must say why and what would allow it.
				d := g.eng.DecideName(id, q.Name)
				g.noteDenial(id, egress.Event{Time: q.Time, Kind: egress.KindDNS, Action: "deny", Host: q.Name,
					Rule: d.Rule, Reason: "the resolver refused the name: " + d.Reason, Suggest: d.Suggest})
			}
			if f := g.eventSink(); f != nil {
				f(id, Event{DNS: &q})
			}
		},
		Logger: g.log.With("part", "dns"),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the resolver: %w", err)
	}
	cleanups = append(cleanups, func() { g.dns.Close() })
	g.net, err = network.New(network.Config{
		Subnet:    cfg.Subnet,
		Name:      cfg.Name,
		ProxyPort: port(g.proxyLn.Addr()),
		DNSPort:   g.dns.Addr().Port(),
		SelfPort:  port(g.selfLn.Addr()),
		Slots:     netSlots,
		Logger:    g.log.With("part", "network"),
	})
	if err != nil {
		return nil, fmt.Errorf("setting up the network: %w", err)
	}
	cleanups = append(cleanups, func() { g.net.Close() })
	g.proxy, err = egress.Start(egress.ProxyConfig{
		Listener:    g.proxyLn,
		Engine:      g.eng,
		Sandbox:     g.lookup,
		OriginalDst: g.originalDst,
		CA:          g.ca,
		Secrets:     g.secrets,
		Resolve:     g.dns.Resolve,
		RootCAs:     cfg.RootCAs,
		Events:      g.event,
		Logger:      g.log.With("part", "proxy"),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the egress proxy: %w", err)
	}
	// The self endpoint's listener is on every address of the host, so
	// any peer that reaches the host can connect: a connection answers
	// one request and is closed, and says so (connlimit: none is ever
	// authenticated), and silent ones are bounded per peer and in all.
	selfLn := connlimit.New(g.selfLn, connlimit.Limits{}, g.log.With("part", "self"))
	g.self = &http.Server{Handler: connlimit.Handler(http.HandlerFunc(g.serveSelf)), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second, ConnState: selfLn.ConnState,
		ConnContext: connlimit.ConnContext, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)}
	go g.self.Serve(selfLn)
	g.wg.Add(2)
	go g.refreshSelf(time.Second)
	go g.askLoop()
	g.log.Info("egress gateway up", "proxy_port", port(g.proxyLn.Addr()), "dns_port", g.dns.Addr().Port(), "self_port", port(g.selfLn.Addr()), "upstream_dns", cfg.Upstream)
	return g, nil
}

func port(a net.Addr) uint16 { return uint16(a.(*net.TCPAddr).Port) }

// listenProxy listens for the egress proxy on the port recorded in file
// (an earlier daemon's), or else on any port, and records it.
func listenProxy(file string) (net.Listener, error) {
	if b, err := os.ReadFile(file); err == nil {
		if p, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 16); err == nil && p > 0 {
			if ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", p)); err == nil {
				return ln, nil
			}
		}
	}
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	if err := durable.Replace(file, []byte(fmt.Sprintf("%d\n", port(ln.Addr()))), 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// errToProxy is originalDst's answer for a connection to the proxy.
var errToProxy = errors.New("addressed to the proxy")

// originalDst is where a sandbox's redirected connection was going: to
// the proxy itself (an error: explicit proxy mode) when it went to the
// proxy's port on the host side of any block of the subnet. HTTP_PROXY
// names the sandbox's host-side address, and a process keeps the one it
// started with: after a memory resume its sandbox holds another block.
func (g *Gateway) originalDst(c net.Conn) (netip.AddrPort, error) {
	dst, err := egress.OriginalDst(c)
	if err == nil && dst.Port() == port(g.proxyLn.Addr()) && g.net.HostSide(dst.Addr()) {
		return netip.AddrPort{}, errToProxy
	}
	return dst, err
}

// hostResolvers reads the nameservers of a resolv.conf.
func hostResolvers(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53).String())
			}
		}
	}
	return out
}

func (g *Gateway) lookup(a netip.Addr) (string, bool) { return g.net.Lookup(a) }

// hostAddr is the host side of a sandbox's link: what paddock.internal
// resolves to for it.
func (g *Gateway) hostAddr(id string) []netip.Addr {
	if l, ok := g.net.Link(id); ok {
		return []netip.Addr{l.HostAddr}
	}
	return nil
}

func (g *Gateway) event(id string, e egress.Event) {
	if e.Action == "deny" {
		g.noteDenial(id, e)
	}
	if f := g.eventSink(); f != nil {
		f(id, Event{Egress: &e})
	}
}

// noteDenial keeps a refusal for the sandbox's self view. A refused name
// is asked again at once (A and AAAA, retries, search domains): one entry
// stands for the repeats of the last few seconds.
func (g *Gateway) noteDenial(id string, e egress.Event) {
	g.mu.Lock()
	d := g.denials[id]
	if e.Kind == egress.KindDNS {
		for i := len(d) - 1; i >= max(0, len(d)-4); i-- {
			if p := &d[i]; p.Kind == e.Kind && p.Host == e.Host && e.Time.Sub(p.Time) < 5*time.Second {
				p.Time = e.Time
				g.mu.Unlock()
				return
			}
		}
	}
	d = append(d, e)
	if len(d) > maxDenials {
		d = d[len(d)-maxDenials:]
	}
	g.denials[id] = d
	g.mu.Unlock()
	g.maybeAsk(id, e)
	g.poke(id)
}

// poke asks for sandbox id's self tree to be refreshed now, not the
// whole pass a tick makes: every create pokes (SetPolicy), and a pass
// over every sandbox and warm guest for each was 5% of the daemon's CPU
// under churn (issue 21). Pokes made while a refresh runs are taken
// together by the next.
func (g *Gateway) poke(id string) {
	g.dirtyMu.Lock()
	if g.dirty == nil {
		g.dirty = map[string]struct{}{}
	}
	g.dirty[id] = struct{}{}
	g.dirtyMu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// SetEvents sets where every egress decision and DNS query goes (the
// sandbox's event log); f must not block.
func (g *Gateway) SetEvents(f func(id string, e Event)) {
	g.mu.Lock()
	g.events = f
	g.mu.Unlock()
}

// SetSelf sets what is added to a sandbox's self view (limits, usage,
// budgets).
func (g *Gateway) SetSelf(f func(id string) (api.Self, error)) {
	g.mu.Lock()
	g.selfFn = f
	g.mu.Unlock()
}

func (g *Gateway) eventSink() func(string, Event) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.events
}

func (g *Gateway) dir(id string) string { return filepath.Join(g.cfg.Dir, "sandboxes", id) }

// ca returns sandbox id's CA, loading it from disk the first time.
func (g *Gateway) ca(id string) (*egress.CA, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ca := g.cas[id]; ca != nil {
		return ca, nil
	}
	cert, err := os.ReadFile(filepath.Join(g.dir(id), "ca.pem"))
	if err != nil {
		return nil, fmt.Errorf("loading the CA of %s: %w", id, err)
	}
	key, err := os.ReadFile(filepath.Join(g.dir(id), "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("loading the CA of %s: %w", id, err)
	}
	ca, err := egress.LoadCA(cert, key)
	if err != nil {
		return nil, err
	}
	g.cas[id] = ca
	return ca, nil
}

// Attach implements runtime.Network: it wires the namespace and writes
// the files the sandbox gets. A sandbox that had a CA keeps it.
func (g *Gateway) Attach(id string, netnsFD int) (runtime.NetSetup, error) {
	p, err := g.prepare(id)
	if err != nil {
		return runtime.NetSetup{}, err
	}
	link, err := g.net.Attach(id, netnsFD)
	if err != nil {
		return runtime.NetSetup{}, err
	}
	files, err := g.writeFiles(id, p, link.HostAddr)
	if err != nil {
		g.net.Detach(id)
		return runtime.NetSetup{}, err
	}
	state, _ := json.Marshal(link)
	proxy := fmt.Sprintf("http://%s:%d", link.HostAddr, port(g.proxyLn.Addr()))
	var env []string
	for k, v := range egress.SandboxEnv(proxy, bundlePath) {
		env = append(env, k+"="+v)
	}
	env = append(env, "NO_PROXY=localhost,127.0.0.1,::1,"+SelfHost, "no_proxy=localhost,127.0.0.1,::1,"+SelfHost)
	return runtime.NetSetup{State: state, Files: files, Env: env}, nil
}

// prepared is what prepare made of a sandbox's directory.
type prepared struct {
	ca *egress.CA
	// bundled says its CA bundle is linked from its CA generation.
	bundled bool
	// recycled says the directory is a spare (spare.go): its files/hosts
	// and files/hostname are a removed sandbox's, to be written over.
	recycled bool
}

// prepare makes sandbox id's directory (or takes a spare) and self tree
// and returns its CA: the one it had, or the current generation's, whose
// files (its bundle among them) it links into the sandbox's directory.
func (g *Gateway) prepare(id string) (prepared, error) {
	dir := g.dir(id)
	recycled := g.takeSpare(dir)
	if !recycled {
		for _, d := range []string{dir, filepath.Join(dir, "files"), filepath.Join(dir, "self")} {
			// Mkdir first: MkdirAll stats the path and its parent before it
			// makes it, two more path walks for each of the three.
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return prepared{}, err
				}
			}
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return prepared{}, err
		}
	}
	tree, err := g.linkSelfDefaults(filepath.Join(dir, "self"))
	if err != nil {
		return prepared{}, err
	}
	g.selfMu.Lock()
	g.selfTrees[id] = tree
	g.selfMu.Unlock()
	if ca, err := g.ca(id); err == nil {
		return prepared{ca: ca, recycled: recycled}, nil
	}
	ca, err := g.takeGeneration(dir)
	if err != nil {
		return prepared{}, err
	}
	g.mu.Lock()
	g.cas[id] = ca
	g.mu.Unlock()
	return prepared{ca: ca, bundled: true, recycled: recycled}, nil
}

// A CA generation is one CA, and the bundle that adds it to the host's,
// shared by the sandboxes made while it is current (caGenSandboxes of
// them, or for caGenAge). Each sandbox's directory holds hard links to
// its files, so that everything that reads a sandbox's CA (its binds, a
// restarted daemon's reload) finds it there, as when each had a CA of its
// own, and removing the sandbox removes only its links. A bundle copy
// per sandbox (the host's 220 KB bundle plus its CA, written and later
// removed, and a new key) was the largest part of the daemon's files
// work on the create path.
//
// What sharing keeps: the CA's key never leaves the daemon, and the proxy
// presents a leaf it signs only on a connection of the sandbox it
// intercepts, so a sandbox holds nothing that another one trusts: it can
// no more impersonate a host to a sandbox of its generation than to any
// other. No host trusts a generation's CA.
const (
	caGenSandboxes = 64
	caGenAge       = time.Hour
)

// caGen is a CA generation: its directory under Dir/ca and its CA.
type caGen struct {
	dir  string
	ca   *egress.CA
	uses int
	made time.Time
}

// genFiles are a generation's files, each linked to the same name in a
// sandbox's directory.
var genFiles = []string{"ca.key", "ca.pem", filepath.Join("files", "ca-bundle.crt")}

// takeGeneration links the current CA generation's files into a
// sandbox's directory, making a new generation first when the current one
// has served its share, and returns its CA.
func (g *Gateway) takeGeneration(dir string) (*egress.CA, error) {
	g.genMu.Lock()
	defer g.genMu.Unlock()
	if g.gen == nil || g.gen.uses >= caGenSandboxes || time.Since(g.gen.made) >= caGenAge {
		gen, err := g.newGeneration()
		if err != nil {
			return nil, err
		}
		if old := g.gen; old != nil {
			// Its sandboxes keep their links, and with them its files.
			os.RemoveAll(old.dir)
		}
		g.gen = gen
	}
	for _, name := range genFiles {
		if err := linkFile(filepath.Join(g.gen.dir, filepath.Base(name)), filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("linking the sandbox's CA: %w", err)
		}
	}
	g.gen.uses++
	return g.gen.ca, nil
}

// newGeneration makes a CA and writes its generation's directory whole
// (a temporary name, renamed once written). g.genMu is held.
func (g *Gateway) newGeneration() (_ *caGen, retErr error) {
	name := fmt.Sprintf("%x", time.Now().UnixNano())
	ca, err := egress.NewCA("generation " + name)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(g.cfg.Dir, "ca")
	tmp, err := os.MkdirTemp(root, ".new-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		b    []byte
		perm os.FileMode
	}{{"ca.key", ca.KeyPEM(), 0o600}, {"ca.pem", ca.CertPEM(), 0o644}, {"ca-bundle.crt", g.bundleWith(ca), 0o644}} {
		if err := writeNew(filepath.Join(tmp, f.name), f.b, f.perm); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(root, name)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	return &caGen{dir: dir, ca: ca, made: time.Now()}, nil
}

// bundleWith is the host's CA bundle with ca added.
func (g *Gateway) bundleWith(ca *egress.CA) []byte {
	return append(append(append([]byte(nil), g.bundle...), '\n'), ca.CertPEM()...)
}

// linkFile links src at dst, replacing what a crash left there.
func linkFile(src, dst string) error {
	err := os.Link(src, dst)
	if errors.Is(err, fs.ErrExist) {
		if err = os.Remove(dst); err == nil {
			err = os.Link(src, dst)
		}
	}
	return err
}

// writeFiles writes the files sandbox id, prepared as p, gets whose host
// side is host, and returns their binds: its CA bundle unless it is
// linked from its CA generation (a CA the sandbox had).
func (g *Gateway) writeFiles(id string, p prepared, host netip.Addr) ([]runtime.FileBind, error) {
	dir := g.dir(id)
	// Files are made on the create's path (a warm guest's build), and
	// making one costs more than writing it: a sandbox gets only those
	// that are its own. Its CA certificate is bound from ca.pem, and its
	// resolv.conf, which names only its address's host side, is one per
	// address, written once.
	// Its hostname file is one too: a guest that wrote /etc/hostname
	// itself copied /etc up into the sandbox's disk and gave the disk a
	// data block to flush at the overlay's unmount, for every sandbox.
	for _, f := range []struct {
		name string
		body []byte
	}{
		{"hosts", []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + id + "\n" + host.String() + "\t" + SelfHost + "\n")},
		{"hostname", []byte(id + "\n")},
	} {
		path := filepath.Join(dir, "files", f.name)
		if !p.recycled || overwrite(path, f.body) != nil {
			if err := writeNew(path, f.body, 0o644); err != nil {
				return nil, err
			}
		}
	}
	if !p.bundled {
		if err := writeNew(filepath.Join(dir, "files", "ca-bundle.crt"), g.bundleWith(p.ca), 0o644); err != nil {
			return nil, err
		}
	}
	resolv, err := g.resolvConf(host)
	if err != nil {
		return nil, err
	}
	f := filepath.Join(dir, "files")
	return []runtime.FileBind{
		{Source: resolv, Dest: "/etc/resolv.conf"},
		{Source: filepath.Join(f, "hosts"), Dest: "/etc/hosts"},
		{Source: filepath.Join(f, "hostname"), Dest: runtime.HostnamePath},
		{Source: filepath.Join(f, "ca-bundle.crt"), Dest: bundlePath},
		{Source: filepath.Join(dir, "ca.pem"), Dest: caPath},
		{Source: filepath.Join(dir, "self"), Dest: selfPath, Dir: true},
	}, nil
}

// writeNew writes a sandbox's file: a new one directly, one that exists
// (a sandbox attached again, which may be reading it) through
// durable.Replace. A new file needs no temporary file and rename: nothing
// reads it before Attach returns (the sandbox's address leads to it only
// once the network is attached, after its CA is written), and a crash
// that leaves it torn leaves a sandbox that was never acknowledged; a
// torn CA fails to load and is made again at the next Attach.
func writeNew(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return durable.Replace(path, b, perm)
	}
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(perm) // whatever the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// resolvConf returns the resolv.conf of the sandboxes whose host-side
// address is host (the resolver's address for them), writing it the first
// time.
func (g *Gateway) resolvConf(host netip.Addr) (string, error) {
	path := filepath.Join(g.cfg.Dir, "resolv", host.String()+".conf")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	b := []byte("# paddock: every query goes to paddock's resolver, which answers\n# only the names this sandbox's policy allows.\nnameserver " + host.String() + "\noptions ndots:0\n")
	if err := durable.Replace(path, b, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// Restore implements runtime.Network.
func (g *Gateway) Restore(id string, state []byte) error {
	var l network.Link
	if err := json.Unmarshal(state, &l); err != nil {
		return fmt.Errorf("decoding network state: %w", err)
	}
	if err := g.net.Restore(id, l); err != nil {
		return err
	}
	// The self tree holds what the last daemon wrote: all of it is
	// written again.
	if _, err := os.Stat(filepath.Join(g.dir(id), "self")); err == nil {
		g.selfMu.Lock()
		g.selfTrees[id] = &selfTree{written: map[string]uint64{}}
		g.selfMu.Unlock()
	}
	return nil
}

// Detach implements runtime.Network.
func (g *Gateway) Detach(id string) {
	if err := g.net.Detach(id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		g.log.Warn("detaching network", "sandbox", id, "err", err)
	}
}

// Readdress implements runtime.Readdresser.
func (g *Gateway) Readdress(id string, netnsFD int) error { return g.net.Readdress(id, netnsFD) }

// TakeNetns implements runtime.NetSlots.
func (g *Gateway) TakeNetns() (runtime.NetNS, error) {
	s, err := g.net.TakeSlot()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// TrimSlots destroys the network's ready slots beyond those it keeps
// ahead (network's TrimSlots), and returns how many.
func (g *Gateway) TrimSlots() int { return g.net.TrimSlots() }

// Recycle implements runtime.NetSlots. The proxy and the resolver find a
// sandbox by its address (network's Lookup), which no longer names this
// one; the address names the next sandbox only once that one attaches.
// Its files' directory is recycled too, once it is forgotten: no process
// of the sandbox is left to see it (spare.go).
func (g *Gateway) Recycle(id string) {
	if err := g.net.Recycle(id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		g.log.Warn("recycling network", "sandbox", id, "err", err)
	}
	g.markEnded(id)
}

// markEnded records that sandbox id's processes have all ended.
func (g *Gateway) markEnded(id string) {
	g.selfMu.Lock()
	if tree := g.selfTrees[id]; tree != nil {
		tree.ended = true
	}
	g.selfMu.Unlock()
}

// CaptureEgress sends sandbox id's outbound TCP connections to port, where
// its egress sidecar listens, but those of host uids firstUID..lastUID
// (the sidecar's own), which meet the policy as any sandbox's do.
func (g *Gateway) CaptureEgress(id string, port uint16, firstUID, lastUID uint32) error {
	return g.net.SetCapture(id, &network.Capture{Port: port, FirstUID: firstUID, LastUID: lastUID})
}

// Forget implements runtime.Network.
func (g *Gateway) Forget(id string) {
	g.Detach(id)
	g.eng.Remove(id)
	g.mu.Lock()
	delete(g.cas, id)
	delete(g.denials, id)
	g.cas = shrink.Map(g.cas, &g.casPeak)
	g.denials = shrink.Map(g.denials, &g.denialsPeak)
	g.mu.Unlock()
	g.removeFiles(id)
}

// removeFiles removes sandbox id's directory, once no self write can
// land in it, or keeps it as a spare if the sandbox's processes have
// ended.
func (g *Gateway) removeFiles(id string) {
	g.selfMu.Lock() // waits for a write into id's tree under way
	tree := g.selfTrees[id]
	delete(g.selfTrees, id)
	g.selfTrees = shrink.Map(g.selfTrees, &g.selfPeak)
	g.selfMu.Unlock()
	if tree != nil && tree.ended && g.recycleDir(g.dir(id)) {
		return
	}
	if err := os.RemoveAll(g.dir(id)); err != nil {
		g.log.Warn("removing a sandbox's gateway files", "sandbox", id, "err", err)
	}
}

// Prune removes what sandboxes not in keep left behind (after a daemon
// restart, once the manager has reconciled).
func (g *Gateway) Prune(keep func(id string) bool) {
	ents, _ := os.ReadDir(filepath.Join(g.cfg.Dir, "sandboxes"))
	for _, e := range ents {
		if !keep(e.Name()) {
			g.Forget(e.Name())
		}
	}
	if n := g.net.Prune(); n > 0 {
		g.log.Info("removed stale sandbox links", "count", n)
	}
}

// ValidatePolicy checks a policy and names its first bad entry.
func (g *Gateway) ValidatePolicy(p *api.Policy) error {
	if p == nil {
		return nil
	}
	if len(p.Grants) > 0 {
		return errdefs.Invalid("policy", "grants: the daemon sets them from approved requests (paddock requests approve)")
	}
	if err := egress.ValidatePolicy(p); err != nil {
		return errdefs.Invalid("policy", "%s", strings.TrimPrefix(err.Error(), errdefs.ErrInvalid.Error()+": "))
	}
	for _, b := range p.Secrets {
		if _, err := g.secrets.Get(b.Name); err != nil {
			return errdefs.Invalid("policy", "secrets: no secret named %q (create it with `paddock secret create %s`)", b.Name, b.Name)
		}
	}
	return nil
}

// SetPolicy applies sandbox id's policy to new connections and requests
// (nil: nothing is reachable) and returns the environment its secrets'
// placeholders take.
func (g *Gateway) SetPolicy(id string, p *api.Policy) ([]string, error) {
	if err := g.eng.Set(id, p); err != nil {
		return nil, err
	}
	g.poke(id)
	var env []string
	var bindings []api.SecretBinding
	if p != nil {
		bindings = p.Secrets
	}
	for k, v := range g.secrets.Placeholders(id, bindings) {
		env = append(env, k+"="+v)
	}
	return env, nil
}

// Secrets is the secret store.
func (g *Gateway) Secrets() *egress.SecretStore { return g.secrets }

// Denials returns a sandbox's recent denials, newest last.
func (g *Gateway) Denials(id string) []egress.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]egress.Event(nil), g.denials[id]...)
}

// Close stops the gateway's listeners; the network's rules and links stay
// for the sandboxes that keep running.
func (g *Gateway) Close() error {
	close(g.stop)
	g.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g.self.Shutdown(ctx)
	g.proxy.Close()
	g.dns.Close()
	return g.net.Close()
}
