package egress

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/paddock-dev/paddock/api"
)

// A secret binding (api.SecretBinding) attaches a stored secret to a sandbox with a scope. The
// sandbox sees only a placeholder (PADDOCK_SECRET_<NAME>=paddock-secret-…);
// the proxy puts the real value into requests inside the scope, over
// HTTPS only, and blocks any readable request that carries a placeholder
// outside its scope. A binding allows nothing by itself: its hosts must
// also be allowed by the policy.
//
// Scope: Hosts (required), each a name or *.name with an optional :PORT
// and an optional https:// in front ("api.example.com" is
// https://api.example.com:443, the scheme's port; "api.example.com:8443"
// only that port: another port of the host never gets the secret),
// optionally Paths (same path syntax as URL rules: "/v1/" a prefix,
// "/v1/x" exact, "re:/v1/[0-9]+" a regex) and Methods.
//
// Inside the scope:
//   - the Inject target is set from the secret when the request lacks it
//     or when it carries the placeholder (a target the client filled with
//     something else is left alone);
//   - every other header value and query value carrying the placeholder
//     has it replaced by the raw value.
//
// Outside the scope a placeholder anywhere in the request line, a header
// (Basic credentials decoded) or the body refuses the request with 403 and
// an event flagged exfiltration.
//
// Inject (api.SecretInjection) is where the secret goes; exactly one of
// Header (a header name, with Format its value holding one %s where the
// secret goes, default "%s"), Basic (Authorization: Basic
// base64(user:secret)) and Query (a query parameter set to the secret).

// ParseInjection parses the CLI form of an injection:
// "Authorization: Bearer %s" (a header and its format), "basic:USER" or
// "query:PARAM".
func ParseInjection(s string) (api.SecretInjection, error) {
	var inj api.SecretInjection
	switch {
	case strings.HasPrefix(s, "basic:"):
		inj.Basic = &api.BasicAuth{User: s[len("basic:"):]}
	case strings.HasPrefix(s, "query:"):
		inj.Query = s[len("query:"):]
	default:
		name, format, ok := strings.Cut(s, ":")
		if !ok {
			return inj, errorf("want \"Header: format with %%s\", basic:USER or query:PARAM")
		}
		inj.Header, inj.Format = strings.TrimSpace(name), strings.TrimSpace(format)
	}
	return inj, validateInjection(inj)
}

func validateInjection(inj api.SecretInjection) error {
	n := 0
	if inj.Header != "" {
		n++
	}
	if inj.Basic != nil {
		n++
	}
	if inj.Query != "" {
		n++
	}
	if n != 1 {
		return errorf("inject: set exactly one of header, basic and query")
	}
	switch {
	case inj.Header != "":
		if !validToken(inj.Header) {
			return errorf("inject: %q is not a header name", inj.Header)
		}
		switch strings.ToLower(inj.Header) {
		case "host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer":
			return errorf("inject: %s cannot carry a secret", inj.Header)
		}
		f := inj.Format
		if f == "" {
			f = "%s"
		}
		if strings.Count(f, "%s") != 1 || strings.Count(f, "%") != 1 {
			return errorf("inject: format must hold one %%s and no other %%")
		}
		if !validHeaderValue(strings.Replace(f, "%s", "x", 1)) {
			return errorf("inject: format is not a valid header value")
		}
	case inj.Basic != nil:
		if strings.ContainsAny(inj.Basic.User, ":\r\n\x00") {
			return errorf("inject: basic user may not hold ':' or control bytes")
		}
	default:
		if strings.ContainsAny(inj.Query, "&=#?\r\n\x00 ") {
			return errorf("inject: %q is not a query parameter name", inj.Query)
		}
	}
	return nil
}

var secretNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)

func validSecretName(name string) error {
	if !secretNameRE.MatchString(name) {
		return errorf("secret names are a letter then letters, digits or _ (64 at most)")
	}
	return nil
}

// EnvVar is the environment variable that carries the placeholder of the
// secret name inside a sandbox: PADDOCK_SECRET_<NAME> in upper case.
func EnvVar(name string) string { return "PADDOCK_SECRET_" + strings.ToUpper(name) }

// PlaceholderPrefix starts every placeholder; the proxy scans for it.
const PlaceholderPrefix = "paddock-secret-"

// placeholderLen is the length of every placeholder: the prefix and 32 hex
// digits (128 bits).
const placeholderLen = len(PlaceholderPrefix) + 32

