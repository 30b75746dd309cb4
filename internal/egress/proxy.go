package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/netpipe"
	"github.com/paddock-dev/paddock/internal/shrink"
)

// ProxyConfig configures the egress proxy. Engine and Sandbox are
// required; the rest have defaults.
type ProxyConfig struct {
	// Addr is the TCP address to listen on: where the network's nftables
	// rule redirects every TCP connection of a sandbox, and the address in
	// the sandbox's HTTP_PROXY/HTTPS_PROXY (a connection whose original
	// destination is the listener itself speaks to the proxy as a proxy).
	Addr string
	// Listener, when set, is used instead of Addr.
	Listener net.Listener

	// Engine holds the sandboxes' policies.
	Engine *Engine
	// Sandbox maps a connection's source address to its sandbox id.
	Sandbox func(peer netip.Addr) (id string, ok bool)
	// OriginalDst returns where a redirected connection was going.
	// Default: OriginalDst (SO_ORIGINAL_DST). An error means the client
	// connected to the proxy itself (explicit proxy mode).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// CA returns a sandbox's CA, for the hosts that are intercepted. Nil:
	// a connection that needs interception is refused.
	CA func(id string) (*CA, error)
	// Secrets holds the values of bound secrets. Nil: a policy with
	// secret bindings has its requests to those hosts refused.
	Secrets SecretSource
	// Resolve resolves names for upstream connections. Default:
	// net.DefaultResolver. The proxy never connects to the address the
	// sandbox resolved: it resolves the SNI or Host itself and checks
	// every answer (Engine.CheckAddr).
	Resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	// RootCAs verifies upstream certificates of intercepted connections.
	// Nil: the host's roots.
	RootCAs *x509.CertPool
	// Events receives every decision when the connection or request it
	// decided ends. It is called from many goroutines and must not block.
	Events func(id string, e Event)
	// Logger gets the proxy's own failures. Default: discard.
	Logger *slog.Logger
	// PeekTimeout is how long the proxy waits for a client's first bytes
	// before deciding by address alone (for protocols where the server
	// speaks first). Default 300ms. A silent connection the address alone
	// does not allow waits up to SilentTimeout for bytes that could allow
	// it (a ClientHello with an allowed name), then is reset.
	PeekTimeout time.Duration
	// SilentTimeout: see PeekTimeout. Default 1s.
	SilentTimeout time.Duration
	// DialTimeout bounds an upstream connect. Default 10s.
	DialTimeout time.Duration
}

// SecretSource is what the proxy needs of a secret store.
type SecretSource interface {
	Get(name string) ([]byte, error)
	Placeholder(sandbox, name string) string
}

var _ SecretSource = (*SecretStore)(nil)

// Proxy is the running egress proxy.
type Proxy struct {
	cfg    ProxyConfig
	ln     net.Listener
	log    *slog.Logger
	public func(netip.Addr) bool
	dialer net.Dialer

	hl  *connListener // feeds the HTTP server: plain HTTP, intercepted TLS, explicit proxying
	srv *http.Server
	rp  *httputil.ReverseProxy

	stateMu sync.Mutex
	states  map[string]*sandboxState
	// tlsBase is, per sandbox, the config its intercepted connections'
	// configs are cloned from: they share its session ticket keys, so a
	// client that resumes (curl, git and Node within one process) skips
	// the signature and certificate of a full handshake.
	tlsBase map[string]*tls.Config
	// statesPeak and tlsPeak are for shrink.Map.
	statesPeak, tlsPeak int

	activeMu sync.Mutex
	active   map[net.Conn]struct{}
	closed   atomic.Bool
	done     chan struct{}
}

// sandboxState is a sandbox's upstream HTTP transports, made for one
// version of its policy: the transports' dials check addresses against
// that version, so pooled connections never outlive a policy change.
// There are two, so that a request goes upstream in the HTTP version its
// client chose: h1 speaks only HTTP/1.1, h2 prefers HTTP/2 (for clients
// that spoke HTTP/2 to the proxy: gRPC needs it end to end). Upgrading an
// HTTP/1.1 client's requests to HTTP/2 would only cost it: Go's HTTP/2
// client moves a bulk download at a third of HTTP/1.1's rate.
type sandboxState struct {
	pol    *compiled
	h1, h2 *http.Transport
}

