package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/shrink"
)

// Kind is what a decision was made on.
type Kind string

const (
	KindTCP  Kind = "tcp"  // a connection decided by address and port
	KindTLS  Kind = "tls"  // a TLS connection decided by SNI
	KindHTTP Kind = "http" // one HTTP request (plain, or intercepted HTTPS)
	KindDNS  Kind = "dns"  // a name asked of the resolver
)

// DecideArgs is what the proxy (or the resolver) knows when it asks.
type DecideArgs struct {
	Sandbox string
	Kind    Kind
	// TLS: for KindHTTP, the request arrived over TLS (scheme https).
	TLS bool
	// Host is the SNI (KindTLS) or the request's host (KindHTTP), without
	// port; empty when unknown. An address here is decided as an address.
	Host string
	// IP is the destination address when there is one (the original
	// destination of a TCP connection).
	IP   netip.Addr
	Port uint16
	// Method and Path (decoded, as in url.URL.Path) of an HTTP request.
	Method string
	Path   string
}

// Decision is the answer, with what the audit log and a refused client
// are told.
type Decision struct {
	Allow bool
	// Rule is the rule that decided, as the user wrote it ("preset:pypi"
	// for a preset's rule); empty when no rule matched.
	Rule string
	// Reason says why, for people and agents.
	Reason string
	// Intercept: the TLS connection must be terminated and each request
	// decided (the host has path or method rules, deny rules on paths, or
	// secrets to inject).
	Intercept bool
	// Suggest, on a denial nothing in Deny caused, is the CLI flags that
	// would allow exactly this: "--allow https://api.example.com/v2/x --method GET".
	Suggest string
}

// EngineConfig configures an Engine.
type EngineConfig struct {
	// Public reports whether an address is on the public internet, for the
	// internet preset and the check on resolved addresses. Default
	// PublicAddr; tests replace it to make a loopback address "public".
	Public func(netip.Addr) bool
	// GrantUsed hears that a grant for one use (PolicyGrant.Once) was
	// used at a time, and ends at until (OnceGrace later). It is called
	// on a goroutine of its own.
	GrantUsed func(id, request string, at, until time.Time)
}

// OnceGrace is how long a grant for one use stays after its first use:
// one connection is decided more than once (its name looked up, a
// proxied client's CONNECT, then the tunnel's TLS).
const OnceGrace = 3 * time.Second

// Engine holds the compiled policy of every sandbox and decides against
// them. Policies are swapped atomically: a connection or request decided
// after Set returns uses the new policy. The proxy and the resolver share
// one Engine.
type Engine struct {
	public    func(netip.Addr) bool
	grantUsed func(id, request string, at, until time.Time)

	mu       sync.RWMutex
	policies map[string]*compiled
	polPeak  int // for shrink.Map
	onChange []func(id string)
}

// NewEngine returns an Engine without policies: every sandbox is denied
// everything until Set gives it one.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Public == nil {
		cfg.Public = PublicAddr
	}
	return &Engine{public: cfg.Public, grantUsed: cfg.GrantUsed, policies: map[string]*compiled{}}
}

