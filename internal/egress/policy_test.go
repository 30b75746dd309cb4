package egress

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in      string
		methods []string
		err     string // substring; "" = valid
	}{
		{in: "example.com"},
		{in: "*.example.com"},
		{in: "Example.COM."},
		{in: "example.com:8443"},
		{in: "*.example.com:443"},
		{in: "_acme.example.com"},
		{in: "localhost"},
		{in: "203.0.113.7"},
		{in: "203.0.113.7:22"},
		{in: "10.0.0.0/8"},
		{in: "10.0.0.0/8:5432"},
		{in: "::1"},
		{in: "2001:db8::/32"},
		{in: "[2001:db8::1]:443"},
		{in: "[2001:db8::/32]:443"},
		{in: "https://api.example.com/v1/"},
		{in: "https://api.example.com/v1/users"},
		{in: "https://api.example.com"},
		{in: "http://api.example.com:8080/x/"},
		{in: "https://*.example.com/v1/"},
		{in: "https://203.0.113.7/v1/"},
		{in: "https://[2001:db8::1]:8443/v1/"},
		{in: "re:https://api.example.com/v1/users/[0-9]+"},
		{in: "https://api.example.com/v1/", methods: []string{"get", "POST"}},
		{in: "https://api.example.com/a%20b/"},

		{in: "", err: "empty rule"},
		{in: "*.", err: "not a domain"},
		{in: "*", err: "not a domain"},
		{in: "a*.example.com", err: "wildcard"},
		{in: "*.*.example.com", err: "wildcard"},
		{in: "exa mple.com", err: "not a domain"},
		{in: "-bad.com", err: "not a domain"},
		{in: "bücher.de", err: "ASCII form"},
		{in: "256.1.1.1", err: "not a domain"},
		{in: "10.1.2.3/8", err: "host bits"},
		{in: "10.0.0.0/33", err: "not an IP"},
		{in: "10.0.0.1:0", err: "not a port"},
		{in: "10.0.0.1:70000", err: "not a port"},
		{in: "example.com:http", err: "not a port"},
		{in: "[::1", err: "missing ]"},
		{in: "ftp://example.com/", err: "scheme"},
		{in: "https://user@example.com/", err: "no user"},
		{in: "https://example.com/a?b=c", err: "query"},
		{in: "https://example.com/v1/../admin/", err: "dot segment"},
		{in: "https://example.com/v1\\x", err: "backslash"},
		{in: "re:https://example.com/(", err: "regex"},
		{in: "re:example.com", err: "URL"},
		{in: "example.com", methods: []string{"GET"}, err: "methods apply only to URL rules"},
		{in: "https://example.com/", methods: []string{"G ET"}, err: "not an HTTP method"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			r, err := ParseRule(tc.in, tc.methods)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("ParseRule(%q): %v", tc.in, err)
				}
				if r.Match != strings.TrimSpace(tc.in) {
					t.Errorf("Match = %q, want it as written", r.Match)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("ParseRule(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

func TestValidateNamesTheEntry(t *testing.T) {
	p := &api.Policy{Allow: []api.PolicyRule{{Match: "a.com"}, {Match: "b.com"}, {Match: "c.com"}, {Match: "*."}}}
	err := ValidatePolicy(p)
	if err == nil || err.Error() != `allow[3]: "*.": not a domain` || !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Validate = %v", err)
	}
	for _, tc := range []struct {
		p    api.Policy
		want string
	}{
		{api.Policy{Deny: []api.PolicyRule{{Match: "10.0.0.0/33"}}}, `deny[0]: "10.0.0.0/33"`},
		{api.Policy{Presets: []string{"internet", "cargo"}}, `presets[1]: "cargo": no such preset`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Inject: api.SecretInjection{Header: "Authorization"}}}}, `secrets[0]: "T": a binding needs hosts`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Header: "X-A", Format: "%s %s"}}}}, `one %s`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Header: "X-A", Format: "a\r\nb: %s"}}}}, `not a valid header value`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Header: "Host"}}}}, `cannot carry`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Query: "a&b"}}}}, `query parameter`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Basic: &api.BasicAuth{User: "a:b"}}}}}, `basic user`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"a.com"}}}}, `exactly one`},
		{api.Policy{Secrets: []api.SecretBinding{
			{Name: "t", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Query: "k"}},
			{Name: "T", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Query: "k"}}}}, `secrets[1]: "T": bound twice`},
		{api.Policy{Secrets: []api.SecretBinding{{Name: "1x", Hosts: []string{"a.com"}, Inject: api.SecretInjection{Query: "k"}}}}, `secret names`},
	} {
		err := ValidatePolicy(&tc.p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.p, err, tc.want)
		}
	}
}