func (st *sandboxState) closeIdle() {
	st.h1.CloseIdleConnections()
	st.h2.CloseIdleConnections()
}

// Start listens and serves until Close.
func Start(cfg ProxyConfig) (*Proxy, error) {
	if cfg.Engine == nil || cfg.Sandbox == nil {
		return nil, errdefs.Invalid("proxy config", "Engine and Sandbox are required")
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = OriginalDst
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, name string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
		}
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 300 * time.Millisecond
	}
	if cfg.SilentTimeout < cfg.PeekTimeout {
		cfg.SilentTimeout = max(cfg.PeekTimeout, time.Second)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("listening for egress: %w", err)
		}
	}
	p := &Proxy{
		cfg:     cfg,
		ln:      ln,
		log:     log,
		public:  cfg.Engine.public,
		dialer:  net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second},
		hl:      newConnListener(ln.Addr()),
		states:  map[string]*sandboxState{},
		tlsBase: map[string]*tls.Config{},
		active:  map[net.Conn]struct{}{},
		done:    make(chan struct{}),
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      roundTripperFunc(p.roundTrip),
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamError,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	p.srv = &http.Server{
		Handler:                      http.HandlerFunc(p.serveHTTP),
		ConnContext:                  connContext,
		ReadHeaderTimeout:            30 * time.Second,
		IdleTimeout:                  2 * time.Minute,
		MaxHeaderBytes:               1 << 20,
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	cfg.Engine.watch(p.forget)
	go p.srv.Serve(p.hl)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	err := p.ln.Close()
	p.hl.Close()
	p.srv.Close()
	p.activeMu.Lock()
	for c := range p.active {
		c.Close()
	}
	p.activeMu.Unlock()
	<-p.done
	p.stateMu.Lock()
	for id, st := range p.states {
		st.closeIdle()
		delete(p.states, id)
	}
	p.stateMu.Unlock()
	return err
}

