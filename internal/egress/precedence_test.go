package egress

import (
	"errors"
	"net/http"
	"net/netip"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestPrecedence decides one policy whose allow and deny rules overlap
// under both precedences: deny first (paddock's default) and allow first
// (E2B's allowOut over denyOut). The internet preset is no allow rule: a
// deny rule wins over it either way.
func TestPrecedence(t *testing.T) {
	base := api.Policy{
		Presets: []string{PresetInternet},
		Allow:   mustRules(t, "1.2.3.4", "ok.example.com", "https://api.example.com/v1/", "10.0.0.5"),
		Deny:    mustRules(t, "1.2.3.0/24", "0.0.0.0/0:25", "ok.example.com:22", "https://api.example.com", "10.0.0.0/8"),
	}
	tls := func(host string) DecideArgs {
		return DecideArgs{Sandbox: "s", Kind: KindTLS, Host: host, IP: netip.MustParseAddr("1.2.3.9"), Port: 443}
	}
	for _, tc := range []struct {
		name        string
		args        DecideArgs
		deny, allow bool // the answer with each precedence
	}{
		{"address in a denied block", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("1.2.3.4"), Port: 80}, false, true},
		{"its neighbour", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("1.2.3.5"), Port: 80}, false, false},
		{"allowed address on a denied port", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("1.2.3.4"), Port: 25}, false, true},
		{"internet on a denied port", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("8.8.8.8"), Port: 25}, false, false},
		{"internet elsewhere", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("8.8.8.8"), Port: 80}, true, true},
		{"private named inside a denied network", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("10.0.0.5"), Port: 5432}, false, true},
		{"private not named", DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr("10.0.0.6"), Port: 5432}, false, false},
		{"domain on a denied port", DecideArgs{Sandbox: "s", Kind: KindTLS, Host: "ok.example.com", Port: 22}, false, true},
		{"URL rule under a denied host", DecideArgs{Sandbox: "s", Kind: KindHTTP, TLS: true, Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x"}, false, true},
		{"other path of that host", DecideArgs{Sandbox: "s", Kind: KindHTTP, TLS: true, Host: "api.example.com", Port: 443, Method: "GET", Path: "/v2/x"}, false, false},
		{"that host's TLS", tls("api.example.com"), false, true},
		{"a name only the internet allows", tls("other.example.com"), true, true},
	} {
		for _, prec := range []string{"", api.PolicyPrecedenceDeny, api.PolicyPrecedenceAllow} {
			p := base.Clone()
			p.Precedence = prec
			eng := NewEngine(EngineConfig{})
			if err := eng.Set("s", p); err != nil {
				t.Fatal(err)
			}
			want := tc.deny
			if prec == api.PolicyPrecedenceAllow {
				want = tc.allow
			}
			if d := eng.Decide(tc.args); d.Allow != want || d.Reason == "" {
				t.Errorf("%s, precedence %q: %+v, want allow=%v", tc.name, prec, d, want)
			}
		}
	}
	// The resolver and the proxy's check of resolved addresses.
	p := base.Clone()
	p.Precedence = api.PolicyPrecedenceAllow
	eng := NewEngine(EngineConfig{})
	if err := eng.Set("s", p); err != nil {
		t.Fatal(err)
	}
	c := eng.get("s")
	for _, tc := range []struct {
		addr, host string
		want       bool
	}{
		{"1.2.3.4", "", true},               // an allow rule names it
		{"1.2.3.9", "", false},              // only denied
		{"1.2.3.9", "ok.example.com", true}, // the name is allowed
		{"1.2.3.9", "api.example.com", true},
		{"1.2.3.9", "other.example.com", false}, // only the internet allows the name
		{"10.0.0.9", "ok.example.com", false},   // a name never opens private space
		{"127.0.0.1", "ok.example.com", false},
	} {
		if d := c.checkAddr(netip.MustParseAddr(tc.addr), 443, tc.host, PublicAddr); d.Allow != tc.want {
			t.Errorf("checkAddr(%s, %q) = %+v", tc.addr, tc.host, d)
		}
	}
	if !c.nameMayAllow(netip.MustParseAddr("1.2.3.9"), 443, PublicAddr) || c.nameMayAllow(netip.MustParseAddr("10.0.0.9"), 443, PublicAddr) {
		t.Error("nameMayAllow: a public address in a denied block may still be reached by an allowed name; a private one not")
	}
	got, _ := eng.Policy("s")
	if got.Precedence != api.PolicyPrecedenceAllow {
		t.Errorf("the policy read back lost its precedence: %+v", got)
	}
	if err := eng.Set("s", &api.Policy{Precedence: "allow-first"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad precedence: %v", err)
	}
}

// TestPrecedenceThroughProxy: a deny rule covers the upstream's address;
// with allow first, a name an allow rule names reaches it over TLS (by
// SNI) and plain HTTP (by Host), and any other name does not.
func TestPrecedenceThroughProxy(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, &echoPath{}, "ok.example.com", "other.example.com")
	plain := startHTTP(t, &echoPath{})
	for _, prec := range []string{api.PolicyPrecedenceDeny, api.PolicyPrecedenceAllow} {
		h.setPolicy("sb1", &api.Policy{
			Presets:    []string{PresetInternet},
			Allow:      mustRules(t, "ok.example.com"),
			Deny:       mustRules(t, publicAddr.String()),
			Precedence: prec,
		})
		for _, tc := range []struct {
			url string
			dst netip.AddrPort
			ok  bool
		}{
			{"https://ok.example.com/x", serverAddr(t, srv), prec == api.PolicyPrecedenceAllow},
			{"http://ok.example.com/x", serverAddr(t, plain), prec == api.PolicyPrecedenceAllow},
			{"https://other.example.com/x", serverAddr(t, srv), false},
			{"http://other.example.com/x", serverAddr(t, plain), false},
		} {
			c := h.client("sb1", sb1Addr, tc.dst)
			resp, err := c.Get(tc.url)
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				resp.Body.Close()
			}
			if ok != tc.ok {
				t.Errorf("precedence %s, %s: %v %v, want ok=%v", prec, tc.url, resp, err, tc.ok)
			}
			c.CloseIdleConnections()
		}
	}
}
