package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// upstream is an in-process authoritative-looking resolver on loopback.
type upstream struct {
	addr    string
	mu      sync.Mutex
	asked   map[string]int // "name/TYPE" → queries
	total   atomic.Int64
	servers []*mdns.Server
}

// zone is what the upstream knows. Names not in it are NXDOMAIN.
var zone = map[string][]string{
	"allowed.test.":          {"allowed.test. 3600 IN A 192.0.2.10", "allowed.test. 3600 IN AAAA 2001:db8::10"},
	"multi.test.":            {"multi.test. 300 IN A 192.0.2.11", "multi.test. 300 IN A 192.0.2.12"},
	"alias.test.":            {"alias.test. 120 IN CNAME cdn.other.test.", "cdn.other.test. 20 IN A 192.0.2.20"},
	"partial.test.":          {"partial.test. 300 IN CNAME target.elsewhere.test."},
	"target.elsewhere.test.": {"target.elsewhere.test. 300 IN A 192.0.2.21"},
	"txt.test.":              {`txt.test. 300 IN TXT "hello"`},
	"short.test.":            {"short.test. 0 IN A 192.0.2.30"},
	"denied.test.":           {"denied.test. 300 IN A 192.0.2.66"},
}

func init() {
	var big []string
	for i := 0; i < 40; i++ {
		big = append(big, fmt.Sprintf("big.test. 300 IN A 198.51.100.%d", i+1))
	}
	zone["big.test."] = big
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{asked: map[string]int{}}
	h := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		q := r.Question[0]
		u.total.Add(1)
		u.mu.Lock()
		u.asked[strings.ToLower(q.Name)+"/"+mdns.TypeToString[q.Qtype]]++
		u.mu.Unlock()
		m := new(mdns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		recs, ok := zone[strings.ToLower(q.Name)]
		if !ok {
			m.Rcode = mdns.RcodeNameError
			soa, _ := mdns.NewRR("test. 3600 IN SOA ns.test. admin.test. 1 3600 600 86400 60")
			m.Ns = append(m.Ns, soa)
		}
		for _, s := range recs {
			rr, err := mdns.NewRR(s)
			if err != nil {
				panic(err)
			}
			if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == mdns.TypeCNAME {
				m.Answer = append(m.Answer, rr)
			}
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), false)
		}
		w.WriteMsg(m)
	})
	pc, ln, err := listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	for _, s := range []*mdns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		u.servers = append(u.servers, s)
	}
	t.Cleanup(func() {
		for _, s := range u.servers {
			s.Shutdown()
		}
	})
	return u
}

func (u *upstream) count(name, typ string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asked[name+"/"+typ]
}

// auditLog collects what the resolver logs.
type auditLog struct {
	mu sync.Mutex
	q  []Query
	id []string
}

func (l *auditLog) add(id string, q Query) {
	l.mu.Lock()
	l.q = append(l.q, q)
	l.id = append(l.id, id)
	l.mu.Unlock()
}

// wait returns the first logged query for name (Log runs after the answer
// is written, so it may lag the client a little).
func (l *auditLog) wait(t testing.TB, name string) Query {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for i, q := range l.q {
			if q.Name == name {
				id := l.id[i]
				l.mu.Unlock()
				if id != "sb1" {
					t.Errorf("logged for %q, want sb1", id)
				}
				return q
			}
		}
		l.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no log entry for %s", name)
	return Query{}
}

func (l *auditLog) all() []Query {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Query(nil), l.q...)
}

var sandboxPeer = netip.MustParseAddr("127.0.0.1")

// allowList is the test policy: exact names, and "*.ok.test".
func allowList(id, name string) (bool, string) {
	switch name {
	case "allowed.test", "multi.test", "alias.test", "partial.test", "txt.test", "short.test", "big.test":
		return true, "allow " + name
	case "denied.test":
		return false, "deny denied.test"
	}
	if strings.HasSuffix(name, ".ok.test") {
		return true, "allow *.ok.test"
	}
	return false, ""
}