func TestPolicyJSON(t *testing.T) {
	in := `{
	  "allow": [{"match": "api.example.com"}, {"match": "https://api.example.com/v1/", "methods": ["GET"]}, "10.0.0.0/8:5432"],
	  "deny": [{"match": "https://api.example.com/v1/admin/"}],
	  "presets": ["internet", "pypi"],
	  "secrets": [{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"], "paths": ["/repos/"], "methods": ["GET"],
	               "inject": {"header": "Authorization", "format": "Bearer %s"}}]
	}`
	var p api.Policy
	if err := json.Unmarshal([]byte(in), &p); err != nil {
		t.Fatal(err)
	}
	if err := ValidatePolicy(&p); err != nil {
		t.Fatal(err)
	}
	if p.Allow[2].Match != "10.0.0.0/8:5432" || p.Allow[1].Methods[0] != "GET" || p.Secrets[0].Inject.Format != "Bearer %s" {
		t.Fatalf("decoded %+v", p)
	}
	b, err := json.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"allow":[{"match":"api.example.com"},{"match":"https://api.example.com/v1/","methods":["GET"]},{"match":"10.0.0.0/8:5432"}],` +
		`"deny":[{"match":"https://api.example.com/v1/admin/"}],"presets":["internet","pypi"],` +
		`"secrets":[{"name":"GITHUB_TOKEN","hosts":["api.github.com"],"paths":["/repos/"],"methods":["GET"],"inject":{"header":"Authorization","format":"Bearer %s"}}]}`
	if string(b) != want {
		t.Fatalf("JSON:\n got %s\nwant %s", b, want)
	}
	var back api.Policy
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(&back, &p) {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	if err := json.Unmarshal([]byte(`{"allow":[{"match":"a.com","method":["GET"]}]}`), &p); err == nil {
		t.Fatal("an unknown rule field was accepted")
	}
}

func TestParseInjection(t *testing.T) {
	for in, want := range map[string]api.SecretInjection{
		"Authorization: Bearer %s": {Header: "Authorization", Format: "Bearer %s"},
		"X-Api-Key: %s":            {Header: "X-Api-Key", Format: "%s"},
		"basic:bot":                {Basic: &api.BasicAuth{User: "bot"}},
		"query:api_key":            {Query: "api_key"},
	} {
		got, err := ParseInjection(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseInjection(%q) = %+v, %v", in, got, err)
		}
	}
	for _, in := range []string{"Authorization", "Bad Header: %s", "X: %s%s", "query:", "basic:a:b"} {
		if _, err := ParseInjection(in); err == nil {
			t.Errorf("ParseInjection(%q) accepted", in)
		}
	}
}

func TestPublicAddr(t *testing.T) {
	for s, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700::1111": true, "::ffff:8.8.8.8": true,
		"64:ff9b::808:808": true, "2002:808:808::1": true,
		"10.1.2.3": false, "172.16.0.1": false, "172.31.255.255": false, "192.168.1.1": false,
		"100.64.0.1": false, "100.127.255.255": false, "127.0.0.1": false, "127.9.9.9": false,
		"169.254.169.254": false, "169.254.1.1": false, "0.0.0.0": false, "224.0.0.1": false,
		"255.255.255.255": false, "192.0.2.1": false, "198.18.0.1": false, "240.0.0.1": false,
		"::": false, "::1": false, "fc00::1": false, "fd12:3456::1": false, "fe80::1": false,
		"ff02::1": false, "::ffff:127.0.0.1": false, "::ffff:169.254.169.254": false,
		"64:ff9b::a9fe:a9fe": false, "2002:7f00:1::": false, "2001:db8::1": false,
	} {
		if got := PublicAddr(netip.MustParseAddr(s)); got != want {
			t.Errorf("PublicAddr(%s) = %v, want %v", s, got, want)
		}
	}
	if PublicAddr(netip.Addr{}) {
		t.Error("the zero Addr is public")
	}
}

func TestTargetsNonPublic(t *testing.T) {
	for s, want := range map[string]bool{
		"10.0.0.0/8": true, "10.1.2.3/32": true, "127.0.0.1/32": true, "169.254.169.254/32": true,
		"100.64.0.0/10": true, "fc00::/7": true, "fd00::1/128": true,
		"0.0.0.0/0": false, "::/0": false, "8.0.0.0/8": false, "0.0.0.0/1": false, "100.0.0.0/8": false,
	} {
		if got := targetsNonPublic(netip.MustParsePrefix(s)); got != want {
			t.Errorf("targetsNonPublic(%s) = %v, want %v", s, got, want)
		}
	}
}

func mustRules(t *testing.T, ss ...string) []api.PolicyRule {
	t.Helper()
	var rs []api.PolicyRule
	for _, s := range ss {
		match, methods, _ := strings.Cut(s, " --method ")
		r, err := ParseRule(match, strings.Split(methods, ","))
		if methods == "" {
			r, err = ParseRule(match, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}

var pub = netip.MustParseAddr("8.8.8.8")

func TestDecide(t *testing.T) {
	eng := NewEngine(EngineConfig{})
	set := func(p *api.Policy) {
		t.Helper()
		if err := eng.Set("s", p); err != nil {
			t.Fatal(err)
		}
	}
	tlsTo := func(host string, port uint16) DecideArgs {
		return DecideArgs{Sandbox: "s", Kind: KindTLS, Host: host, IP: pub, Port: port}
	}
	tcpTo := func(ip string, port uint16) DecideArgs {
		return DecideArgs{Sandbox: "s", Kind: KindTCP, IP: netip.MustParseAddr(ip), Port: port}
	}
	req := func(scheme, host string, port uint16, method, path string) DecideArgs {
		return DecideArgs{Sandbox: "s", Kind: KindHTTP, TLS: scheme == "https", Host: host, IP: pub, Port: port, Method: method, Path: path}
	}
	type check struct {
		name      string
		args      DecideArgs
		allow     bool
		rule      string
		intercept bool
		suggest   string
	}
	for _, tc := range []struct {
		name   string
		policy api.Policy
		checks []check
	}{
		{"exact domain", api.Policy{Allow: mustRules(t, "example.com")}, []check{
			{name: "tls", args: tlsTo("example.com", 443), allow: true, rule: "example.com"},
			{name: "any port", args: tlsTo("example.com", 8443), allow: true, rule: "example.com"},
			{name: "case and dot", args: tlsTo("EXAMPLE.com.", 443), allow: true},
			{name: "http", args: req("http", "example.com", 80, "GET", "/"), allow: true},
			{name: "subdomain", args: tlsTo("a.example.com", 443), suggest: "--allow a.example.com"},
			{name: "suffix trick", args: tlsTo("badexample.com", 443), suggest: "--allow badexample.com"},
			{name: "raw tcp to any address", args: tcpTo("8.8.8.8", 443), suggest: "--allow 8.8.8.8:443"},
		}},
		{"wildcard", api.Policy{Allow: mustRules(t, "*.example.com")}, []check{
			{name: "one level", args: tlsTo("a.example.com", 443), allow: true, rule: "*.example.com"},
			{name: "two levels", args: tlsTo("a.b.example.com", 443), allow: true},
			{name: "apex", args: tlsTo("example.com", 443), suggest: "--allow example.com"},
			{name: "suffix trick", args: tlsTo("aexample.com", 443)},
			{name: "http", args: req("http", "x.example.com", 80, "GET", "/"), allow: true},
		}},
		{"domain with port", api.Policy{Allow: mustRules(t, "example.com:8443")}, []check{
			{name: "that port", args: tlsTo("example.com", 8443), allow: true},
			{name: "another port", args: tlsTo("example.com", 443)},
		}},
		{"ip and cidr", api.Policy{Allow: mustRules(t, "8.8.8.8", "1.1.1.0/24:53", "10.0.0.5:5432", "[2606:4700::1111]:443")}, []check{
			{name: "ip any port", args: tcpTo("8.8.8.8", 22), allow: true, rule: "8.8.8.8"},
			{name: "cidr port", args: tcpTo("1.1.1.9", 53), allow: true, rule: "1.1.1.0/24:53"},
			{name: "cidr other port", args: tcpTo("1.1.1.9", 54), suggest: "--allow 1.1.1.9:54"},
			{name: "outside cidr", args: tcpTo("1.1.2.1", 53)},
			{name: "private named", args: tcpTo("10.0.0.5", 5432), allow: true},
			{name: "private other", args: tcpTo("10.0.0.6", 5432), suggest: "--allow 10.0.0.6:5432"},
			{name: "v6", args: tcpTo("2606:4700::1111", 443), allow: true},
			{name: "v6 other port", args: tcpTo("2606:4700::1111", 80), suggest: "--allow [2606:4700::1111]:80"},
			{name: "v4-mapped", args: tcpTo("::ffff:8.8.8.8", 22), allow: true},
			{name: "tls without sni by ip", args: DecideArgs{Sandbox: "s", Kind: KindTLS, IP: pub, Port: 443}, allow: true},
			{name: "tls sni not allowed", args: tlsTo("example.com", 443), suggest: "--allow example.com"},
			{name: "http host is ip", args: req("http", "8.8.8.8", 80, "GET", "/"), allow: true},
		}},
		{"broad cidr does not open private space", api.Policy{Allow: mustRules(t, "0.0.0.0/0", "::/0")}, []check{
			{name: "public", args: tcpTo("8.8.8.8", 22), allow: true},
			{name: "private", args: tcpTo("10.0.0.1", 22)},
			{name: "metadata", args: tcpTo("169.254.169.254", 80)},
			{name: "loopback v6", args: tcpTo("::1", 80)},
		}},
		{"http rules", api.Policy{Allow: mustRules(t, "https://api.example.com/v1/", "https://api.example.com/exact", "re:https://api.example.com/items/[0-9]+", "https://api.example.com/ro/ --method GET,HEAD", "http://plain.example.com/")}, []check{
			{name: "tls needs interception", args: tlsTo("api.example.com", 443), allow: true, intercept: true},
			{name: "tls other port", args: tlsTo("api.example.com", 8443), suggest: "--allow api.example.com"},
			{name: "prefix", args: req("https", "api.example.com", 443, "POST", "/v1/users"), allow: true, rule: "https://api.example.com/v1/"},
			{name: "prefix needs the slash", args: req("https", "api.example.com", 443, "GET", "/v1"), suggest: "--allow https://api.example.com/v1 --method GET"},
			{name: "exact", args: req("https", "api.example.com", 443, "GET", "/exact"), allow: true},
			{name: "exact is exact", args: req("https", "api.example.com", 443, "GET", "/exact/more"), suggest: "--allow https://api.example.com/exact/more --method GET"},
			{name: "regex", args: req("https", "api.example.com", 443, "GET", "/items/42"), allow: true},
			{name: "regex anchored", args: req("https", "api.example.com", 443, "GET", "/items/42/x")},
			{name: "method allowed", args: req("https", "api.example.com", 443, "HEAD", "/ro/x"), allow: true},
			{name: "method denied", args: req("https", "api.example.com", 443, "DELETE", "/ro/x"), suggest: "--allow https://api.example.com/ro/x --method DELETE"},
			{name: "scheme", args: req("http", "api.example.com", 443, "GET", "/v1/x")},
			{name: "dot segments", args: req("https", "api.example.com", 443, "GET", "/v1/../admin")},
			{name: "encoded dot segments", args: req("https", "api.example.com", 443, "GET", "/v1/..;/admin")},
			{name: "double slash cleaned", args: req("https", "api.example.com", 443, "GET", "//v1//x"), allow: true},
			{name: "plain http whole host", args: req("http", "plain.example.com", 80, "GET", "/x"), allow: true},
			{name: "other host", args: req("https", "other.example.com", 443, "GET", "/"), suggest: "--allow other.example.com"},
		}},
		{"deny wins", api.Policy{
			Allow:   mustRules(t, "*.example.com", "8.8.0.0/16", "https://api.example.com/"),
			Deny:    mustRules(t, "evil.example.com", "8.8.8.8:53", "https://api.example.com/admin/", "https://ro.example.com/ --method POST"),
			Presets: []string{"internet"}}, []check{
			{name: "denied name", args: tlsTo("evil.example.com", 443), rule: "evil.example.com"},
			{name: "denied name http", args: req("http", "evil.example.com", 80, "GET", "/"), rule: "evil.example.com"},
			{name: "denied ip port", args: tcpTo("8.8.8.8", 53), rule: "8.8.8.8:53"},
			{name: "ip other port", args: tcpTo("8.8.8.8", 54), allow: true},
			{name: "path deny needs interception", args: tlsTo("api.example.com", 443), allow: true, intercept: true},
			{name: "path denied", args: req("https", "api.example.com", 443, "GET", "/admin/users"), rule: "https://api.example.com/admin/"},
			{name: "path denied after cleaning", args: req("https", "api.example.com", 443, "GET", "//admin//users"), rule: "https://api.example.com/admin/"},
			{name: "path allowed", args: req("https", "api.example.com", 443, "GET", "/v1/users"), allow: true},
			{name: "method denied", args: req("https", "ro.example.com", 443, "POST", "/x"), rule: "https://ro.example.com/ --method POST"},
			{name: "method allowed", args: req("https", "ro.example.com", 443, "GET", "/x"), allow: true},
		}},
		{"internet", api.Policy{Presets: []string{"internet"}}, []check{
			{name: "public ip", args: tcpTo("8.8.8.8", 22), allow: true, rule: "preset:internet"},
			{name: "any name", args: tlsTo("anything.example", 443), allow: true},
			{name: "10/8", args: tcpTo("10.1.2.3", 80)},
			{name: "127/8", args: tcpTo("127.0.0.1", 80)},
			{name: "metadata", args: tcpTo("169.254.169.254", 80)},
			{name: "cgnat", args: tcpTo("100.64.1.1", 80)},
			{name: "v6 loopback", args: tcpTo("::1", 80)},
			{name: "ula", args: tcpTo("fc00::1", 80)},
			{name: "ula fd", args: tcpTo("fd00::1", 80)},
			{name: "http host private ip", args: req("http", "10.0.0.1", 80, "GET", "/")},
		}},
		{"registry presets", api.Policy{Presets: []string{"pypi", "github", "golang"}}, []check{
			{name: "pypi", args: tlsTo("files.pythonhosted.org", 443), allow: true, rule: "preset:pypi"},
			{name: "github api", args: tlsTo("api.github.com", 443), allow: true, rule: "preset:github"},
			{name: "github raw", args: tlsTo("raw.githubusercontent.com", 443), allow: true},
			{name: "golang", args: tlsTo("proxy.golang.org", 443), allow: true},
			{name: "npm not listed", args: tlsTo("registry.npmjs.org", 443)},
			{name: "no ip", args: tcpTo("8.8.8.8", 443)},
		}},
		{"secrets force interception", api.Policy{Allow: mustRules(t, "api.example.com"), Secrets: []api.SecretBinding{{Name: "T", Hosts: []string{"api.example.com"}, Inject: api.SecretInjection{Header: "Authorization", Format: "Bearer %s"}}}}, []check{
			{name: "bound host", args: tlsTo("api.example.com", 443), allow: true, intercept: true},
		}},
		{"empty", api.Policy{}, []check{
			{name: "nothing", args: tlsTo("example.com", 443), suggest: "--allow example.com"},
			{name: "nothing tcp", args: tcpTo("8.8.8.8", 443), suggest: "--allow 8.8.8.8:443"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set(&tc.policy)
			for _, c := range tc.checks {
				d := eng.Decide(c.args)
				if d.Allow != c.allow || (c.rule != "" && d.Rule != c.rule) || d.Intercept != c.intercept || (c.suggest != "" && d.Suggest != c.suggest) {
					t.Errorf("%s: %+v", c.name, d)
				}
				if d.Reason == "" {
					t.Errorf("%s: no reason", c.name)
				}
				if !d.Allow && d.Rule == "" && d.Suggest == "" && !strings.Contains(d.Reason, "path") {
					t.Errorf("%s: a default denial without a suggestion: %+v", c.name, d)
				}
			}
		})
	}
	if d := eng.Decide(DecideArgs{Sandbox: "unknown", Kind: KindTLS, Host: "example.com"}); d.Allow {
		t.Error("a sandbox without a policy was allowed")
	}
}

func TestDecideNameAndCheckAddr(t *testing.T) {
	eng := NewEngine(EngineConfig{})
	err := eng.Set("s", &api.Policy{
		Allow: mustRules(t, "*.example.com", "https://api.other.com/v1/", "10.0.0.5:5432", "https://10.0.0.9/x/"),
		Deny:  mustRules(t, "bad.example.com", "ssh.example.com:22", "8.8.4.4"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"a.example.com": true, "example.com": false, "api.other.com": true, "other.com": false,
		"bad.example.com": false, "ssh.example.com": true, "evil.com": false,
	} {
		if d := eng.DecideName("s", name); d.Allow != want {
			t.Errorf("DecideName(%s) = %+v", name, d)
		}
	}
	for _, tc := range []struct {
		addr string
		port uint16
		want bool
	}{
		{"8.8.8.8", 443, true}, {"8.8.4.4", 443, false}, {"127.0.0.1", 443, false},
		{"169.254.169.254", 80, false}, {"10.0.0.5", 5432, true}, {"10.0.0.5", 22, false},
		{"10.0.0.5", 0, true}, {"10.0.0.9", 443, true}, {"10.0.0.9", 80, false}, {"::ffff:127.0.0.1", 80, false},
	} {
		if d := eng.CheckAddr("s", netip.MustParseAddr(tc.addr), tc.port); d.Allow != tc.want {
			t.Errorf("CheckAddr(%s, %d) = %+v", tc.addr, tc.port, d)
		}
	}
	d := eng.CheckAddr("s", netip.MustParseAddr("169.254.169.254"), 80)
	if !strings.Contains(d.Reason, "metadata") || !strings.Contains(d.Reason, "rebinding") {
		t.Errorf("reason %q", d.Reason)
	}
}

func TestEngineSwap(t *testing.T) {
	eng := NewEngine(EngineConfig{})
	var changed []string
	eng.watch(func(id string) { changed = append(changed, id) })
	args := DecideArgs{Sandbox: "s", Kind: KindTLS, Host: "a.com", Port: 443}
	if err := eng.Set("s", &api.Policy{Allow: mustRules(t, "a.com")}); err != nil {
		t.Fatal(err)
	}
	if !eng.Decide(args).Allow {
		t.Fatal("not allowed")
	}
	if err := eng.Set("s", &api.Policy{Allow: []api.PolicyRule{{Match: "*."}}}); err == nil {
		t.Fatal("a bad policy was set")
	}
	if !eng.Decide(args).Allow {
		t.Fatal("a failed Set changed the policy")
	}
	if err := eng.Set("s", &api.Policy{Allow: mustRules(t, "b.com")}); err != nil {
		t.Fatal(err)
	}
	if eng.Decide(args).Allow {
		t.Fatal("the old policy still applies")
	}
	p, _ := eng.Policy("s")
	p.Allow[0].Match = "a.com" // a copy: changing it changes nothing
	if eng.Decide(args).Allow {
		t.Fatal("Policy returned the engine's own copy")
	}
	eng.Remove("s")
	if _, ok := eng.Policy("s"); ok || eng.Decide(args).Allow {
		t.Fatal("removed sandbox still has a policy")
	}
	if strings.Join(changed, ",") != "s,s,s" {
		t.Errorf("change hooks: %v", changed)
	}
}