// placeholder derives the placeholder of one secret in one sandbox from a
// key only the daemon holds: unguessable from outside, different in every
// sandbox, and the same after a daemon restart without being stored.
func placeholder(key []byte, sandbox, name string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(sandbox))
	m.Write([]byte{0})
	m.Write([]byte(strings.ToUpper(name)))
	return PlaceholderPrefix + hex.EncodeToString(m.Sum(nil)[:16])
}

// binding is a secret binding compiled for matching.
type binding struct {
	api.SecretBinding
	hosts   []boundHost
	paths   []pathPattern
	methods []string
}

// boundHost is one host of a binding's scope: a name pattern and the one
// port its HTTPS is served on.
type boundHost struct {
	hostPattern
	port uint16
}

func (h boundHost) String() string {
	if h.port == 443 {
		return "https://" + h.hostPattern.String()
	}
	return fmt.Sprintf("https://%s:%d", h.hostPattern.String(), h.port)
}

// parseBoundHost takes name, *.name, either with :PORT, and an optional
// https:// in front; the port defaults to 443.
func parseBoundHost(s string) (boundHost, error) {
	hp := s
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		if !strings.EqualFold(scheme, "https") {
			return boundHost{}, errorf("secrets go over HTTPS only, not %s", scheme)
		}
		hp = rest
	}
	if strings.ContainsAny(hp, "/?#@") {
		return boundHost{}, errorf("a host is a name with an optional :PORT, no path")
	}
	b := boundHost{port: 443}
	name := hp
	if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		port, err := parsePort(hp[i+1:])
		if err != nil {
			return boundHost{}, err
		}
		name, b.port = hp[:i], port
	}
	pat, err := parseDomain(name)
	if err != nil {
		return boundHost{}, err
	}
	b.hostPattern = pat
	return b, nil
}

func compileBinding(b api.SecretBinding) (*binding, error) {
	if err := validSecretName(b.Name); err != nil {
		return nil, err
	}
	if len(b.Hosts) == 0 {
		return nil, errorf("a binding needs hosts")
	}
	c := &binding{SecretBinding: b}
	for _, h := range b.Hosts {
		hp, err := parseBoundHost(h)
		if err != nil {
			return nil, errorf("host %q: %v", h, err)
		}
		c.hosts = append(c.hosts, hp)
	}
	for _, p := range b.Paths {
		var pp pathPattern
		switch {
		case strings.HasPrefix(p, "re:"):
			re, err := regexp.Compile("^(?:" + p[3:] + ")$")
			if err != nil {
				return nil, errorf("path %q: %v", p, err)
			}
			pp = pathPattern{kind: pathRegex, s: p[3:], re: re}
		default:
			if bad := uncleanPath(p); bad != "" {
				return nil, errorf("path %q: %s", p, bad)
			}
			pp = pathPattern{kind: pathExact, s: p}
			if strings.HasSuffix(p, "/") {
				pp.kind = pathPrefix
			}
		}
		c.paths = append(c.paths, pp)
	}
	for _, m := range normMethods(b.Methods) {
		if !validToken(m) {
			return nil, errorf("%q is not an HTTP method", m)
		}
		c.methods = append(c.methods, m)
	}
	if err := validateInjection(b.Inject); err != nil {
		return nil, err
	}
	return c, nil
}

func (b *binding) matchHost(host string) bool {
	for _, h := range b.hosts {
		if h.match(host) {
			return true
		}
	}
	return false
}

// inScope reports whether a request is inside the binding's scope:
// HTTPS, one of its hosts on that host's port, and its paths and methods
// if it has any.
func (b *binding) inScope(https bool, host string, port uint16, cleanedPath, method string) bool {
	if !https {
		return false
	}
	hostOK := false
	for _, h := range b.hosts {
		hostOK = hostOK || h.port == port && h.match(host)
	}
	if !hostOK {
		return false
	}
	if len(b.paths) > 0 {
		ok := false
		for _, p := range b.paths {
			ok = ok || p.match(cleanedPath)
		}
		if !ok {
			return false
		}
	}
	if len(b.methods) > 0 {
		ok := false
		for _, m := range b.methods {
			ok = ok || m == method
		}
		if !ok {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v can be sent as a header value: no
// control bytes but tab, so no CR or LF to start another header.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