func (p *Proxy) acceptLoop() {
	defer close(p.done)
	var delay time.Duration
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of fds and the like: back off instead of spinning.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.log.Warn("egress accept failed", "err", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go p.handle(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.activeMu.Lock()
	defer p.activeMu.Unlock()
	if p.closed.Load() {
		c.Close()
		return false
	}
	p.active[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.activeMu.Lock()
	delete(p.active, c)
	p.activeMu.Unlock()
}

// flow is one connection from a sandbox, or one CONNECT tunnel in it.
type flow struct {
	id          string
	peer        netip.AddrPort
	dst         netip.AddrPort // original destination; zero in explicit mode
	port        uint16         // destination port
	explicit    bool           // the client speaks to the proxy as a proxy
	connectHost string         // a CONNECT tunnel's host name
	sni         string         // an intercepted connection's server name
	start       time.Time
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (p *Proxy) handle(c net.Conn) {
	peer := addrPort(c.RemoteAddr())
	id, ok := p.cfg.Sandbox(peer.Addr())
	if !ok {
		p.log.Warn("egress connection from an address of no sandbox", "peer", peer)
		reset(c)
		return
	}
	f := &flow{id: id, peer: peer, start: time.Now()}
	dst, err := p.cfg.OriginalDst(c)
	if err != nil || dst == addrPort(c.LocalAddr()) {
		f.explicit = true
		p.hl.push(&flowConn{Conn: c, f: f})
		return
	}
	f.dst, f.port = dst, dst.Port()
	p.handleStream(f, c, nil)
}

// handleStream decides a transparent connection (or a CONNECT tunnel)
// from its first bytes: a TLS ClientHello by SNI, HTTP by each request,
// anything else by address and port.
func (p *Proxy) handleStream(f *flow, c net.Conn, pre []byte) {
	pol := p.cfg.Engine.get(f.id)
	if pol == nil {
		p.denyConn(f, c, KindTCP, "", noPolicy)
		return
	}
	// Refuse at once, without waiting for bytes that cannot change the
	// answer, when the address is denied and no name could allow the
	// connection: the policy allows no names, or the address is one no
	// allowed name may lead to (private, loopback, metadata, ... without
	// a rule naming it; the resolver never answers with one).
	if f.connectHost == "" {
		if d := pol.decideIP(f.dst.Addr(), f.port, p.public); !d.Allow && !pol.nameMayAllow(f.dst.Addr(), f.port, p.public) {
			p.denyConn(f, c, KindTCP, "", d)
			return
		}
	}
	buf, kind, hello, err := p.peek(c, pre, func() bool { return p.rawAllowed(f, pol) })
	if err != nil && len(buf) == 0 {
		c.Close() // the client went away before saying anything
		return
	}
	switch kind {
	case KindTLS:
		p.handleTLS(f, c, pol, buf, hello)
	case KindHTTP:
		p.hl.push(&flowConn{Conn: netpipe.WithPrefix(c, buf), f: f})
	default:
		p.handleTCP(f, c, pol, buf)
	}
}

// rawAllowed reports whether f would be allowed as raw TCP, decided by
// address and port (handleTCP): what a silent client gets. A CONNECT
// tunnel goes to the first address its host resolves to, so a host that
// only a TLS rule allows is not enough: its client, slow to send its
// ClientHello, must not be taken for a protocol where the server speaks
// first (and refused).
func (p *Proxy) rawAllowed(f *flow, pol *compiled) bool {
	if f.connectHost == "" {
		return pol.decideIP(f.dst.Addr(), f.port, p.public).Allow
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolve(ctx, f.connectHost)
	return err == nil && len(addrs) > 0 && pol.decideIP(addrs[0].Unmap(), f.port, p.public).Allow
}

// nameMayAllow reports whether a name (SNI or Host) could still allow a
// connection to ip that its address alone does not: the policy allows
// names, and the address is one an allowed name may lead to (with
// allowFirst, a public address whatever the deny rules say).
func (c *compiled) nameMayAllow(ip netip.Addr, port uint16, public func(netip.Addr) bool) bool {
	if !c.allowsNames() {
		return false
	}
	if c.allowFirst && public(ip) && slices.ContainsFunc(c.allow, func(r *rule) bool { return r.kind != kindIP }) {
		return true
	}
	return c.checkAddr(ip, port, "", public).Allow
}

// allowsNames reports whether anything in the policy can allow a
// connection by name (SNI or Host).
func (c *compiled) allowsNames() bool {
	if c.internet {
		return true
	}
	for _, r := range c.allow {
		if r.kind != kindIP {
			return true
		}
	}
	return false
}

const maxPeek = 64 << 10

// peek reads the client's first bytes until they show what the
// connection is. ipAllows is asked when the client stays silent.
func (p *Proxy) peek(c net.Conn, pre []byte, ipAllows func() bool) ([]byte, Kind, clientHello, error) {
	buf := make([]byte, len(pre), max(4096, len(pre)))
	copy(buf, pre)
	deadline := time.Now().Add(p.cfg.PeekTimeout)
	waited := false
	defer c.SetReadDeadline(time.Time{})
	for {
		if len(buf) > 0 {
			if kind, hello, done := classify(buf); done {
				return buf, kind, hello, nil
			}
		}
		if len(buf) == cap(buf) {
			if len(buf) >= maxPeek {
				return buf, KindTCP, clientHello{}, nil
			}
			buf = append(buf, make([]byte, len(buf))...)[:len(buf)]
		}
		c.SetReadDeadline(deadline)
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if len(buf) == 0 && !waited {
				if ipAllows() {
					return buf, KindTCP, clientHello{}, nil // the server speaks first
				}
				waited = true
				deadline = deadline.Add(p.cfg.SilentTimeout - p.cfg.PeekTimeout)
				continue
			}
			return buf, KindTCP, clientHello{}, nil
		}
		return buf, KindTCP, clientHello{}, err
	}
}

// classify says what buf starts, or that it needs more bytes.
func classify(buf []byte) (kind Kind, hello clientHello, done bool) {
	if buf[0] == 0x16 {
		h, err := parseClientHello(buf)
		switch err {
		case nil:
			return KindTLS, h, true
		case errNeedMore:
			return "", h, false
		}
		return KindTCP, h, true
	}
	for i, b := range buf {
		switch {
		case b == ' ' && i >= 3:
			return KindHTTP, hello, true
		case b < 'A' || b > 'Z' || i >= 16:
			return KindTCP, hello, true
		}
	}
	return "", hello, false
}

func (p *Proxy) handleTLS(f *flow, c net.Conn, pol *compiled, buf []byte, hello clientHello) {
	host := hello.serverName
	if _, err := netip.ParseAddr(host); err == nil {
		host = "" // an address is not a valid SNI
	}
	if f.connectHost != "" {
		if host != "" && host != f.connectHost {
			d := Decision{Reason: fmt.Sprintf("TLS server name %q differs from the CONNECT host %q (domain fronting)", host, f.connectHost)}
			p.denyConn(f, c, KindTLS, host, d)
			return
		}
		host = f.connectHost
	}
	d := pol.decide(DecideArgs{Sandbox: f.id, Kind: KindTLS, Host: host, IP: f.dst.Addr(), Port: f.port}, p.public)
	if !d.Allow {
		p.denyConn(f, c, KindTLS, host, d)
		return
	}
	if d.Intercept {
		p.intercept(f, c, buf, host, d, hello)
		return
	}
	p.spliceTo(f, c, pol, KindTLS, host, d, buf)
}

func (p *Proxy) handleTCP(f *flow, c net.Conn, pol *compiled, buf []byte) {
	ip := f.dst.Addr()
	if f.connectHost != "" {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
		addrs, err := p.cfg.Resolve(ctx, f.connectHost)
		cancel()
		if err != nil || len(addrs) == 0 {
			p.denyConn(f, c, KindTCP, f.connectHost, Decision{Reason: fmt.Sprintf("resolving %s: %v", f.connectHost, err)})
			return
		}
		ip = addrs[0].Unmap()
		f.dst = netip.AddrPortFrom(ip, f.port)
	}
	d := pol.decideIP(ip, f.port, p.public)
	if !d.Allow {
		p.denyConn(f, c, KindTCP, f.connectHost, d)
		return
	}
	p.spliceTo(f, c, pol, KindTCP, "", d, buf)
}

// spliceTo connects upstream and copies bytes both ways without looking
// at them (splice(2) between the two sockets where both are TCP).
func (p *Proxy) spliceTo(f *flow, c net.Conn, pol *compiled, kind Kind, host string, d Decision, pre []byte) {
	ev := p.event(f, kind, host, d)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DialTimeout)
	up, ip, err := p.dial(ctx, pol, host, f.dst.Addr(), f.port)
	cancel()
	if ip.IsValid() {
		ev.IP = ip.String()
	}
	if err != nil {
		var re *refusedError
		if errors.As(err, &re) {
			ev.Action, ev.Rule, ev.Reason, ev.Suggest = "deny", re.d.Rule, re.d.Reason, re.d.Suggest
		} else {
			ev.Error = err.Error()
		}
		if kind == KindTLS {
			writeAlert(c)
			c.Close()
		} else {
			reset(c)
		}
		p.emit(f, ev)
		return
	}
	if !p.track(c) {
		up.Close()
		return
	}
	defer p.untrack(c)
	if len(pre) > 0 {
		if _, err := up.Write(pre); err != nil {
			up.Close()
			reset(c)
			ev.Error = err.Error()
			p.emit(f, ev)
			return
		}
	}
	out, in := netpipe.Splice(c, up)
	ev.BytesOut, ev.BytesIn = out+int64(len(pre)), in
	p.emit(f, ev)
}

// refusedError is a dial refused because every address a name resolved
// to is forbidden (DNS rebinding) or denied.
type refusedError struct{ d Decision }

func (e *refusedError) Error() string { return e.d.Reason }

// dial connects to host (resolved by the proxy, every answer checked) or,
// for a connection decided by address, to dst.
func (p *Proxy) dial(ctx context.Context, pol *compiled, host string, dst netip.Addr, port uint16) (net.Conn, netip.Addr, error) {
	var addrs []netip.Addr
	check := true
	switch a, err := netip.ParseAddr(host); {
	case host == "":
		addrs, check = []netip.Addr{dst}, false // decided by this very address
	case err == nil:
		addrs = []netip.Addr{a.Unmap()}
	default:
		if addrs, err = p.cfg.Resolve(ctx, host); err != nil {
			return nil, netip.Addr{}, fmt.Errorf("resolving %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, netip.Addr{}, fmt.Errorf("resolving %s: no addresses", host)
		}
	}
	var refused *refusedError
	var lastErr error
	for _, a := range addrs {
		a = a.Unmap()
		if check {
			if d := pol.checkAddr(a, port, host, p.public); !d.Allow {
				if host != "" && d.Rule == "" {
					d.Reason = host + " " + d.Reason
				}
				refused = &refusedError{d}
				continue
			}
		}
		c, err := p.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, a, nil
		}
		lastErr = err
	}
	if lastErr == nil && refused != nil {
		return nil, netip.Addr{}, refused
	}
	return nil, netip.Addr{}, lastErr
}

func (p *Proxy) event(f *flow, kind Kind, host string, d Decision) Event {
	ev := Event{
		Time:   f.start,
		Kind:   kind,
		Action: action(d.Allow),
		Host:   host,
		Port:   f.port,
		Rule:   d.Rule,
		Reason: d.Reason,
	}
	if !d.Allow {
		ev.Suggest = d.Suggest
	}
	if f.dst.IsValid() {
		ev.IP = f.dst.Addr().String()
	}
	return ev
}

func (p *Proxy) emit(f *flow, ev Event) {
	ev.DurationMS = float64(time.Since(ev.Time).Microseconds()) / 1000
	if ev.Action == "deny" {
		p.log.Debug("egress denied", "sandbox", f.id, "kind", ev.Kind, "host", ev.Host, "ip", ev.IP, "port", ev.Port, "reason", ev.Reason)
	}
	if p.cfg.Events != nil {
		p.cfg.Events(f.id, ev)
	}
}

// denyConn refuses a connection at once: a TLS client gets a fatal
// access_denied alert, anything else a reset.
func (p *Proxy) denyConn(f *flow, c net.Conn, kind Kind, host string, d Decision) {
	if kind == KindTLS {
		writeAlert(c)
		c.Close()
	} else {
		reset(c)
	}
	p.emit(f, p.event(f, kind, host, d))
}

// writeAlert sends a fatal TLS access_denied alert (a TLS 1.0 record, as
// a server that never got to pick a version sends it).
func writeAlert(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write([]byte{21, 3, 1, 0, 2, 2, 49})
}

// reset closes c with an RST, so that the client sees "connection reset"
// instead of an orderly end.
func reset(c net.Conn) {
	var tc *net.TCPConn
	switch x := c.(type) {
	case *net.TCPConn:
		tc = x
	case *flowConn:
		tc, _ = x.Conn.(*net.TCPConn)
	}
	if tc != nil {
		tc.SetLinger(0)
	}
	c.Close()
}

// intercept terminates TLS with a certificate for host signed by the
// sandbox's CA and hands the connection to the HTTP server, which decides
// each request.
func (p *Proxy) intercept(f *flow, c net.Conn, buf []byte, host string, d Decision, hello clientHello) {
	ev := p.event(f, KindTLS, host, d)
	ev.Intercepted = true
	fail := func(err error) {
		ev.Error = err.Error()
		writeAlert(c)
		c.Close()
		p.emit(f, ev)
	}
	if p.cfg.CA == nil || host == "" {
		fail(errors.New("interception needs the sandbox's CA and a server name"))
		return
	}
	ca, err := p.cfg.CA(f.id)
	if err != nil {
		fail(fmt.Errorf("sandbox CA: %w", err))
		return
	}
	leaf, err := ca.Leaf(host)
	if err != nil {
		fail(err)
		return
	}
	protos := []string{"http/1.1"}
	for _, a := range hello.alpn {
		if a == "h2" {
			protos = []string{"h2", "http/1.1"}
		}
	}
	f2 := *f
	f2.sni = host
	fc := &flowConn{Conn: newWriteBehind(netpipe.WithPrefix(c, buf)), f: &f2, ev: &ev, p: p}
	cfg := p.interceptConfig(f.id)
	cfg.Certificates = []tls.Certificate{*leaf}
	cfg.NextProtos = protos
	tc := tls.Server(fc, cfg)
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		ev.Error = "TLS handshake with the sandbox: " + err.Error() + " (is the sandbox's CA installed?)"
		tc.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	p.hl.push(tc)
}

// interceptConfig returns a config for one intercepted connection of
// sandbox id, cloned from the sandbox's base (made on first use).
func (p *Proxy) interceptConfig(id string) *tls.Config {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	base := p.tlsBase[id]
	if base == nil {
		// The sandbox's own ticket keys: no other sandbox can resume
		// its sessions.
		base = &tls.Config{MinVersion: tls.VersionTLS12}
		var key [32]byte
		rand.Read(key[:])
		base.SetSessionTicketKeys([][32]byte{key})
		p.tlsBase[id] = base
	}
	return base.Clone()
}

// flowConn is a connection served by the HTTP server. For an intercepted
// TLS connection it counts bytes and reports the connection's decision
// when it closes.
type flowConn struct {
	net.Conn
	f       *flow
	p       *Proxy
	ev      *Event
	in, out atomic.Int64
	once    sync.Once
}

func (c *flowConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.out.Add(int64(n))
	return n, err
}

func (c *flowConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *flowConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if c.ev != nil {
			c.ev.BytesOut, c.ev.BytesIn = c.out.Load(), c.in.Load()
			c.p.emit(c.f, *c.ev)
		}
	})
	return err
}

type flowKey struct{}

func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if fc, ok := c.(*flowConn); ok {
		return context.WithValue(ctx, flowKey{}, fc.f)
	}
	return ctx
}

