package network

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestSlots(t *testing.T) {
	s := newSlots(netip.MustParsePrefix("10.1.0.0/26")) // 16 blocks
	if s.n != 16 {
		t.Fatalf("n = %d, want 16", s.n)
	}
	for want := 0; want < 16; want++ {
		got, ok := s.take()
		if !ok || got != want {
			t.Fatalf("take = %d, %v; want %d", got, ok, want)
		}
	}
	if _, ok := s.take(); ok {
		t.Fatal("take succeeded on a full subnet")
	}
	s.free(5)
	s.free(3)
	if got, _ := s.take(); got != 3 {
		t.Fatalf("take after frees = %d, want the lowest, 3", got)
	}
	l := s.link(5)
	want := Link{
		HostAddr:    netip.MustParseAddr("10.1.0.21"),
		SandboxAddr: netip.MustParseAddr("10.1.0.22"),
		Prefix:      netip.MustParsePrefix("10.1.0.20/30"),
	}
	if l != want {
		t.Fatalf("link(5) = %+v, want %+v", l, want)
	}
	for _, a := range []string{"10.1.0.20", "10.1.0.21", "10.1.0.22", "10.1.0.23"} {
		if i, ok := s.index(netip.MustParseAddr(a)); !ok || i != 5 {
			t.Errorf("index(%s) = %d, %v; want 5", a, i, ok)
		}
	}
	for _, a := range []string{"10.1.0.64", "10.0.255.255", "::1"} {
		if _, ok := s.index(netip.MustParseAddr(a)); ok {
			t.Errorf("index(%s) found a block outside the subnet", a)
		}
	}
	l.HostIf = "pd-x"
	if i, err := s.check(l); err != nil || i != 5 {
		t.Errorf("check(block 5) = %d, %v", i, err)
	}
	l.SandboxAddr = netip.MustParseAddr("10.1.0.21")
	if _, err := s.check(l); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("check(swapped addresses) = %v, want ErrInvalid", err)
	}
}

func TestSlotsLargeSubnet(t *testing.T) {
	s := newSlots(netip.MustParsePrefix("10.224.0.0/16"))
	if s.n != 16384 {
		t.Fatalf("n = %d", s.n)
	}
	for i := 0; i < 200; i++ {
		s.take()
	}
	s.free(70)
	if got, _ := s.take(); got != 70 {
		t.Fatalf("take = %d, want 70", got)
	}
	if got := s.link(16383); got.SandboxAddr != netip.MustParseAddr("10.224.255.254") {
		t.Fatalf("last block = %+v", got)
	}
}

func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{ProxyPort: 1, DNSPort: 2}, true},
		{"self", Config{ProxyPort: 1, DNSPort: 2, SelfPort: 3}, true},
		{"no proxy", Config{DNSPort: 2}, false},
		{"no dns", Config{ProxyPort: 1}, false},
		{"same ports", Config{ProxyPort: 1, DNSPort: 1}, false},
		{"self same", Config{ProxyPort: 1, DNSPort: 2, SelfPort: 2}, false},
		{"ipv6", Config{ProxyPort: 1, DNSPort: 2, Subnet: netip.MustParsePrefix("fd00::/64")}, false},
		{"/31", Config{ProxyPort: 1, DNSPort: 2, Subnet: netip.MustParsePrefix("10.0.0.0/31")}, false},
		{"host bits", Config{ProxyPort: 1, DNSPort: 2, Subnet: netip.MustParsePrefix("10.0.0.1/24")}, false},
		{"name dash", Config{ProxyPort: 1, DNSPort: 2, Name: "pd-x"}, false},
		{"name long", Config{ProxyPort: 1, DNSPort: 2, Name: "paddock12"}, false},
		{"name upper", Config{ProxyPort: 1, DNSPort: 2, Name: "PD"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.cfg.withDefaults()
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err == nil && (c.Name != DefaultName || c.Subnet != DefaultSubnet || c.Logger == nil) {
				t.Fatalf("defaults not applied: %+v", c)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestLinkJSON(t *testing.T) {
	l := Link{
		HostIf:      "paddock-1a2b3c4",
		HostAddr:    netip.MustParseAddr("10.224.0.1"),
		SandboxAddr: netip.MustParseAddr("10.224.0.2"),
		Prefix:      netip.MustParsePrefix("10.224.0.0/30"),
	}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	var back Link
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != l {
		t.Fatalf("round trip: %s → %+v", b, back)
	}
	if want := `{"host_if":"paddock-1a2b3c4","host_addr":"10.224.0.1","sandbox_addr":"10.224.0.2","prefix":"10.224.0.0/30"}`; string(b) != want {
		t.Fatalf("json = %s", b)
	}
}
