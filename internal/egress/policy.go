package egress

import (
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A policy is an api.Policy: nothing is reachable unless a rule in Allow
// or a preset allows it; a rule in Deny wins over every allow, unless
// Precedence is "allow": then a rule in Allow wins over Deny (never the
// internet preset, which a deny rule still overrides).
//
// JSON (the API's and `--policy FILE`'s form; field names are stable):
//
//	{
//	  "allow":   [{"match": "api.example.com"},
//	              {"match": "https://api.example.com/v1/", "methods": ["GET"]},
//	              "10.0.0.0/8:5432"],
//	  "deny":    [{"match": "https://api.example.com/v1/admin/"}],
//	  "presets": ["internet", "pypi"],
//	  "precedence": "deny",
//	  "secrets": [{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"],
//	               "paths": ["/repos/"], "methods": ["GET"],
//	               "inject": {"header": "Authorization", "format": "Bearer %s"}}]
//	}
//
// A rule (api.PolicyRule) is written as an object; a bare string is read
// as {"match": s}. Its Match is one of:
//
//	example.com              that name exactly (any port; example.com:443 for one)
//	*.example.com            any name below example.com, at any depth, but not
//	                         example.com itself (list it too for both)
//	203.0.113.7              an address; with :PORT one port of it
//	10.0.0.0/8               a network; 10.0.0.0/8:5432 one port of it
//	[2001:db8::1]:443        IPv6 with a port; [2001:db8::/32]:443 a network
//	https://api.example.com/v1/        HTTP: scheme, host (a name, *.name or
//	                                   an address), optional :PORT (default
//	                                   the scheme's), and a path: ending in
//	                                   "/" it is a prefix, otherwise exact;
//	                                   no path means every path
//	re:https://api.example.com/v1/[0-9]+/items   the path is a regular
//	                                   expression (RE2) matched against the
//	                                   whole path
//
// Methods limits an HTTP rule to those methods (none: every method). Names
// and addresses decide TLS connections (by SNI) and plain HTTP (by Host);
// an address rule also decides other TCP. A URL rule is decided request
// by request, so the proxy intercepts TLS for its host (and checks that
// every request's Host is the SNI); a domain rule is decided once per
// connection and its TLS is passed through unread, so the Host header
// inside it is never seen (see docs/network.md). A domain rule does not
// allow raw TCP to the addresses the name resolves to. Paths are matched
// on the decoded, cleaned path of the request (never its query),
// case-sensitively.

// ParseRule parses one rule in the CLI's syntax, with the methods given by
// --method. Its errors are errdefs.ErrInvalid.
func ParseRule(s string, methods []string) (api.PolicyRule, error) {
	r := api.PolicyRule{Match: strings.TrimSpace(s), Methods: normMethods(methods)}
	if _, err := compileRule(r, ""); err != nil {
		return api.PolicyRule{}, errdefs.New(errdefs.ErrInvalid, "%q: %v", s, err)
	}
	return r, nil
}

// ruleString is a rule as the CLI takes it: the match, then --method if any.
func ruleString(r api.PolicyRule) string {
	if len(r.Methods) == 0 {
		return r.Match
	}
	return r.Match + " --method " + strings.Join(r.Methods, ",")
}

// ValidatePolicy checks every entry of p and names the first bad one, as
// in `allow[3]: "*.": not a domain`. Its errors are errdefs.ErrInvalid.
func ValidatePolicy(p *api.Policy) error {
	_, err := compilePolicy(p)
	return err
}

// clonePolicy returns a deep copy of p.
func clonePolicy(p *api.Policy) *api.Policy { return p.Clone() }

func normMethods(ms []string) []string {
	var out []string
	for _, m := range ms {
		for _, f := range strings.Split(m, ",") {
			f = strings.ToUpper(strings.TrimSpace(f))
			if f == "" {
				continue
			}
			dup := false
			for _, o := range out {
				dup = dup || o == f
			}
			if !dup {
				out = append(out, f)
			}
		}
	}
	return out
}

func invalidEntry(list string, i int, entry string, err error) error {
	return errdefs.New(errdefs.ErrInvalid, "%s[%d]: %q: %v", list, i, entry, err)
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
