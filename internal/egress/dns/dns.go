// Package dns is paddock's resolver: the only DNS server a sandbox can
// reach (the network's rules redirect its DNS, to any server, UDP or TCP,
// here). It answers a sandbox only for names its policy allows, logs every
// query to the sandbox's audit log, and resolves through the host's
// upstream resolvers with a small cache that the egress proxy shares
// (Resolve), so that the proxy and the sandbox see the same addresses.
//
// What a sandbox gets:
//
//   - a name the policy denies, a malformed name, a query beyond its rate:
//     REFUSED (with an RFC 8914 extended error saying why, when the query
//     has EDNS), logged; nothing is sent upstream, so a query cannot carry
//     data out of the host;
//   - A for an allowed name: the addresses, resolved upstream; a CNAME
//     chain is followed and flattened into A records owned by the asked
//     name (see resolveAddrs for why only the asked name must be allowed);
//   - AAAA: an empty NOERROR (sandboxes have no IPv6), without asking
//     upstream;
//   - other types for an allowed name: forwarded, answer section only;
//   - the special names (paddock.internal): answered locally;
//   - TTLs capped (MaxTTL, 30 s by default), so a policy change or a
//     rebinding is seen within that time.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/sync/singleflight"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Config is the resolver's configuration. Sandbox and Allowed are required.
type Config struct {
	// Addr is the listen address for UDP and TCP alike, e.g.
	// "0.0.0.0:15053". Port 0 picks one (the same for both).
	Addr string
	// Upstream lists the resolvers to ask, "ip:port", tried in order.
	Upstream []string
	// Sandbox names the sandbox a query comes from, by its source address
	// (network.Manager.Lookup). A query from any other address is refused.
	Sandbox func(peer netip.Addr) (id string, ok bool)
	// Allowed is the policy's decision for a name (lower case, no trailing
	// dot) and the rule that made it.
	Allowed func(id, name string) (allow bool, rule string)
	// Special maps names (any case, with or without the trailing dot) to
	// the addresses answered locally to the asking sandbox, e.g.
	// "paddock.internal" → its host-side address. Special names need no
	// policy.
	Special map[string]func(id string) []netip.Addr
	// Log receives every query a sandbox makes, after it is answered. It
	// is called on the query's goroutine: it must not block.
	Log func(id string, q Query)
	// Logger receives the resolver's own reports. Default: discard.
	Logger *slog.Logger

	// MaxTTL caps the TTL of every answer and cache entry. Default 30 s.
	MaxTTL time.Duration
	// CacheSize bounds the cache, in entries. Default 10000.
	CacheSize int
	// RateLimit is the queries per second one sandbox may make (and its
	// burst); beyond it, queries are refused. Default 200.
	RateLimit int
	// UpstreamTimeout bounds one exchange with one upstream. Default 2 s.
	UpstreamTimeout time.Duration
	// MaxInflight bounds the exchanges with upstreams at once, over all
	// sandboxes. Default 256.
	MaxInflight int
	// MaxTCPConns bounds the TCP connections one peer may hold open.
	// Default 16.
	MaxTCPConns int
}

// Query is one query, as the sandbox's audit log records it.
type Query struct {
	Time  time.Time `json:"time"`
	Proto string    `json:"proto"` // "udp" or "tcp"
	Name  string    `json:"name"`  // lower case, no trailing dot
	Type  string    `json:"type"`  // "A", "AAAA", "TXT", ...
	Rcode string    `json:"rcode"` // "NOERROR", "NXDOMAIN", "REFUSED", "SERVFAIL", ...
	// Answer is the answer's data: addresses, or records' text for
	// other types.
	Answer  []string `json:"answer,omitempty"`
	Allowed bool     `json:"allowed"`
	// Rule is the policy rule that allowed or denied the name, or
	// "special" for a special name.
	Rule string `json:"rule,omitempty"`
	// Reason says why a query was refused or failed.
	Reason string `json:"reason,omitempty"`
	// Suspect says why the name looks like data being smuggled out (long
	// or high-entropy labels): worth a human's look, whatever the answer.
	Suspect string `json:"suspect,omitempty"`
	Cached  bool   `json:"cached,omitempty"`
	// Suppressed counts the queries refused for the rate limit since the
	// last entry for this sandbox that were not logged one by one.
	Suppressed int           `json:"suppressed,omitempty"`
	Duration   time.Duration `json:"duration_ns"`
}