// Set validates p and makes it sandbox id's policy.
func (e *Engine) Set(id string, p *api.Policy) error {
	if id == "" {
		return errdefs.Invalid("sandbox", "empty id")
	}
	c, err := compilePolicy(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.putUnlock(id, c)
	return nil
}

// putUnlock makes c sandbox id's policy, releases e.mu (held) and tells
// the change hooks.
func (e *Engine) putUnlock(id string, c *compiled) {
	e.put(id, c)
	hooks := e.onChange
	e.mu.Unlock()
	for _, h := range hooks {
		h(id)
	}
}

// put makes c sandbox id's policy, its grants for one use reporting to
// the engine; e.mu is held.
func (e *Engine) put(id string, c *compiled) {
	for _, r := range c.allow {
		if r.onUse != nil {
			request := r.grant
			r.onUse = func() { go e.used(id, request, time.Now()) }
		}
	}
	e.policies[id] = c
}

// used ends a grant for one use OnceGrace after its first use at.
func (e *Engine) used(id, request string, at time.Time) {
	until := at.Add(OnceGrace)
	e.rewrite(id, func(gs []api.PolicyGrant) []api.PolicyGrant {
		for i, g := range gs {
			if g.Request == request && g.Once && g.Until == nil {
				gs[i].Until = &until
			}
		}
		return gs
	})
	if e.grantUsed != nil {
		e.grantUsed(id, request, at, until)
	}
}

// rewrite recompiles sandbox id's policy with its grants changed by f.
func (e *Engine) rewrite(id string, f func([]api.PolicyGrant) []api.PolicyGrant) *compiled {
	e.mu.Lock()
	c := e.policies[id]
	if c == nil {
		e.mu.Unlock()
		return nil
	}
	p := clonePolicy(c.policy)
	p.Grants = f(p.Grants)
	nc, err := compilePolicy(p)
	if err != nil {
		// It compiled before with these grants or more.
		e.mu.Unlock()
		return c
	}
	e.putUnlock(id, nc)
	return nc
}

// Remove forgets sandbox id; it is denied everything afterwards.
func (e *Engine) Remove(id string) {
	e.mu.Lock()
	delete(e.policies, id)
	e.policies = shrink.Map(e.policies, &e.polPeak)
	hooks := e.onChange
	e.mu.Unlock()
	for _, h := range hooks {
		h(id)
	}
}

// Policy returns a copy of sandbox id's policy.
func (e *Engine) Policy(id string) (*api.Policy, bool) {
	c := e.get(id)
	if c == nil {
		return nil, false
	}
	return clonePolicy(c.policy), true
}

func (e *Engine) get(id string) *compiled {
	e.mu.RLock()
	c := e.policies[id]
	e.mu.RUnlock()
	if c == nil || c.expires.IsZero() {
		return c
	}
	if now := time.Now(); now.Before(c.expires) {
		return c
	}
	// A grant ended: the policy is compiled again without it, and the
	// proxy's pooled connections of the old one are dropped (onChange).
	return e.rewrite(id, func(gs []api.PolicyGrant) []api.PolicyGrant {
		now := time.Now()
		return slices.DeleteFunc(gs, func(g api.PolicyGrant) bool { return g.Until != nil && !now.Before(*g.Until) })
	})
}

// Mode returns sandbox id's policy mode ("" for none).
func (e *Engine) Mode(id string) string {
	if c := e.get(id); c != nil {
		return c.policy.Mode
	}
	return ""
}

func (e *Engine) watch(f func(id string)) {
	e.mu.Lock()
	e.onChange = append(e.onChange, f)
	e.mu.Unlock()
}

var noPolicy = Decision{Reason: "the sandbox has no egress policy"}

// Decide decides a connection or a request.
func (e *Engine) Decide(a DecideArgs) Decision {
	c := e.get(a.Sandbox)
	if c == nil {
		return noPolicy
	}
	return c.decide(a, e.public)
}

// DecideName decides whether the resolver answers a name: allowed when
// any allow rule or preset could allow a connection to it and no deny
// rule for the whole name (without a port) refuses it.
func (e *Engine) DecideName(id, name string) Decision {
	c := e.get(id)
	if c == nil {
		return noPolicy
	}
	return c.decideName(normHost(name))
}

// CheckAddr decides whether the proxy may connect to address a (port 0:
// any port) after resolving a name allowed by name: public addresses
// pass, others only through an allow rule aimed inside their range, and
// an address rule in Deny refuses. The resolver uses it to filter answers.
func (e *Engine) CheckAddr(id string, a netip.Addr, port uint16) Decision {
	c := e.get(id)
	if c == nil {
		return noPolicy
	}
	return c.checkAddr(a.Unmap(), port, "", e.public)
}

// compiled is a validated policy ready for matching.
type compiled struct {
	policy   *api.Policy
	allow    []*rule
	deny     []*rule
	internet bool
	// allowFirst: an allow rule wins over a deny rule that also matches
	// (Policy.Precedence "allow").
	allowFirst bool
	bindings   []*binding
	// expires is when the first of its grants ends (zero: none ends).
	expires time.Time
}

func compilePolicy(p *api.Policy) (*compiled, error) {
	if p == nil {
		p = &api.Policy{}
	}
	c := &compiled{policy: clonePolicy(p)}
	for i, r := range p.Allow {
		cr, err := compileRule(api.PolicyRule{Match: strings.TrimSpace(r.Match), Methods: normMethods(r.Methods)}, "")
		if err != nil {
			return nil, invalidEntry("allow", i, r.Match, err)
		}
		c.allow = append(c.allow, cr)
	}
	for i, r := range p.Deny {
		cr, err := compileRule(api.PolicyRule{Match: strings.TrimSpace(r.Match), Methods: normMethods(r.Methods)}, "")
		if err != nil {
			return nil, invalidEntry("deny", i, r.Match, err)
		}
		c.deny = append(c.deny, cr)
	}
	for i, name := range p.Presets {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == PresetInternet {
			c.internet = true
			continue
		}
		hosts, ok := registryPresets[name]
		if !ok {
			return nil, invalidEntry("presets", i, name, errorf("no such preset (known: %s)", strings.Join(presetNames(), ", ")))
		}
		for _, h := range hosts {
			cr, err := compileRule(api.PolicyRule{Match: h}, name)
			if err != nil {
				panic("preset " + name + ": " + err.Error())
			}
			c.allow = append(c.allow, cr)
		}
	}
	switch p.Mode {
	case "", api.PolicyModeDeny, api.PolicyModeAsk:
	default:
		return nil, errdefs.Invalid("mode", "%q is not a mode (deny, ask)", p.Mode)
	}
	switch p.Precedence {
	case "", api.PolicyPrecedenceDeny:
	case api.PolicyPrecedenceAllow:
		c.allowFirst = true
	default:
		return nil, errdefs.Invalid("precedence", "%q is not a precedence (deny, allow)", p.Precedence)
	}
	now := time.Now()
	for i, g := range p.Grants {
		if g.Request == "" {
			return nil, invalidEntry("grants", i, g.Match, errorf("names no request"))
		}
		cr, err := compileRule(api.PolicyRule{Match: strings.TrimSpace(g.Match)}, "")
		if err != nil {
			return nil, invalidEntry("grants", i, g.Match, err)
		}
		if g.Until != nil && !now.Before(*g.Until) {
			continue // ended
		}
		cr.grant = g.Request
		cr.allowed = fmt.Sprintf("allowed by request %s (%q, approved)", g.Request, cr.src)
		if g.Once && g.Until == nil {
			cr.onUse = func() {} // Engine.put makes it report
		}
		if g.Until != nil && (c.expires.IsZero() || g.Until.Before(c.expires)) {
			c.expires = *g.Until
		}
		c.allow = append(c.allow, cr)
	}
	seen := map[string]bool{}
	for i, b := range p.Secrets {
		cb, err := compileBinding(b)
		if err != nil {
			return nil, invalidEntry("secrets", i, b.Name, err)
		}
		if seen[strings.ToUpper(b.Name)] {
			return nil, invalidEntry("secrets", i, b.Name, errorf("bound twice"))
		}
		seen[strings.ToUpper(b.Name)] = true
		c.bindings = append(c.bindings, cb)
	}
	return c, nil
}

// ruleName is how a decision names a rule.
func (r *rule) name() string {
	if r.grant != "" {
		return "request:" + r.grant
	}
	if r.preset != "" {
		return "preset:" + r.preset
	}
	return r.src
}

func allowedBy(r *rule) Decision {
	if r.onUse != nil && r.used.CompareAndSwap(false, true) {
		r.onUse()
	}
	return Decision{Allow: true, Rule: r.name(), Reason: r.allowed}
}

func deniedBy(r *rule) Decision {
	return Decision{Rule: r.name(), Reason: fmt.Sprintf("denied by --deny %s", r.src)}
}

var allowedInternet = Decision{Allow: true, Rule: "preset:" + PresetInternet, Reason: "allowed by preset internet (a public address)"}

func (c *compiled) decide(a DecideArgs, public func(netip.Addr) bool) Decision {
	host := normHost(a.Host)
	if ip, err := netip.ParseAddr(host); err == nil {
		if a.Kind == KindHTTP {
			return c.decideHTTP(a, host, ip.Unmap(), public)
		}
		a.IP, host = ip.Unmap(), ""
	}
	switch {
	case a.Kind == KindHTTP:
		return c.decideHTTP(a, host, netip.Addr{}, public)
	case a.Kind == KindTLS && host != "":
		return c.decideTLS(host, a.Port)
	case a.Kind == KindDNS:
		return c.decideName(host)
	}
	return c.decideIP(a.IP.Unmap(), a.Port, public)
}

func normHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return h
}