type fixture struct {
	s   *Server
	up  *upstream
	log *auditLog
}

func start(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	f := &fixture{up: startUpstream(t), log: &auditLog{}}
	cfg := Config{
		Addr:     "127.0.0.1:0",
		Upstream: []string{f.up.addr},
		Sandbox: func(peer netip.Addr) (string, bool) {
			if peer == sandboxPeer {
				return "sb1", true
			}
			return "", false
		},
		Allowed: allowList,
		Special: map[string]func(string) []netip.Addr{
			"paddock.internal.": func(id string) []netip.Addr {
				if id == "sb1" {
					return []netip.Addr{netip.MustParseAddr("10.224.0.1")}
				}
				return nil
			},
		},
		Log: f.log.add,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f.s = s
	return f
}

// ask sends one query from the sandbox's address (127.0.0.1) or another.
func (f *fixture) ask(t testing.TB, proto, name string, qtype uint16, edns bool, from string) *mdns.Msg {
	t.Helper()
	c := &mdns.Client{Net: proto, Timeout: 3 * time.Second}
	if from != "" {
		ip := net.ParseIP(from)
		if proto == "tcp" {
			c.Dialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 3 * time.Second}
		} else {
			c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: ip}, Timeout: 3 * time.Second}
		}
	}
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	r, _, err := c.Exchange(m, f.s.Addr().String())
	if err != nil {
		t.Fatalf("%s %s %s: %v", proto, name, mdns.TypeToString[qtype], err)
	}
	return r
}

func addrs(r *mdns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *mdns.A:
			out = append(out, v.A.String())
		case *mdns.AAAA:
			out = append(out, v.AAAA.String())
		default:
			out = append(out, rr.String())
		}
	}
	return out
}

func TestAllowedResolved(t *testing.T) {
	f := start(t, nil)
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			r := f.ask(t, proto, "multi.test.", mdns.TypeA, false, "")
			if r.Rcode != mdns.RcodeSuccess || !r.RecursionAvailable {
				t.Fatalf("rcode %s, ra %v", mdns.RcodeToString[r.Rcode], r.RecursionAvailable)
			}
			if got := strings.Join(addrs(r), ","); got != "192.0.2.11,192.0.2.12" {
				t.Errorf("answer %s", got)
			}
			for _, rr := range r.Answer {
				if rr.Header().Ttl > 30 {
					t.Errorf("TTL %d above the cap", rr.Header().Ttl)
				}
			}
		})
	}
	q := f.log.wait(t, "multi.test")
	if !q.Allowed || q.Rule != "allow multi.test" || q.Rcode != "NOERROR" || q.Type != "A" || strings.Join(q.Answer, ",") != "192.0.2.11,192.0.2.12" {
		t.Errorf("logged %+v", q)
	}
	if n := f.up.count("multi.test.", "A"); n != 1 {
		t.Errorf("upstream asked %d times, want 1 (the second from the cache)", n)
	}
}