// Server is a running resolver.
type Server struct {
	cfg     Config
	log     *slog.Logger
	special map[string]func(id string) []netip.Addr
	cache   *cache
	limit   *limiter
	flight  singleflight.Group
	sem     chan struct{}
	udpc    *mdns.Client
	tcpc    *mdns.Client
	udp     *mdns.Server
	tcp     *mdns.Server
	addr    netip.AddrPort
	wg      sync.WaitGroup
	once    sync.Once
}

// queryBudget bounds the time one query may take, upstream included:
// stub resolvers retry after about 5 s.
const queryBudget = 4 * time.Second

func (c Config) withDefaults() (Config, error) {
	if c.Sandbox == nil || c.Allowed == nil {
		return c, errdefs.Invalid("dns", "Sandbox and Allowed are required")
	}
	if c.Addr == "" {
		return c, errdefs.Invalid("addr", "required")
	}
	for _, u := range c.Upstream {
		if _, err := netip.ParseAddrPort(u); err != nil {
			return c, errdefs.Invalid("upstream", "%q is not ip:port", u)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Log == nil {
		c.Log = func(string, Query) {}
	}
	if c.MaxTTL <= 0 {
		c.MaxTTL = 30 * time.Second
	}
	if c.CacheSize <= 0 {
		c.CacheSize = 10000
	}
	if c.RateLimit <= 0 {
		c.RateLimit = 200
	}
	if c.UpstreamTimeout <= 0 {
		c.UpstreamTimeout = 2 * time.Second
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 256
	}
	if c.MaxTCPConns <= 0 {
		c.MaxTCPConns = 16
	}
	return c, nil
}

// Start listens on cfg.Addr (UDP and TCP) and serves until Close.
func Start(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "dns"),
		special: map[string]func(string) []netip.Addr{},
		cache:   newCache(cfg.CacheSize),
		limit:   newLimiter(cfg.RateLimit),
		sem:     make(chan struct{}, cfg.MaxInflight),
		udpc:    &mdns.Client{Net: "udp", UDPSize: 1232},
		tcpc:    &mdns.Client{Net: "tcp"},
	}
	for name, f := range cfg.Special {
		s.special[canonical(name)] = f
	}
	pc, ln, err := listen(cfg.Addr)
	if err != nil {
		return nil, err
	}
	laddr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	s.addr = netip.AddrPortFrom(laddr.Addr().Unmap(), laddr.Port())
	s.udp = &mdns.Server{PacketConn: pc, Handler: s}
	s.tcp = &mdns.Server{
		Listener: &connLimiter{Listener: ln, max: cfg.MaxTCPConns, open: map[netip.Addr]int{}},
		Handler:  s,
		// A sandbox holding connections open costs a goroutine each:
		// short idle and read timeouts.
		ReadTimeout: 2 * time.Second,
		IdleTimeout: func() time.Duration { return 5 * time.Second },
	}
	for _, srv := range []*mdns.Server{s.udp, s.tcp} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			errc <- srv.ActivateAndServe()
		}()
		select {
		case <-started:
		case err := <-errc:
			s.Close()
			pc.Close()
			ln.Close()
			return nil, fmt.Errorf("starting the resolver: %w", err)
		}
	}
	s.log.Info("resolver listening", "addr", s.addr.String(), "upstream", cfg.Upstream)
	return s, nil
}

// listen opens UDP and TCP on one port: addr's, or, for port 0, the first
// one free for both.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, errdefs.Invalid("addr", "%q: %v", addr, err)
	}
	for try := 0; ; try++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on %s/udp: %w", addr, err)
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", net.JoinHostPort(host, fmt.Sprint(p)))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if port != "0" || try >= 20 {
			return nil, nil, fmt.Errorf("listening on %s/tcp: %w", addr, err)
		}
	}
}

// Addr returns the address the resolver listens on (UDP and TCP).
func (s *Server) Addr() netip.AddrPort { return s.addr }

// Close stops serving and waits for the queries in progress.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, srv := range []*mdns.Server{s.udp, s.tcp} {
			if srv != nil {
				srv.ShutdownContext(ctx)
			}
		}
		s.wg.Wait()
	})
	return nil
}

