package e2b

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/egress"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestPageStart(t *testing.T) {
	base := time.Unix(1000, 0)
	// Newest first: times 5, 4, 4, 2 (ids break ties).
	type item struct {
		at time.Time
		id string
	}
	desc := []item{{base.Add(5), "a"}, {base.Add(4), "b"}, {base.Add(4), "c"}, {base.Add(2), "d"}}
	key := func(l []item) func(int) (time.Time, string) {
		return func(i int) (time.Time, string) { return l[i].at, l[i].id }
	}
	for _, tc := range []struct {
		tok  string
		want int
	}{
		{"", 0},
		{pageToken(base.Add(4), "c"), 2},
		{pageToken(base.Add(4), "b"), 1},
		{pageToken(base.Add(3), "zz"), 3}, // its item is gone: the next older one
		{pageToken(base.Add(1), "x"), 4},
	} {
		got, err := pageStart(tc.tok, len(desc), key(desc), false)
		if err != nil || got != tc.want {
			t.Errorf("desc pageStart(%q) = %d, %v; want %d", tc.tok, got, err, tc.want)
		}
	}
	asc := []item{{base.Add(2), "d"}, {base.Add(4), "b"}, {base.Add(4), "c"}, {base.Add(5), "a"}}
	if got, _ := pageStart(pageToken(base.Add(3), "q"), len(asc), key(asc), true); got != 1 {
		t.Errorf("asc pageStart past a gone item = %d, want 1", got)
	}
	for _, bad := range []string{"x", "12", "_id", "abc_id", "1_" + strings.Repeat("a", 200)} {
		if _, err := pageStart(bad, 0, key(nil), false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("pageStart(%q): %v, want invalid", bad, err)
		}
	}
}

func TestSnapshotNames(t *testing.T) {
	for in, want := range map[string]bool{
		"my-snap": true, "my-snap:v1": true, "a.b_c": true,
		"": false, "My": false, "a:b:c": false, "a/b": false, "-a": false, "a:": false,
		strings.Repeat("a", 64): false,
	} {
		if _, _, ok := parseSnapshotName(in); ok != want {
			t.Errorf("parseSnapshotName(%q) ok = %v, want %v", in, ok, want)
		}
	}
}

// TestNetworkPolicy maps E2B's network settings and refuses bad ones
// naming the field.
func TestNetworkPolicy(t *testing.T) {
	s := &Server{secret: make([]byte, 32)}
	off, on := false, true
	p, err := s.policy(networkConfig{AllowOut: []string{"Example.COM.", "10.0.0.0/8"}, DenyOut: []string{"0.0.0.0/0"}}, nil)
	if err != nil || len(p.Presets) != 0 || len(p.Deny) != 0 || len(p.Allow) != 2 || p.Allow[0].Match != "example.com" {
		t.Fatalf("deny-all + allow: %+v %v", p, err)
	}
	p, err = s.policy(networkConfig{DenyOut: []string{"8.8.8.8", "1.2.3.0/24"}, AllowOut: []string{"1.2.3.4", "example.test"}}, &on)
	if err != nil || len(p.Presets) != 1 || len(p.Deny) != 2 || len(p.Allow) != 2 {
		t.Fatalf("internet minus addresses: %+v %v", p, err)
	}
	// E2B's allowOut wins over its denyOut: the policy says so, and the
	// egress engine decides by it (1.2.3.4 and example.test pass, the
	// rest of 1.2.3.0/24 does not).
	if p.Precedence != api.PolicyPrecedenceAllow {
		t.Fatalf("precedence %q", p.Precedence)
	}
	eng := egress.NewEngine(egress.EngineConfig{})
	if err := eng.Set("s", p); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args egress.DecideArgs
		want bool
	}{
		{egress.DecideArgs{Sandbox: "s", Kind: egress.KindTCP, IP: netip.MustParseAddr("1.2.3.4"), Port: 443}, true},
		{egress.DecideArgs{Sandbox: "s", Kind: egress.KindTCP, IP: netip.MustParseAddr("1.2.3.5"), Port: 443}, false},
		{egress.DecideArgs{Sandbox: "s", Kind: egress.KindTCP, IP: netip.MustParseAddr("8.8.8.8"), Port: 53}, false},
		{egress.DecideArgs{Sandbox: "s", Kind: egress.KindTCP, IP: netip.MustParseAddr("9.9.9.9"), Port: 53}, true},
		{egress.DecideArgs{Sandbox: "s", Kind: egress.KindHTTP, Host: "example.test", IP: netip.MustParseAddr("1.2.3.5"), Port: 80, Method: "GET", Path: "/"}, true},
	} {
		if d := eng.Decide(tc.args); d.Allow != tc.want {
			t.Errorf("%+v: %+v", tc.args, d)
		}
	}
	if p, _ = s.policy(networkConfig{}, &off); len(p.Presets) != 0 {
		t.Fatalf("allow_internet_access false: %+v", p)
	}
	if p, _ = s.policy(networkConfig{}, nil); len(p.Presets) != 0 {
		t.Fatalf("paddock's default is no internet: %+v", p)
	}
	s.defaultEgress = EgressInternet
	if p, _ = s.policy(networkConfig{}, nil); len(p.Presets) != 1 {
		t.Fatalf("--e2b-default-egress internet: %+v", p)
	}
	mask := "a b"
	for field, nc := range map[string]networkConfig{
		"network.denyOut":         {DenyOut: []string{"example.com"}},
		"network.allowOut":        {AllowOut: []string{"http://x"}},
		"network.rules":           {Rules: map[string][]networkRule{"*": nil}},
		"network.maskRequestHost": {MaskRequestHost: &mask},
	} {
		if _, err := s.policy(nc, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	// Header transforms without a secret store are refused, not dropped.
	rules := map[string][]networkRule{"api.example.com": {{}}}
	rules["api.example.com"][0].Transform = &struct {
		Headers map[string]string `json:"headers"`
	}{Headers: map[string]string{"Authorization": "Bearer x"}}
	if _, err := s.policy(networkConfig{Rules: rules}, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("transforms without a secret store: %v", err)
	}
}

func TestHostTarget(t *testing.T) {
	s := &Server{domain: "e2b.test"}
	for host, want := range map[string]string{
		"8000-abc123.e2b.test":       "8000 abc123",
		"49983-abc123.E2B.test:3000": "49983 abc123",
		"08000-abc123.e2b.test":      "",
		"70000-abc123.e2b.test":      "",
		"8000-abc123.other.test":     "",
		"abc123.e2b.test":            "",
		"127.0.0.1:3000":             "",
		"8000-.e2b.test":             "",
	} {
		port, id, ok := s.hostTarget(host)
		got := ""
		if ok {
			got = strconv.Itoa(port) + " " + id
		}
		if got != want {
			t.Errorf("hostTarget(%q) = %q, want %q", host, got, want)
		}
	}
}