func (r *rule) matchPort(port uint16) bool { return r.port == 0 || r.port == port }

func (r *rule) matchAddr(ip netip.Addr, port uint16) bool {
	return r.kind == kindIP && r.prefix.Contains(ip) && r.matchPort(port)
}

// decideIP decides a connection known only by address and port.
func (c *compiled) decideIP(ip netip.Addr, port uint16, public func(netip.Addr) bool) Decision {
	if !ip.IsValid() {
		return Decision{Reason: "no destination address"}
	}
	isPublic := public(ip)
	allowRule := func() *rule {
		for _, r := range c.allow {
			if r.matchAddr(ip, port) && (isPublic || targetsNonPublic(r.prefix)) {
				return r
			}
		}
		return nil
	}
	if c.allowFirst {
		if r := allowRule(); r != nil {
			return allowedBy(r)
		}
	}
	for _, r := range c.deny {
		if r.matchAddr(ip, port) {
			return deniedBy(r)
		}
	}
	if r := allowRule(); r != nil {
		return allowedBy(r)
	}
	if isPublic && c.internet {
		return allowedInternet
	}
	d := Decision{Reason: fmt.Sprintf("no rule allows %s", hostPort(ip.String(), port)), Suggest: "--allow " + hostPort(ip.String(), port)}
	if !isPublic {
		d.Reason = fmt.Sprintf("%s is %s; only a rule naming it allows it", ip, addrClass(ip))
	}
	return d
}