// ServeDNS answers one query; it implements miekg/dns's Handler.
func (s *Server) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	start := time.Now()
	proto, peer := "udp", netip.Addr{}
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		peer = a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		proto, peer = "tcp", a.AddrPort().Addr().Unmap()
	}
	resp := new(mdns.Msg)
	id, ok := s.cfg.Sandbox(peer)
	if !ok || len(req.Question) != 1 {
		if !ok {
			s.log.Debug("refusing a query from outside the sandboxes", "peer", peer.String())
		}
		resp.SetRcode(req, mdns.RcodeRefused)
		w.WriteMsg(resp)
		return
	}
	q := req.Question[0]
	entry := Query{Time: start, Proto: proto, Name: canonical(q.Name), Type: typeString(q.Qtype)}
	entry.Suspect = suspect(entry.Name)

	allowed, suppressed, logIt := s.limit.allow(id, start)
	entry.Suppressed = suppressed
	if !allowed {
		s.refuse(w, req, resp, &entry, fmt.Sprintf("rate limit of %d queries/s exceeded", s.cfg.RateLimit), mdns.ExtendedErrorCodeOther)
		if logIt {
			entry.Duration = time.Since(start)
			s.cfg.Log(id, entry)
		}
		return
	}
	defer func() {
		entry.Duration = time.Since(start)
		s.cfg.Log(id, entry)
	}()

	switch {
	case req.Opcode != mdns.OpcodeQuery:
		s.answerRcode(w, req, resp, &entry, mdns.RcodeNotImplemented, "opcode "+mdns.OpcodeToString[req.Opcode]+" not served")
		return
	case q.Qclass != mdns.ClassINET:
		s.refuse(w, req, resp, &entry, "class "+mdns.ClassToString[q.Qclass]+" not served", mdns.ExtendedErrorCodeNotSupported)
		return
	case !validName(entry.Name):
		s.refuse(w, req, resp, &entry, "not a host name", mdns.ExtendedErrorCodeProhibited)
		return
	}
	switch q.Qtype {
	case mdns.TypeANY, mdns.TypeAXFR, mdns.TypeIXFR, mdns.TypeMAILA, mdns.TypeMAILB, mdns.TypeOPT, mdns.TypeTKEY, mdns.TypeTSIG:
		s.answerRcode(w, req, resp, &entry, mdns.RcodeNotImplemented, "query type not served")
		return
	}

	if f, ok := s.special[entry.Name]; ok {
		entry.Allowed, entry.Rule = true, "special"
		resp.SetReply(req)
		if q.Qtype == mdns.TypeA {
			for _, a := range f(id) {
				if a.Is4() {
					resp.Answer = append(resp.Answer, &mdns.A{Hdr: hdr(q.Name, mdns.TypeA, s.cfg.MaxTTL), A: a.AsSlice()})
					entry.Answer = append(entry.Answer, a.String())
				}
			}
		}
		s.write(w, req, resp, &entry)
		return
	}

	allow, rule := s.cfg.Allowed(id, entry.Name)
	entry.Allowed, entry.Rule = allow, rule
	if !allow {
		why := "not allowed by the sandbox's policy"
		if rule != "" {
			why = "denied by rule " + rule
		}
		s.refuse(w, req, resp, &entry, why, mdns.ExtendedErrorCodeProhibited)
		return
	}

	if q.Qtype == mdns.TypeAAAA {
		// Sandboxes have no IPv6: an empty answer, so clients use A.
		resp.SetReply(req)
		s.write(w, req, resp, &entry)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), queryBudget)
	defer cancel()
	e, cached, err := s.lookup(ctx, entry.Name, q.Qtype)
	entry.Cached = cached
	if err != nil {
		s.answerRcode(w, req, resp, &entry, mdns.RcodeServerFailure, "upstream: "+err.Error())
		return
	}
	resp.SetRcode(req, e.rcode)
	ttl := e.remaining(time.Now())
	for _, rr := range e.rrs {
		rr = mdns.Copy(rr)
		if q.Qtype == mdns.TypeA {
			rr.Header().Name = q.Name // as asked, case included
		}
		rr.Header().Ttl = ttl
		resp.Answer = append(resp.Answer, rr)
		entry.Answer = append(entry.Answer, rdata(rr))
	}
	s.write(w, req, resp, &entry)
}

