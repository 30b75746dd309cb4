package egress

import (
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/paddock-dev/paddock/api"
)

type ruleKind uint8

const (
	kindDomain ruleKind = iota + 1 // a name or *.name, optional port
	kindIP                         // an address or network, optional port
	kindHTTP                       // scheme + host + path (+ methods)
)

// rule is an api.PolicyRule compiled for matching.
type rule struct {
	src    string // ruleString: what the user wrote
	preset string // the preset it comes from, if any
	kind   ruleKind
	host   hostPattern  // kindDomain, kindHTTP
	prefix netip.Prefix // kindIP
	port   uint16       // 0: any port (kindHTTP: always set)
	scheme string       // kindHTTP
	path   pathPattern  // kindHTTP
	method []string     // kindHTTP; empty: every method
	// allowed is the reason of a decision this rule allows, made once:
	// the proxy decides every connection and request.
	allowed string
	// grant is the request of a grant (Policy.Grants). onUse, set on a
	// grant for one use, is called by the first decision it allows
	// (used keeps it to one call).
	grant string
	onUse func()
	used  atomic.Bool
}

// hostPattern is a name, *.name, or an address (a URL rule's host may be
// an address).
type hostPattern struct {
	name     string // lower case, no trailing dot; for *.x the x
	wildcard bool
	addr     netip.Addr
}

func (h hostPattern) match(host string) bool {
	if h.addr.IsValid() {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == h.addr
	}
	if h.wildcard {
		return len(host) > len(h.name)+1 && strings.HasSuffix(host, h.name) && host[len(host)-len(h.name)-1] == '.'
	}
	return host == h.name
}

func (h hostPattern) String() string {
	switch {
	case h.addr.IsValid() && h.addr.Is6():
		return "[" + h.addr.String() + "]"
	case h.addr.IsValid():
		return h.addr.String()
	case h.wildcard:
		return "*." + h.name
	}
	return h.name
}

type pathKind uint8

const (
	pathAny pathKind = iota
	pathExact
	pathPrefix
	pathRegex
)

type pathPattern struct {
	kind pathKind
	s    string
	re   *regexp.Regexp
}

func (p pathPattern) match(cleaned string) bool {
	switch p.kind {
	case pathExact:
		return cleaned == p.s
	case pathPrefix:
		return strings.HasPrefix(cleaned, p.s)
	case pathRegex:
		return p.re.MatchString(cleaned)
	}
	return true
}

func (r *rule) matchMethod(m string) bool {
	if len(r.method) == 0 {
		return true
	}
	for _, x := range r.method {
		if x == m {
			return true
		}
	}
	return false
}

// wholeHost reports whether an HTTP rule covers every request to its host
// (no path and no method limit): as a deny rule it refuses the connection.
func (r *rule) wholeHost() bool {
	return r.kind == kindHTTP && r.path.kind == pathAny && len(r.method) == 0
}

func compileRule(r api.PolicyRule, preset string) (*rule, error) {
	s := r.Match
	if s == "" {
		return nil, errorf("empty rule")
	}
	c := &rule{src: ruleString(api.PolicyRule{Match: s, Methods: r.Methods}), preset: preset}
	var err error
	switch {
	case strings.HasPrefix(s, "re:"):
		err = c.parseURL(s[3:], true)
	case strings.Contains(s, "://"):
		err = c.parseURL(s, false)
	default:
		err = c.parseHostRule(s)
	}
	if err != nil {
		return nil, err
	}
	for _, m := range r.Methods {
		if c.kind != kindHTTP {
			return nil, errorf("methods apply only to URL rules (https://host/path)")
		}
		if !validToken(m) || strings.ToUpper(m) != m {
			return nil, errorf("%q is not an HTTP method", m)
		}
		c.method = append(c.method, m)
	}
	c.allowed = fmt.Sprintf("allowed by %q", c.src)
	if preset != "" {
		c.allowed = fmt.Sprintf("allowed by preset %s (%s)", preset, c.src)
	}
	return c, nil
}

// parseHostRule parses a domain or an address, each with an optional port.
func (c *rule) parseHostRule(s string) error {
	if p, port, ok, err := parseIPRule(s); ok {
		if err != nil {
			return err
		}
		c.kind, c.prefix, c.port = kindIP, p, port
		return nil
	}
	host, port := s, uint16(0)
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		var err error
		if port, err = parsePort(s[i+1:]); err != nil {
			return err
		}
		host = s[:i]
	}
	h, err := parseDomain(host)
	if err != nil {
		return err
	}
	c.kind, c.host, c.port = kindDomain, h, port
	return nil
}

