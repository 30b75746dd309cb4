// Package network owns the wiring between a sandbox's network namespace and
// the host: one veth pair per sandbox, its /30 of the sandboxes' subnet, and
// the nftables table that lets a sandbox reach nothing but paddock's own
// egress proxy, DNS resolver and "self" endpoint on the host.
//
// The table is static: it matches the sandboxes' host-side interfaces by
// name prefix ("<Name>-*"), so attaching or detaching a sandbox never
// touches it. Attach runs when a warm guest is built, off the create path;
// Detach only forgets the sandbox and hands its interface to a background
// worker, which frees the address once the kernel has deleted the veth
// pair with the sandbox's network namespace (or deletes it itself, if it
// stays). A create or a removal therefore costs the network nothing.
//
// What a sandbox's packets meet on the host (see rules_linux.go for every
// rule and why):
//
//   - all TCP, to any address, is redirected to the egress proxy on the
//     sandbox's own host-side address (so the proxy sees every connection
//     and reads the original destination with SO_ORIGINAL_DST); TCP to the
//     host-side address on port 80 goes to the self endpoint instead;
//   - DNS (UDP or TCP port 53, to any server) is redirected to the resolver;
//   - everything else it sends is rejected, IPv6 is dropped, and packets
//     whose source is not the sandbox's own address are dropped, so the
//     address a connection comes from names its sandbox (Lookup).
package network

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Config is the network of every sandbox of one daemon.
type Config struct {
	// Subnet holds the sandboxes' addresses: each sandbox gets a /30 of it
	// (host side .1, sandbox side .2). IPv4, /8 to /30. It must not overlap
	// a route the host already has. Default 10.224.0.0/16 (16384 sandboxes).
	Subnet netip.Prefix
	// ProxyPort is the TCP port on which the egress proxy listens on the
	// host. Every TCP connection a sandbox opens, to any destination, is
	// redirected there. Required.
	ProxyPort uint16
	// DNSPort is the UDP and TCP port of paddock's resolver on the host.
	// Sandbox DNS to any server is redirected there. Required.
	DNSPort uint16
	// SelfPort is the TCP port of the daemon's per-sandbox "self" endpoint.
	// A sandbox's TCP to its host-side address on port 80 (what
	// paddock.internal resolves to) is redirected there. 0: no self
	// endpoint; such connections go to the proxy like any other.
	SelfPort uint16
	// Name prefixes the host-side interface names ("<Name>-<hash>") and
	// names the nftables table (inet <Name>). Lower-case letters and digits,
	// at most 8, so that names never collide and the interface names fit
	// in 15 characters. Default "paddock". Tests use unique ones.
	Name string
	// MaxConns bounds the TCP connections one sandbox may have open (to
	// the proxy, the resolver and the self endpoint; closed ones do not
	// count); beyond it a new one is refused. It keeps one sandbox from
	// filling the host's conntrack table. Default 4096.
	MaxConns int
	// MaxDNSRate bounds the UDP DNS packets per second one sandbox may
	// send; beyond it they are dropped before conntrack records them. It
	// is well above the resolver's own rate limit, which answers REFUSED:
	// it only stops floods. Default 1000.
	MaxDNSRate int
	// Slots is how many network slots (network namespaces wired ahead
	// of time, slot_linux.go) the Manager keeps ready. 0: none is made
	// ahead; TakeSlot makes one when asked, and recycled ones are kept.
	Slots int
	// MaxSlots bounds the ready slots: a recycled slot beyond it is
	// destroyed. Default 64, and at least Slots.
	MaxSlots int
	// Logger receives the background worker's reports. Default: discard.
	Logger *slog.Logger
}

// DefaultSubnet is the sandboxes' subnet when Config.Subnet is unset.
var DefaultSubnet = netip.MustParsePrefix("10.224.0.0/16")

// DefaultName is the interface prefix and table name when Config.Name is unset.
const DefaultName = "paddock"

// SandboxIf is the name of the sandbox's side of its veth pair.
const SandboxIf = "eth0"