// refuse answers REFUSED, with an extended error when the query has EDNS.
func (s *Server) refuse(w mdns.ResponseWriter, req, resp *mdns.Msg, e *Query, why string, code uint16) {
	resp.SetRcode(req, mdns.RcodeRefused)
	e.Reason = why
	if req.IsEdns0() != nil {
		resp.SetEdns0(1232, false)
		opt := resp.IsEdns0()
		opt.Option = append(opt.Option, &mdns.EDNS0_EDE{InfoCode: code, ExtraText: "paddock: " + why})
	}
	e.Rcode = mdns.RcodeToString[mdns.RcodeRefused]
	w.WriteMsg(resp)
}

func (s *Server) answerRcode(w mdns.ResponseWriter, req, resp *mdns.Msg, e *Query, rcode int, why string) {
	resp.SetRcode(req, rcode)
	e.Reason = why
	s.write(w, req, resp, e)
}

// write sends resp, truncated to what the client can take over UDP.
func (s *Server) write(w mdns.ResponseWriter, req, resp *mdns.Msg, e *Query) {
	resp.RecursionAvailable = true
	resp.Compress = true
	size := mdns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(1232, false)
		if opt.UDPSize() > mdns.MinMsgSize {
			size = int(min(opt.UDPSize(), 1232))
		}
	}
	if e.Proto == "udp" {
		resp.Truncate(size)
	}
	e.Rcode = mdns.RcodeToString[resp.Rcode]
	w.WriteMsg(resp)
}

// Resolve returns the addresses of name (IPv4 first, then IPv6) through the
// same upstreams and cache as the sandboxes' queries, so that the proxy
// connects where the sandbox was told the name is. It applies no policy:
// the caller decides. ErrNotFound if the name does not exist or has no
// address.
func (s *Server) Resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	n := canonical(name)
	if !validName(n) {
		return nil, errdefs.Invalid("name", "%q is not a host name", name)
	}
	type result struct {
		e   *entry
		err error
	}
	var v4, v6 result
	// The proxy resolves on every connection: answer from the cache
	// without goroutines when both answers are there.
	now := time.Now()
	var ok4, ok6 bool
	v4.e, ok4 = s.cache.get(cacheKey{name: n, qtype: mdns.TypeA}, now)
	v6.e, ok6 = s.cache.get(cacheKey{name: n, qtype: mdns.TypeAAAA}, now)
	if !ok4 || !ok6 {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); v4.e, _, v4.err = s.lookup(ctx, n, mdns.TypeA) }()
		go func() { defer wg.Done(); v6.e, _, v6.err = s.lookup(ctx, n, mdns.TypeAAAA) }()
		wg.Wait()
	}
	if v4.err != nil && v6.err != nil {
		return nil, fmt.Errorf("resolving %s: %w", n, v4.err)
	}
	var addrs []netip.Addr
	for _, r := range []result{v4, v6} {
		if r.e != nil {
			addrs = append(addrs, r.e.addrs...)
		}
	}
	if len(addrs) == 0 {
		if v4.err != nil {
			return nil, fmt.Errorf("resolving %s: %w", n, v4.err)
		}
		return nil, errdefs.NotFound("address of", n)
	}
	return addrs, nil
}

// connLimiter caps the TCP connections per peer address: each costs the
// server a goroutine until its idle timeout.
type connLimiter struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[netip.Addr]int
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := netip.Addr{}
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			peer = a.AddrPort().Addr().Unmap()
		}
		l.mu.Lock()
		if l.open[peer] >= l.max {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[peer]++
		l.mu.Unlock()
		return &limitedConn{Conn: c, release: func() {
			l.mu.Lock()
			if l.open[peer]--; l.open[peer] <= 0 {
				delete(l.open, peer)
			}
			l.mu.Unlock()
		}}, nil
	}
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

func hdr(name string, t uint16, ttl time.Duration) mdns.RR_Header {
	return mdns.RR_Header{Name: name, Rrtype: t, Class: mdns.ClassINET, Ttl: uint32(ttl / time.Second)}
}

func typeString(t uint16) string {
	if s, ok := mdns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

// rdata is a record's data in presentation form, for the log.
func rdata(rr mdns.RR) string {
	switch r := rr.(type) {
	case *mdns.A:
		return r.A.String()
	case *mdns.AAAA:
		return r.AAAA.String()
	}
	h := rr.Header().String()
	return strings.TrimPrefix(rr.String(), h)
}

// errUpstream is what a query fails with when no upstream answered.
var errUpstream = errors.New("no upstream answered")