func TestDeniedRefused(t *testing.T) {
	f := start(t, nil)
	for _, c := range []struct {
		name, qtype string
		rule        string
	}{
		{"denied.test.", "A", "deny denied.test"},
		{"github.com.", "A", ""},
		{"denied.test.", "TXT", "deny denied.test"},
		{"denied.test.", "AAAA", "deny denied.test"},
	} {
		r := f.ask(t, "udp", c.name, mdns.StringToType[c.qtype], true, "")
		if r.Rcode != mdns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s %s: rcode %s, answer %v", c.name, c.qtype, mdns.RcodeToString[r.Rcode], r.Answer)
		}
		var ede *mdns.EDNS0_EDE
		if opt := r.IsEdns0(); opt != nil {
			for _, o := range opt.Option {
				if e, ok := o.(*mdns.EDNS0_EDE); ok {
					ede = e
				}
			}
		}
		if ede == nil || ede.InfoCode != mdns.ExtendedErrorCodeProhibited || !strings.Contains(ede.ExtraText, "paddock") {
			t.Errorf("%s: extended error %+v", c.name, ede)
		}
	}
	q := f.log.wait(t, "denied.test")
	if q.Allowed || q.Rcode != "REFUSED" || q.Rule != "deny denied.test" || !strings.Contains(q.Reason, "deny denied.test") {
		t.Errorf("logged %+v", q)
	}
	if q := f.log.wait(t, "github.com"); q.Allowed || q.Reason != "not allowed by the sandbox's policy" {
		t.Errorf("logged %+v", q)
	}
	if n := f.up.total.Load(); n != 0 {
		t.Errorf("upstream asked %d times for denied names", n)
	}
}

func TestNotASandbox(t *testing.T) {
	f := start(t, nil)
	for _, proto := range []string{"udp", "tcp"} {
		r := f.ask(t, proto, "allowed.test.", mdns.TypeA, false, "127.0.0.2")
		if r.Rcode != mdns.RcodeRefused || len(r.Answer) != 0 {
			t.Errorf("%s from 127.0.0.2: %s %v", proto, mdns.RcodeToString[r.Rcode], r.Answer)
		}
	}
	if n := f.up.total.Load(); n != 0 {
		t.Errorf("upstream asked %d times", n)
	}
	if got := f.log.all(); len(got) != 0 {
		t.Errorf("logged to a sandbox's audit: %+v", got)
	}
}

func TestSpecial(t *testing.T) {
	f := start(t, nil)
	r := f.ask(t, "udp", "PADDOCK.Internal.", mdns.TypeA, false, "")
	if r.Rcode != mdns.RcodeSuccess || strings.Join(addrs(r), ",") != "10.224.0.1" {
		t.Fatalf("A: %s %v", mdns.RcodeToString[r.Rcode], addrs(r))
	}
	if r.Answer[0].Header().Name != "PADDOCK.Internal." {
		t.Errorf("owner %q, want the name as asked", r.Answer[0].Header().Name)
	}
	r = f.ask(t, "udp", "paddock.internal.", mdns.TypeAAAA, false, "")
	if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA: %s %v", mdns.RcodeToString[r.Rcode], r.Answer)
	}
	if q := f.log.wait(t, "paddock.internal"); !q.Allowed || q.Rule != "special" {
		t.Errorf("logged %+v", q)
	}
	if n := f.up.total.Load(); n != 0 {
		t.Errorf("upstream asked %d times", n)
	}
}

func TestAAAAEmpty(t *testing.T) {
	f := start(t, nil)
	r := f.ask(t, "udp", "allowed.test.", mdns.TypeAAAA, true, "")
	if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA: %s %v", mdns.RcodeToString[r.Rcode], r.Answer)
	}
	if n := f.up.count("allowed.test.", "AAAA"); n != 0 {
		t.Errorf("upstream asked for AAAA %d times", n)
	}
}