// Link is one sandbox's wiring. It is plain data, so the runtime can persist
// it and hand it back to Restore after a daemon restart.
type Link struct {
	// HostIf is the host-side interface, "<Name>-<hash of id>".
	HostIf string `json:"host_if"`
	// HostAddr is the host side of the /30: the sandbox's gateway, DNS
	// server and paddock.internal.
	HostAddr netip.Addr `json:"host_addr"`
	// SandboxAddr is the sandbox's address (on its eth0): the address its
	// connections come from on the host.
	SandboxAddr netip.Addr `json:"sandbox_addr"`
	// Prefix is the sandbox's /30.
	Prefix netip.Prefix `json:"prefix"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// withDefaults validates c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 4096
	}
	if c.MaxDNSRate <= 0 {
		c.MaxDNSRate = 1000
	}
	if c.MaxSlots <= 0 {
		c.MaxSlots = 64
	}
	c.MaxSlots = max(c.MaxSlots, c.Slots)
	if !c.Subnet.Addr().Is4() || c.Subnet.Bits() < 8 || c.Subnet.Bits() > 30 {
		return c, errdefs.Invalid("subnet", "%s is not an IPv4 prefix between /8 and /30", c.Subnet)
	}
	if c.Subnet.Masked() != c.Subnet {
		return c, errdefs.Invalid("subnet", "%s has host bits set", c.Subnet)
	}
	if !nameRE.MatchString(c.Name) {
		return c, errdefs.Invalid("name", "%q must be 1 to 8 lower-case letters or digits", c.Name)
	}
	if c.ProxyPort == 0 {
		return c, errdefs.Invalid("proxy_port", "required")
	}
	if c.DNSPort == 0 {
		return c, errdefs.Invalid("dns_port", "required")
	}
	if c.ProxyPort == c.DNSPort || (c.SelfPort != 0 && (c.SelfPort == c.ProxyPort || c.SelfPort == c.DNSPort)) {
		return c, errdefs.Invalid("ports", "proxy %d, dns %d and self %d must differ", c.ProxyPort, c.DNSPort, c.SelfPort)
	}
	return c, nil
}

// slots hands out the /30 blocks of a subnet, lowest first. A block stays
// taken from Attach (or Restore, or discovery at start-up) until its host
// interface is known to be gone.
type slots struct {
	base uint32   // the subnet's first address
	n    int      // number of /30 blocks
	used []uint64 // bit i: block i is taken
}

func newSlots(p netip.Prefix) *slots {
	n := 1 << (30 - p.Bits())
	return &slots{
		base: addrUint(p.Addr()),
		n:    n,
		used: make([]uint64, (n+63)/64),
	}
}

// take returns the lowest free block and marks it taken.
func (s *slots) take() (int, bool) {
	for w, bits := range s.used {
		if bits == ^uint64(0) {
			continue
		}
		for b := 0; b < 64; b++ {
			i := w*64 + b
			if i >= s.n {
				return 0, false
			}
			if bits&(1<<b) == 0 {
				s.used[w] |= 1 << b
				return i, true
			}
		}
	}
	return 0, false
}

func (s *slots) taken(i int) bool { return s.used[i/64]&(1<<(i%64)) != 0 }
func (s *slots) mark(i int)       { s.used[i/64] |= 1 << (i % 64) }
func (s *slots) free(i int)       { s.used[i/64] &^= 1 << (i % 64) }

// index returns the block holding a, if a is in the subnet.
func (s *slots) index(a netip.Addr) (int, bool) {
	if !a.Is4() {
		return 0, false
	}
	off := addrUint(a) - s.base
	if addrUint(a) < s.base || int(off/4) >= s.n {
		return 0, false
	}
	return int(off / 4), true
}

// link returns block i's addresses (HostIf left empty).
func (s *slots) link(i int) Link {
	net := s.base + uint32(i)*4
	return Link{
		HostAddr:    uintAddr(net + 1),
		SandboxAddr: uintAddr(net + 2),
		Prefix:      netip.PrefixFrom(uintAddr(net), 30),
	}
}

func addrUint(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func uintAddr(u uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], u)
	return netip.AddrFrom4(b)
}

// check reports whether l is block i of s exactly.
func (s *slots) check(l Link) (int, error) {
	i, ok := s.index(l.Prefix.Addr())
	if !ok {
		return 0, errdefs.Invalid("link", "%s is outside the sandboxes' subnet", l.Prefix)
	}
	if want := s.link(i); want.Prefix != l.Prefix || want.HostAddr != l.HostAddr || want.SandboxAddr != l.SandboxAddr {
		return 0, errdefs.Invalid("link", "addresses %s/%s do not match block %s", l.HostAddr, l.SandboxAddr, want.Prefix)
	}
	return i, nil
}

func (l Link) String() string {
	return fmt.Sprintf("%s %s→%s", l.HostIf, l.HostAddr, l.SandboxAddr)
}

// netipMask returns the IPv4 netmask of a prefix length (0 < bits ≤ 32).
func netipMask(bits int) netip.Addr { return uintAddr(^uint32(0) << (32 - bits)) }