// checkAddr decides an address host (a name; "" when unknown) resolved
// to. With allowFirst, an allow rule naming host or the address wins over
// the deny rules; only a rule naming a non-public address opens it.
func (c *compiled) checkAddr(ip netip.Addr, port uint16, host string, public func(netip.Addr) bool) Decision {
	isPublic := public(ip)
	allowRule := func() *rule {
		for _, r := range c.allow {
			switch {
			case r.kind == kindIP && r.prefix.Contains(ip) && (port == 0 || r.matchPort(port)) && (isPublic || targetsNonPublic(r.prefix)):
				return r
			case r.kind == kindHTTP && r.host.addr == ip && (port == 0 || r.port == port):
				return r
			}
		}
		return nil
	}
	if c.allowFirst {
		if r := allowRule(); r != nil {
			return allowedBy(r)
		}
		if isPublic && host != "" && c.allowsName(host, port) {
			return Decision{Allow: true, Reason: "a public address of an allowed name"}
		}
	}
	for _, r := range c.deny {
		if r.kind == kindIP && r.prefix.Contains(ip) && (port == 0 || r.matchPort(port)) {
			return deniedBy(r)
		}
	}
	if isPublic {
		return Decision{Allow: true, Reason: "a public address"}
	}
	if r := allowRule(); r != nil {
		return allowedBy(r)
	}
	return Decision{
		Reason:  fmt.Sprintf("resolved to %s, %s (DNS rebinding is refused); only a rule naming the address allows it", ip, addrClass(ip)),
		Suggest: "--allow " + hostPort(ip.String(), port),
	}
}

