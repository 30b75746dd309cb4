package api

import (
	"bytes"
	"encoding/json"
)

// Policy is what a sandbox may reach on the network. Nothing is reachable
// unless an allow rule or a preset allows it; a deny rule wins over every
// allow. The rule syntax is described in openapi.yaml (PolicyRule).
type Policy struct {
	Allow   []PolicyRule    `json:"allow,omitempty"`
	Deny    []PolicyRule    `json:"deny,omitempty"`
	Presets []string        `json:"presets,omitempty"`
	Secrets []SecretBinding `json:"secrets,omitempty"`
	// Mode is what a refusal does: "" (or "deny") refuses; "ask" also
	// files an EgressRequest for the host, for a person to decide.
	Mode string `json:"mode,omitempty"`
	// Precedence is which list wins when an allow rule and a deny rule
	// both match: "" (or "deny") the deny rule; "allow" the allow rule, as
	// E2B's allowOut wins over its denyOut (the E2B facade sets it). The
	// internet preset is never an allow rule here: a deny rule wins over it.
	Precedence string `json:"precedence,omitempty"`
	// Grants are the sandbox's approved requests (set by the daemon).
	Grants []PolicyGrant `json:"grants,omitempty"`
}

// The modes of a Policy.
const (
	PolicyModeDeny = "deny"
	PolicyModeAsk  = "ask"
)

// The precedences of a Policy.
const (
	PolicyPrecedenceDeny  = "deny"
	PolicyPrecedenceAllow = "allow"
)

// Clone returns a deep copy of p (nil for nil).
func (p *Policy) Clone() *Policy {
	if p == nil {
		return nil
	}
	c := &Policy{
		Allow:      cloneRules(p.Allow),
		Deny:       cloneRules(p.Deny),
		Presets:    append([]string(nil), p.Presets...),
		Mode:       p.Mode,
		Precedence: p.Precedence,
	}
	if p.Grants != nil {
		c.Grants = make([]PolicyGrant, len(p.Grants))
		for i, g := range p.Grants {
			if g.Until != nil {
				u := *g.Until
				g.Until = &u
			}
			c.Grants[i] = g
		}
	}
	for _, b := range p.Secrets {
		b.Hosts = append([]string(nil), b.Hosts...)
		b.Paths = append([]string(nil), b.Paths...)
		b.Methods = append([]string(nil), b.Methods...)
		if b.Inject.Basic != nil {
			bb := *b.Inject.Basic
			b.Inject.Basic = &bb
		}
		c.Secrets = append(c.Secrets, b)
	}
	return c
}

func cloneRules(rs []PolicyRule) []PolicyRule {
	if rs == nil {
		return nil
	}
	out := make([]PolicyRule, len(rs))
	for i, r := range rs {
		out[i] = PolicyRule{Match: r.Match, Methods: append([]string(nil), r.Methods...)}
	}
	return out
}

// PolicyRule is one allow or deny entry: a domain, *.domain, an IP or CIDR
// with an optional :PORT, or a URL (https://host/path/ is a path prefix),
// optionally limited to some HTTP methods.
type PolicyRule struct {
	Match   string   `json:"match"`
	Methods []string `json:"methods,omitempty"`
}

// UnmarshalJSON takes the object form or a bare string.
func (r *PolicyRule) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		*r = PolicyRule{}
		return json.Unmarshal(b, &r.Match)
	}
	type plain PolicyRule
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode((*plain)(r))
}

// SecretBinding attaches a stored secret to a sandbox: the sandbox sees a
// placeholder in $PADDOCK_SECRET_<NAME>, and the egress proxy puts the
// real value into requests within the scope (hosts, and optionally paths
// and methods) in the form Inject says.
type SecretBinding struct {
	Name    string          `json:"name"`
	Hosts   []string        `json:"hosts"`
	Paths   []string        `json:"paths,omitempty"`
	Methods []string        `json:"methods,omitempty"`
	Inject  SecretInjection `json:"inject"`
}

// SecretInjection is where a secret goes: exactly one of a header (with a
// format such as "Bearer %s"), basic auth (the secret is the password) or
// a query parameter.
type SecretInjection struct {
	Header string     `json:"header,omitempty"`
	Format string     `json:"format,omitempty"`
	Basic  *BasicAuth `json:"basic,omitempty"`
	Query  string     `json:"query,omitempty"`
}

// BasicAuth names the user of basic-auth injection.
type BasicAuth struct {
	User string `json:"user"`
}

// SecretRequest is the body of POST /v1/secrets.
type SecretRequest struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Secret describes a stored secret; its value is never returned.
type Secret struct {
	Name string `json:"name"`
}

// PolicyPreset is an item of GET /v1/policies (a cluster's gateway): a
// preset a policy may name, built in or a PolicyPreset object, with the
// policy it stands for (a built-in one's hosts as allow rules; internet
// stands for every public address) and, for an object that does not
// compile, why.
type PolicyPreset struct {
	Name    string `json:"name"`
	BuiltIn bool   `json:"built_in,omitempty"`
	Policy  Policy `json:"policy"`
	Error   string `json:"error,omitempty"`
}