// connListener hands connections the proxy accepted and classified to
// the HTTP server.
type connListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// bufferPool gives the reverse proxy 64 KiB copy buffers.
type bufferPool struct{}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBufs.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBufs.Put(&b) }

// state returns the sandbox's upstream transport for policy version pol.
func (p *Proxy) state(id string, pol *compiled) *sandboxState {
	p.stateMu.Lock()
	defer p.stateMu.Unlock()
	if st := p.states[id]; st != nil {
		if st.pol == pol {
			return st
		}
		st.closeIdle()
	}
	st := &sandboxState{pol: pol, h1: p.transport(pol, false), h2: p.transport(pol, true)}
	p.states[id] = st
	return st
}

// transport makes an upstream transport whose dials check addresses
// against pol; h2 prefers HTTP/2 where the upstream offers it.
func (p *Proxy) transport(pol *compiled, h2 bool) *http.Transport {
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetHTTP2(h2)
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr)
			if err != nil {
				return nil, err
			}
			c, _, err := p.dial(ctx, pol, host, netip.Addr{}, port)
			return c, err
		},
		TLSClientConfig:       &tls.Config{RootCAs: p.cfg.RootCAs},
		Protocols:             protos,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   p.cfg.DialTimeout,
		ExpectContinueTimeout: time.Second,
		ReadBufferSize:        64 << 10,
		WriteBufferSize:       64 << 10,
	}
}

// forget drops a sandbox's upstream connections when its policy changes
// or goes.
func (p *Proxy) forget(id string) {
	p.stateMu.Lock()
	st := p.states[id]
	delete(p.states, id)
	delete(p.tlsBase, id) // a new policy: sessions start afresh
	p.states = shrink.Map(p.states, &p.statesPeak)
	p.tlsBase = shrink.Map(p.tlsBase, &p.tlsPeak)
	p.stateMu.Unlock()
	if st != nil {
		st.closeIdle()
	}
}