// decideTLS decides a TLS connection by its SNI.
func (c *compiled) decideTLS(host string, port uint16) Decision {
	if c.allowFirst {
		if d, ok := c.allowTLS(host, port, false); ok {
			return d
		}
	}
	needRequest := false
	for _, r := range c.deny {
		switch {
		case r.kind == kindDomain && r.host.match(host) && r.matchPort(port):
			return deniedBy(r)
		case r.kind == kindHTTP && r.scheme == "https" && r.host.match(host) && r.port == port:
			if r.wholeHost() {
				return deniedBy(r)
			}
			needRequest = true
		}
	}
	if d, ok := c.allowTLS(host, port, needRequest); ok {
		return d
	}
	if c.internet {
		d := allowedInternet
		d.Reason = "allowed by preset internet (if the name resolves to public addresses)"
		d.Intercept = needRequest || c.hasBindingFor(host)
		return d
	}
	return Decision{Reason: fmt.Sprintf("no rule allows %s", host), Suggest: "--allow " + host}
}

// allowTLS is the decision of the allow rules on a TLS connection to
// host (ok false: none matches); needRequest asks that each request be
// decided (deny rules on some of the host's paths).
func (c *compiled) allowTLS(host string, port uint16, needRequest bool) (Decision, bool) {
	var hostRule, pathRule *rule
	for _, r := range c.allow {
		switch {
		case r.kind == kindDomain && r.host.match(host) && r.matchPort(port):
			hostRule = first(hostRule, r)
		case r.kind == kindHTTP && r.scheme == "https" && r.host.match(host) && r.port == port:
			// A URL rule is decided per request, even one for every path:
			// that is how a policy asks for the Host check (fronting).
			pathRule = first(pathRule, r)
		}
	}
	switch {
	case hostRule != nil:
		d := allowedBy(hostRule)
		d.Intercept = needRequest || c.hasBindingFor(host)
		return d, true
	case pathRule != nil && (!c.internet || c.allowFirst):
		return Decision{Allow: true, Intercept: true, Rule: pathRule.name(),
			Reason: fmt.Sprintf("%s has URL rules (%q); each request is decided", host, pathRule.src)}, true
	}
	return Decision{}, false
}

// allowsName reports whether an allow rule names host (on port; 0: any).
func (c *compiled) allowsName(host string, port uint16) bool {
	for _, r := range c.allow {
		switch {
		case r.kind == kindDomain && r.host.match(host) && (port == 0 || r.matchPort(port)):
			return true
		case r.kind == kindHTTP && !r.host.addr.IsValid() && r.host.match(host) && (port == 0 || r.port == port):
			return true
		}
	}
	return false
}

func first(have, r *rule) *rule {
	if have != nil {
		return have
	}
	return r
}

func (c *compiled) hasBindingFor(host string) bool {
	for _, b := range c.bindings {
		if b.matchHost(host) {
			return true
		}
	}
	return false
}

func (r *rule) matchHTTP(scheme, host string, ip netip.Addr, port uint16, cleaned, method string) bool {
	if r.kind != kindHTTP || r.scheme != scheme || r.port != port || !r.path.match(cleaned) || !r.matchMethod(method) {
		return false
	}
	if ip.IsValid() {
		return r.host.addr == ip
	}
	return r.host.match(host)
}