// parseIPRule parses 1.2.3.4, 1.2.3.0/24, either with :PORT, ::1, 2001:db8::/32,
// and [v6 or v6/bits]:PORT. ok is false when s is not an address form.
func parseIPRule(s string) (p netip.Prefix, port uint16, ok bool, err error) {
	hostPart := s
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return p, 0, true, errorf("missing ]")
		}
		hostPart = s[1:end]
		if rest := s[end+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return p, 0, true, errorf("expected :PORT after ]")
			}
			if port, err = parsePort(rest[1:]); err != nil {
				return p, 0, true, err
			}
		}
	} else if strings.Count(s, ":") == 1 {
		i := strings.IndexByte(s, ':')
		if _, perr := parsePrefixOrAddr(s[:i]); perr != nil {
			return p, 0, false, nil // a name with a port
		}
		hostPart = s[:i]
		if port, err = parsePort(s[i+1:]); err != nil {
			return p, 0, true, err
		}
	}
	p, err = parsePrefixOrAddr(hostPart)
	if err != nil {
		if _, perr := netip.ParsePrefix(hostPart); perr == nil {
			return p, 0, true, err // a network, but not one a rule can name
		}
		if strings.HasPrefix(s, "[") || strings.Contains(hostPart, ":") || strings.Contains(hostPart, "/") {
			return p, 0, true, errorf("not an IP address or network")
		}
		return p, 0, false, nil
	}
	return p, port, true, nil
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		if p.Addr().Zone() != "" {
			return p, errorf("zones are not allowed")
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 {
				return p, errorf("an IPv4-mapped network needs at least /96")
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if m := p.Masked(); m != p {
			return p, errorf("host bits are set; the network is %s", m)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errorf("zones are not allowed")
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '+' {
		return 0, errorf("%q is not a port (1-65535)", s)
	}
	return uint16(n), nil
}

// parseDomain takes example.com, *.example.com, a trailing dot, and
// internationalized names (turned into their ASCII form).
func parseDomain(s string) (hostPattern, error) {
	var h hostPattern
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if strings.HasPrefix(s, "*.") {
		h.wildcard = true
		s = s[2:]
	}
	if s == "" || s == "*" {
		return h, errorf("not a domain")
	}
	if strings.Contains(s, "*") {
		return h, errorf("a wildcard must be the whole first label, as in *.example.com")
	}
	ascii := s
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return h, errorf("not a domain: write an internationalized name in its ASCII form (xn--...)")
		}
	}
	if len(ascii) > 253 {
		return h, errorf("not a domain: longer than 253 bytes")
	}
	labels := strings.Split(ascii, ".")
	for _, l := range labels {
		if !validLabel(l) {
			return h, errorf("not a domain")
		}
	}
	if allDigits(labels[len(labels)-1]) {
		return h, errorf("not a domain (and not an IP address)")
	}
	h.name = ascii
	return h, nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parseURL parses scheme://host[:port][/path]; with regex the path is an
// RE2 expression matched against the whole path.
func (c *rule) parseURL(s string, regex bool) error {
	i := strings.Index(s, "://")
	if i < 0 {
		return errorf("a regex rule is a URL: re:https://host/path-regex")
	}
	scheme := strings.ToLower(s[:i])
	if scheme != "http" && scheme != "https" {
		return errorf("scheme must be http or https")
	}
	rest := s[i+3:]
	authority, p := rest, ""
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		authority, p = rest[:j], rest[j:]
	}
	if strings.ContainsAny(authority, "@?#") {
		return errorf("a URL rule has no user, query or fragment")
	}
	host, port := authority, uint16(443)
	if scheme == "http" {
		port = 80
	}
	if strings.HasPrefix(authority, "[") {
		end := strings.IndexByte(authority, ']')
		if end < 0 {
			return errorf("missing ]")
		}
		host = authority[1:end]
		if r := authority[end+1:]; r != "" {
			if !strings.HasPrefix(r, ":") {
				return errorf("expected :PORT after ]")
			}
			var err error
			if port, err = parsePort(r[1:]); err != nil {
				return err
			}
		}
	} else if k := strings.LastIndexByte(authority, ':'); k >= 0 {
		var err error
		if port, err = parsePort(authority[k+1:]); err != nil {
			return err
		}
		host = authority[:k]
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return errorf("zones are not allowed")
		}
		c.host = hostPattern{addr: a.Unmap()}
	} else {
		h, err := parseDomain(host)
		if err != nil {
			return errorf("host %q: %v", host, err)
		}
		c.host = h
	}
	c.kind, c.scheme, c.port = kindHTTP, scheme, port
	switch {
	case regex:
		if p == "" {
			return errorf("a regex rule needs a path")
		}
		re, err := regexp.Compile("^(?:" + p + ")$")
		if err != nil {
			return errorf("path regex: %v", err)
		}
		c.path = pathPattern{kind: pathRegex, s: p, re: re}
	case p == "":
		c.path = pathPattern{kind: pathAny}
	default:
		if strings.ContainsAny(p, "?#") {
			return errorf("rules match paths only; drop the query (or use re:)")
		}
		dec, err := url.PathUnescape(p)
		if err != nil {
			return errorf("path: %v", err)
		}
		if bad := uncleanPath(dec); bad != "" {
			return errorf("path: %s", bad)
		}
		if strings.HasSuffix(dec, "/") {
			c.path = pathPattern{kind: pathPrefix, s: dec}
		} else {
			c.path = pathPattern{kind: pathExact, s: dec}
		}
	}
	return nil
}

// cleanRequestPath returns the path used for matching: decoded, with
// duplicate slashes collapsed and a trailing slash kept. A path with dot
// segments, backslashes or control bytes is refused (bad names why): a
// server may resolve those differently than a prefix rule reads them
// (/v1/../admin).
func cleanRequestPath(decoded string) (cleaned, bad string) {
	if decoded == "" {
		decoded = "/"
	}
	if decoded == "*" {
		return decoded, ""
	}
	if bad = uncleanPath(decoded); bad != "" {
		return "", bad
	}
	cleaned = path.Clean(decoded)
	if strings.HasSuffix(decoded, "/") && cleaned != "/" {
		cleaned += "/"
	}
	return cleaned, ""
}

func uncleanPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return "must start with /"
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "control byte or backslash in path"
		}
	}
	for _, seg := range strings.Split(p, "/") {
		if k := strings.IndexByte(seg, ';'); k >= 0 {
			seg = seg[:k] // Tomcat-style path parameters: /..;/
		}
		if seg == "." || seg == ".." {
			return "dot segment in path"
		}
	}
	return ""
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
