package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// E2B's network settings, mapped onto paddock's policy. E2B allows every
// destination unless told otherwise; an allowOut entry (an address, a
// block, or a domain matched by Host or SNI) wins over a denyOut one;
// allow_internet_access: false is denyOut 0.0.0.0/0. paddock allows
// nothing unless told, so the mapping is a policy with precedence
// "allow" (its allow rules win over its deny rules, as E2B's) and:
//   - internet off (allow_internet_access false, or denyOut covering
//     0.0.0.0/0): allow rules from allowOut, nothing else;
//   - internet on: the "internet" preset (public addresses, below the
//     deny rules), allowOut, and denyOut as deny rules.
//
// Whether the internet is on when a create says nothing is the daemon's
// choice (--e2b-default-egress): paddock's default is off.

// Egress defaults for Config.DefaultEgress.
const (
	EgressNone     = "none"
	EgressInternet = "internet"
)

// Labels that keep a sandbox's E2B network settings that paddock's
// policy has no field for.
const (
	labelInternet    = "e2b.internet"  // "true" or "false" when a create said
	labelPrivate     = "e2b.private"   // "1": the port ingress needs the traffic token
	labelMaskHost    = "e2b.mask-host" // maskRequestHost
	presetInternet   = "internet"
	maxNetworkRules  = 256
	maxHeaderRules   = 64
	secretNamePrefix = "e2b_"
)

// networkConfig is E2B's network field of a create, and the body of PUT
// /sandboxes/{id}/network (with allow_internet_access).
type networkConfig struct {
	AllowOut           []string                 `json:"allowOut"`
	DenyOut            []string                 `json:"denyOut"`
	Rules              map[string][]networkRule `json:"rules"`
	AllowPublicTraffic *bool                    `json:"allowPublicTraffic"`
	MaskRequestHost    *string                  `json:"maskRequestHost"`
	// AllowInternetAccess is the update's own field; a create has it
	// beside network.
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

type networkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

var (
	domainPattern     = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	headerNamePattern = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
)

// isAddress reports whether s is an IP or a CIDR block.
func isAddress(s string) bool {
	if net.ParseIP(s) != nil {
		return true
	}
	_, _, err := net.ParseCIDR(s)
	return err == nil
}

// coversAll reports whether a denyOut entry is the whole IPv4 space.
func coversAll(s string) bool {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		return false
	}
	ones, bits := n.Mask.Size()
	return ones == 0 && bits == 32
}

// policy is the paddock policy for an E2B network configuration;
// internet is allow_internet_access (nil: the daemon's default).
func (s *Server) policy(nc networkConfig, internet *bool) (*api.Policy, error) {
	if len(nc.AllowOut)+len(nc.DenyOut) > maxNetworkRules {
		return nil, errdefs.Invalid("network", "more than %d allowOut and denyOut entries", maxNetworkRules)
	}
	if nc.MaskRequestHost != nil && (len(*nc.MaskRequestHost) > 253 || strings.ContainsAny(*nc.MaskRequestHost, "\r\n\x00 /")) {
		return nil, errdefs.Invalid("network.maskRequestHost", "%q is not a host name", *nc.MaskRequestHost)
	}
	on := s.defaultEgress == EgressInternet
	if internet != nil {
		on = *internet
	}
	p := &api.Policy{Precedence: api.PolicyPrecedenceAllow}
	for _, e := range nc.DenyOut {
		if !isAddress(e) {
			return nil, errdefs.Invalid("network.denyOut", "%q is not an IP address or CIDR block (E2B denies by address only)", e)
		}
		if coversAll(e) {
			on = false
		}
	}
	for _, e := range nc.AllowOut {
		e = strings.ToLower(strings.TrimSuffix(e, "."))
		if !isAddress(e) && !domainPattern.MatchString(e) {
			return nil, errdefs.Invalid("network.allowOut", "%q is not an IP address, a CIDR block, a domain or *.domain", e)
		}
		p.Allow = append(p.Allow, api.PolicyRule{Match: e})
	}
	if on {
		p.Presets = []string{presetInternet}
		for _, e := range nc.DenyOut {
			if !coversAll(e) {
				p.Deny = append(p.Deny, api.PolicyRule{Match: e})
			}
		}
	}
	bindings, err := s.headerSecrets(nc.Rules)
	if err != nil {
		return nil, err
	}
	p.Secrets = bindings
	return p, nil
}