// decideHTTP decides one request. ip is set when the host is an address.
func (c *compiled) decideHTTP(a DecideArgs, host string, ip netip.Addr, public func(netip.Addr) bool) Decision {
	scheme := "http"
	if a.TLS {
		scheme = "https"
	}
	if host == "" && !ip.IsValid() {
		if !a.IP.IsValid() {
			return Decision{Reason: "the request names no host"}
		}
		ip = a.IP.Unmap()
	}
	cleaned, bad := cleanRequestPath(a.Path)
	if bad != "" {
		return Decision{Reason: "refused path " + strconv.Quote(a.Path) + ": " + bad}
	}
	method := a.Method
	allowRule := func() *rule {
		for _, r := range c.allow {
			switch {
			case ip.IsValid() && r.matchAddr(ip, a.Port) && (public(ip) || targetsNonPublic(r.prefix)):
				return r
			case !ip.IsValid() && r.kind == kindDomain && r.host.match(host) && r.matchPort(a.Port):
				return r
			case r.matchHTTP(scheme, host, ip, a.Port, cleaned, method):
				return r // a URL rule naming an address targets it, private or not
			}
		}
		return nil
	}
	if c.allowFirst {
		if r := allowRule(); r != nil {
			return allowedBy(r)
		}
	}
	for _, r := range c.deny {
		switch {
		case ip.IsValid() && r.matchAddr(ip, a.Port):
			return deniedBy(r)
		case !ip.IsValid() && r.kind == kindDomain && r.host.match(host) && r.matchPort(a.Port):
			return deniedBy(r)
		case r.matchHTTP(scheme, host, ip, a.Port, cleaned, method):
			return deniedBy(r)
		}
	}
	if r := allowRule(); r != nil {
		return allowedBy(r)
	}
	if c.internet && (!ip.IsValid() || public(ip)) {
		return allowedInternet
	}
	// Denied by default: suggest the narrowest rule when the host already
	// has path rules (the user is scoping it), else the whole host.
	name := host
	if ip.IsValid() {
		name = ip.String()
		if ip.Is6() {
			name = "[" + name + "]"
		}
	}
	url := scheme + "://" + name
	if (scheme == "https" && a.Port != 443) || (scheme == "http" && a.Port != 80) {
		url += ":" + strconv.Itoa(int(a.Port))
	}
	url += cleaned
	d := Decision{Reason: fmt.Sprintf("no rule allows %s %s", method, url)}
	if ip.IsValid() && !public(ip) {
		d.Reason += fmt.Sprintf(" (%s is %s; only a rule naming it allows it)", ip, addrClass(ip))
	}
	scoped, methods := false, false
	for _, r := range c.allow {
		if r.kind == kindHTTP && r.scheme == scheme && (r.host.match(host) || ip.IsValid() && r.host.addr == ip) {
			scoped = true
			methods = methods || len(r.method) > 0
		}
	}
	switch {
	case scoped && methods:
		d.Suggest = "--allow " + url + " --method " + method
	case scoped:
		d.Suggest = "--allow " + url
	case ip.IsValid():
		d.Suggest = "--allow " + hostPort(ip.String(), a.Port)
	default:
		d.Suggest = "--allow " + host
	}
	return d
}

func (c *compiled) decideName(name string) Decision {
	if name == "" {
		return Decision{Reason: "empty name"}
	}
	allowRule := func() *rule {
		for _, r := range c.allow {
			if (r.kind == kindDomain || r.kind == kindHTTP) && r.host.match(name) {
				return r
			}
		}
		return nil
	}
	if c.allowFirst {
		if r := allowRule(); r != nil {
			return allowedBy(r)
		}
	}
	for _, r := range c.deny {
		if (r.kind == kindDomain && r.port == 0 || r.wholeHost()) && r.host.match(name) {
			return deniedBy(r)
		}
	}
	if r := allowRule(); r != nil {
		return allowedBy(r)
	}
	if c.internet {
		d := allowedInternet
		d.Reason = "allowed by preset internet (answers must be public addresses)"
		return d
	}
	return Decision{Reason: fmt.Sprintf("no rule allows %s", name), Suggest: "--allow " + name}
}

func hostPort(host string, port uint16) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == 0 {
		return host
	}
	return host + ":" + strconv.Itoa(int(port))
}

func addrClass(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a == netip.AddrFrom4([4]byte{169, 254, 169, 254}):
		return "the cloud metadata address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsMulticast():
		return "a multicast address"
	case netip.MustParsePrefix("100.64.0.0/10").Contains(a):
		return "a CGNAT address"
	}
	return "not a public address"
}