func TestCNAMEFlattened(t *testing.T) {
	f := start(t, nil)
	r := f.ask(t, "udp", "alias.test.", mdns.TypeA, false, "")
	if len(r.Answer) != 1 {
		t.Fatalf("answer %v", r.Answer)
	}
	a, ok := r.Answer[0].(*mdns.A)
	if !ok || a.A.String() != "192.0.2.20" || a.Hdr.Name != "alias.test." {
		t.Errorf("answer %v, want one A owned by alias.test.", r.Answer[0])
	}
	if a != nil && a.Hdr.Ttl > 20 {
		t.Errorf("TTL %d, want the chain's smallest (20)", a.Hdr.Ttl)
	}
	// The upstream's answer stops at the CNAME: the resolver asks for the
	// target itself (which the policy does not list: see resolveAddrs).
	r = f.ask(t, "udp", "partial.test.", mdns.TypeA, false, "")
	if got := strings.Join(addrs(r), ","); got != "192.0.2.21" {
		t.Errorf("partial chain: %s", got)
	}
	if n := f.up.count("target.elsewhere.test.", "A"); n != 1 {
		t.Errorf("target asked %d times", n)
	}
	// The target itself, asked directly, is the policy's call.
	if r := f.ask(t, "udp", "target.elsewhere.test.", mdns.TypeA, false, ""); r.Rcode != mdns.RcodeRefused {
		t.Errorf("chain target asked directly: %s", mdns.RcodeToString[r.Rcode])
	}
	// NXDOMAIN passes through.
	if r := f.ask(t, "udp", "nothere.ok.test.", mdns.TypeA, false, ""); r.Rcode != mdns.RcodeNameError {
		t.Errorf("missing name: %s", mdns.RcodeToString[r.Rcode])
	}
}

func TestOtherTypes(t *testing.T) {
	f := start(t, nil)
	r := f.ask(t, "tcp", "txt.test.", mdns.TypeTXT, false, "")
	if len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), `"hello"`) {
		t.Errorf("TXT: %v", r.Answer)
	}
	if q := f.log.wait(t, "txt.test"); len(q.Answer) != 1 || q.Answer[0] != `"hello"` {
		t.Errorf("logged %+v", q)
	}
	if r := f.ask(t, "udp", "allowed.test.", mdns.TypeANY, false, ""); r.Rcode != mdns.RcodeNotImplemented {
		t.Errorf("ANY: %s", mdns.RcodeToString[r.Rcode])
	}
	if r := f.ask(t, "udp", "allowed.test.", mdns.TypeMX, false, ""); r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("MX (none): %s %v", mdns.RcodeToString[r.Rcode], r.Answer)
	}
}

func TestRateLimit(t *testing.T) {
	const rate = 20
	f := start(t, func(c *Config) { c.RateLimit = rate })
	refused := 0
	const n = 100
	for i := 0; i < n; i++ {
		r := f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, "")
		if r.Rcode == mdns.RcodeRefused {
			refused++
		}
	}
	if refused < n-2*rate || refused == n {
		t.Errorf("%d of %d queries refused at %d/s", refused, n, rate)
	}
	// After a second the bucket is full again; the next query's entry
	// carries the count of the refusals not logged one by one.
	time.Sleep(1100 * time.Millisecond)
	if r := f.ask(t, "udp", "multi.test.", mdns.TypeA, false, ""); r.Rcode != mdns.RcodeSuccess {
		t.Fatalf("after the flood: %s", mdns.RcodeToString[r.Rcode])
	}
	f.log.wait(t, "multi.test")
	loggedRefusals, suppressed := 0, 0
	for _, q := range f.log.all() {
		if strings.HasPrefix(q.Reason, "rate limit") {
			loggedRefusals++
		}
		suppressed += q.Suppressed
	}
	if loggedRefusals == 0 || loggedRefusals > 3 {
		t.Errorf("%d rate-limit refusals logged one by one, want 1 or 2 (one a second)", loggedRefusals)
	}
	if loggedRefusals+suppressed != refused {
		t.Errorf("refusals accounted: %d logged + %d suppressed, want %d", loggedRefusals, suppressed, refused)
	}
	// Other sandboxes are not affected.
	if ok, _, _ := f.s.limit.allow("sb2", time.Now()); !ok {
		t.Error("another sandbox was limited")
	}
}