// headerSecrets maps E2B's rules[host].transform.headers onto paddock's
// secret injection: each value is stored as a secret (named by a keyed
// hash of host, header and value, so the same one is stored once) and
// bound to the host, so that the egress proxy sets the header on the
// sandbox's HTTPS requests there and the sandbox never holds the value.
func (s *Server) headerSecrets(rules map[string][]networkRule) (_ []api.SecretBinding, err error) {
	if len(rules) == 0 {
		return nil, nil
	}
	hosts := make([]string, 0, len(rules))
	for h := range rules {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	var out []api.SecretBinding
	defer func() {
		if err != nil {
			s.releaseSecrets(&api.Policy{Secrets: out})
		}
	}()
	for _, raw := range hosts {
		host := strings.ToLower(raw)
		if host == "*" || !domainPattern.MatchString(host) {
			return nil, errdefs.Invalid("network.rules", "%q is not a domain or *.domain", raw)
		}
		for _, rule := range rules[raw] {
			if rule.Transform == nil {
				continue
			}
			for name, value := range rule.Transform.Headers {
				if !headerNamePattern.MatchString(name) {
					return nil, errdefs.Invalid("network.rules", "%q is not an HTTP header name", name)
				}
				if value == "" || strings.ContainsAny(value, "\r\n\x00") {
					return nil, errdefs.Invalid("network.rules", "the value of header %s for %s is empty or holds CR, LF or NUL", name, raw)
				}
				if len(out) == maxHeaderRules {
					return nil, errdefs.Invalid("network.rules", "more than %d header transforms", maxHeaderRules)
				}
				if s.secrets == nil {
					return nil, errdefs.New(errdefs.ErrUnavailable, "network.rules: this daemon has no secret store for header transforms")
				}
				secret := s.secretName(host, name, value)
				// Held before it is stored, so that a sweep cannot
				// delete it before the policy naming it is recorded.
				s.holdSecret(secret)
				out = append(out, api.SecretBinding{Name: secret, Hosts: []string{host}, Inject: api.SecretInjection{Header: name, Format: "%s"}})
				if err := s.secrets.Create(secret, []byte(value)); err != nil && !errors.Is(err, errdefs.ErrConflict) {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

func (s *Server) secretName(host, header, value string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("e2b header secret\x00" + host + "\x00" + strings.ToLower(header) + "\x00" + value))
	return secretNamePrefix + hex.EncodeToString(m.Sum(nil))[:24]
}

// networkLabels records what paddock's policy does not say.
func networkLabels(labels map[string]string, nc networkConfig, internet *bool) {
	if internet != nil {
		labels[labelInternet] = map[bool]string{true: "true", false: "false"}[*internet]
	}
	if nc.AllowPublicTraffic != nil && !*nc.AllowPublicTraffic {
		labels[labelPrivate] = "1"
	}
	if nc.MaskRequestHost != nil && *nc.MaskRequestHost != "" {
		labels[labelMaskHost] = *nc.MaskRequestHost
	}
}

// trafficToken is the token the port ingress asks of callers of a
// sandbox created with allowPublicTraffic false (E2B's
// e2b-traffic-access-token header).
func (s *Server) trafficToken(id string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("traffic access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))[:32]
}

// updateNetwork is PUT /sandboxes/{id}/network: the whole egress
// configuration is replaced (an omitted field is cleared, as E2B's).
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var nc networkConfig
	if err := decodeBody(w, r, &nc); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	// Omitted, allow_internet_access is cleared: the default applies.
	internet := nc.AllowInternetAccess
	p, err := s.policy(nc, internet)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.releaseSecrets(p)
	if _, err := s.mgr.SetPolicy(r.Context(), id, *p); err != nil {
		s.fail(w, r, err)
		return
	}
	s.sweepSoon() // the secrets of the rules replaced
	w.WriteHeader(http.StatusNoContent)
}