func TestExfiltration(t *testing.T) {
	f := start(t, nil)
	for _, name := range []string{
		"nrsxg5dbnzssa43fmnzgk5bamrqxiyjanfzsa2dfojsq.data.evil.test.", // base32 "my secret data is here"
		"6d7920736563726574206461746120697320686572652e.x.evil.test.",  // hex
		"a1b2c3d4.e5f6a7b8.c9d0e1f2.a3b4c5d6.e7f8a9b0.c1d2e3f4.a5b6c7d8.e9f0a1b2.c3d4e5f6.a7b8c9d0.e1f2a3b4.c5d6.evil.test.",
	} {
		r := f.ask(t, "udp", name, mdns.TypeA, false, "")
		if r.Rcode != mdns.RcodeRefused {
			t.Errorf("%s: %s", name, mdns.RcodeToString[r.Rcode])
		}
		q := f.log.wait(t, canonical(name))
		if q.Allowed || q.Rcode != "REFUSED" || q.Suspect == "" {
			t.Errorf("logged %+v, want refused and marked suspect", q)
		}
	}
	// Bytes a host name cannot hold are refused before any policy.
	r := f.ask(t, "udp", `se\000cret.ok.test.`, mdns.TypeA, false, "")
	if r.Rcode != mdns.RcodeRefused {
		t.Errorf("escaped bytes: %s", mdns.RcodeToString[r.Rcode])
	}
	if q := f.log.wait(t, `se\000cret.ok.test`); q.Reason != "not a host name" {
		t.Errorf("logged %+v", q)
	}
	if n := f.up.total.Load(); n != 0 {
		t.Errorf("upstream asked %d times: data left the host", n)
	}
}

func TestCacheTTLCap(t *testing.T) {
	f := start(t, func(c *Config) { c.MaxTTL = time.Second })
	r := f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, "")
	if ttl := r.Answer[0].Header().Ttl; ttl > 1 {
		t.Errorf("TTL %d, upstream's 3600 not capped to 1", ttl)
	}
	f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, "")
	if n := f.up.count("allowed.test.", "A"); n != 1 {
		t.Errorf("upstream asked %d times within the TTL", n)
	}
	time.Sleep(1100 * time.Millisecond)
	f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, "")
	if n := f.up.count("allowed.test.", "A"); n != 2 {
		t.Errorf("upstream asked %d times after the capped TTL, want 2", n)
	}
	// TTL 0 is not cached.
	f.ask(t, "udp", "short.test.", mdns.TypeA, false, "")
	f.ask(t, "udp", "short.test.", mdns.TypeA, false, "")
	if n := f.up.count("short.test.", "A"); n != 2 {
		t.Errorf("a TTL-0 answer was cached: upstream asked %d times", n)
	}
}

func TestTruncation(t *testing.T) {
	f := start(t, nil)
	r := f.ask(t, "udp", "big.test.", mdns.TypeA, false, "")
	if !r.Truncated {
		t.Errorf("40 addresses over UDP without EDNS: not truncated (%d answers)", len(r.Answer))
	}
	r = f.ask(t, "tcp", "big.test.", mdns.TypeA, false, "")
	if r.Truncated || len(r.Answer) != 40 {
		t.Errorf("over TCP: truncated %v, %d answers", r.Truncated, len(r.Answer))
	}
}

func TestResolve(t *testing.T) {
	f := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := f.s.Resolve(ctx, "Allowed.Test.")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[192.0.2.10 2001:db8::10]" {
		t.Errorf("Resolve = %v", got)
	}
	// The sandbox's query is answered from the same cache.
	f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, "")
	if q := f.log.wait(t, "allowed.test"); !q.Cached {
		t.Errorf("sandbox query not answered from the proxy's cache: %+v", q)
	}
	if n := f.up.count("allowed.test.", "A"); n != 1 {
		t.Errorf("upstream asked %d times", n)
	}
	// Resolve applies no policy; a missing name is ErrNotFound.
	if got, err := f.s.Resolve(ctx, "denied.test"); err != nil || len(got) != 1 {
		t.Errorf("Resolve(denied.test) = %v, %v", got, err)
	}
	if _, err := f.s.Resolve(ctx, "nothere.test"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resolve(missing) = %v, want ErrNotFound", err)
	}
	if _, err := f.s.Resolve(ctx, "bad name"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Resolve(bad name) = %v, want ErrInvalid", err)
	}
}

func TestUpstreamFailover(t *testing.T) {
	// A port with nothing behind it: the exchange fails at once.
	dead, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close()
	up := startUpstream(t)
	f := start(t, func(c *Config) {
		c.Upstream = []string{deadAddr, up.addr}
		c.UpstreamTimeout = 500 * time.Millisecond
	})
	if r := f.ask(t, "udp", "allowed.test.", mdns.TypeA, false, ""); strings.Join(addrs(r), ",") != "192.0.2.10" {
		t.Errorf("with the first upstream dead: %s %v", mdns.RcodeToString[r.Rcode], addrs(r))
	}
	g := start(t, func(c *Config) {
		c.Upstream = []string{deadAddr}
		c.UpstreamTimeout = 500 * time.Millisecond
	})
	if r := g.ask(t, "udp", "allowed.test.", mdns.TypeA, false, ""); r.Rcode != mdns.RcodeServerFailure {
		t.Errorf("no upstream: %s", mdns.RcodeToString[r.Rcode])
	}
	if q := g.log.wait(t, "allowed.test"); !strings.HasPrefix(q.Reason, "upstream") {
		t.Errorf("logged %+v", q)
	}
}

func TestTCPConnLimit(t *testing.T) {
	f := start(t, func(c *Config) { c.MaxTCPConns = 2 })
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", f.s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Make sure both were accepted before the third.
	for _, c := range conns {
		co := &mdns.Conn{Conn: c}
		m := new(mdns.Msg)
		m.SetQuestion("allowed.test.", mdns.TypeA)
		co.SetDeadline(time.Now().Add(3 * time.Second))
		if err := co.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if _, err := co.ReadMsg(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := net.Dial("tcp", f.s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
		t.Errorf("third connection was left open (%v), want it closed", err)
	}
}

func TestCacheBound(t *testing.T) {
	c := newCache(3)
	now := time.Now()
	for i := 0; i < 5; i++ {
		e := &entry{}
		e.setExpiry(time.Minute)
		c.put(cacheKey{name: fmt.Sprint(i), qtype: 1}, e)
	}
	if c.len() != 3 {
		t.Fatalf("len %d", c.len())
	}
	if _, ok := c.get(cacheKey{name: "0", qtype: 1}, now); ok {
		t.Error("oldest entry not evicted")
	}
	if _, ok := c.get(cacheKey{name: "4", qtype: 1}, now); !ok {
		t.Error("newest entry evicted")
	}
	if _, ok := c.get(cacheKey{name: "4", qtype: 1}, now.Add(2*time.Minute)); ok {
		t.Error("expired entry returned")
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		name    string
		valid   bool
		suspect bool
	}{
		{"example.com", true, false},
		{"_http._tcp.example.com", true, false},
		{"api-1.files.example.net", true, false},
		{"mycompany-staging-loadbalancer.example.com", true, false},
		{"storage.googleapis.com", true, false},
		{"", false, false},
		{"a..b", false, false},
		{`a\000b.com`, false, false},
		{"a b.com", false, false},
		{strings.Repeat("a", 64) + ".com", false, true},
		{"nrsxg5dbnzssa43fmnzgk5bamrqxiyjanfzsa2dfojsq.evil.test", true, true},
		{"k5xgs4dbnz2w4zlt.gm3toojv.evil.test", true, false}, // short base32 labels: below the thresholds
		{strings.Repeat("abcdefgh.", 12) + "evil.test", true, true},
	} {
		if got := validName(c.name); got != c.valid {
			t.Errorf("validName(%q) = %v", c.name, got)
		}
		if got := suspect(c.name) != ""; got != c.suspect {
			t.Errorf("suspect(%q) = %q", c.name, suspect(c.name))
		}
	}
}
