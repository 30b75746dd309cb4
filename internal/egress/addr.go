package egress

import "net/netip"

// nonPublic lists the address ranges that are never part of the internet
// preset and that a resolved name may not land on (DNS rebinding): a
// connection to one of them needs an allow rule whose prefix lies inside
// the range (see targetsNonPublic).
var nonPublic = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // "this network", unspecified
		"10.0.0.0/8",      // RFC 1918
		"100.64.0.0/10",   // CGNAT, RFC 6598
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, cloud metadata (169.254.169.254)
		"172.16.0.0/12",   // RFC 1918
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation
		"192.88.99.0/24",  // 6to4 relay anycast (deprecated)
		"192.168.0.0/16",  // RFC 1918
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // documentation
		"203.0.113.0/24",  // documentation
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, broadcast
		"::/128",          // unspecified
		"::1/128",         // loopback
		"::ffff:0:0/96",   // IPv4-mapped (checked unmapped first)
		"64:ff9b:1::/48",  // local-use NAT64
		"100::/64",        // discard
		"2001::/23",       // IETF protocol assignments (Teredo, ORCHID, ...)
		"2001:db8::/32",   // documentation
		"fc00::/7",        // unique local (ULA)
		"fe80::/10",       // link-local
		"fec0::/10",       // site-local (deprecated)
		"ff00::/8",        // multicast
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// PublicAddr reports whether a is an address on the public internet: not
// private (RFC 1918, ULA), CGNAT, loopback, link-local (including the
// metadata address 169.254.169.254), multicast, unspecified, reserved or
// documentation space. IPv6 forms that embed an IPv4 address (mapped,
// NAT64, 6to4) are judged by the embedded address.
func PublicAddr(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return PublicAddr(netip.AddrFrom4([4]byte(b[12:16])))
		case sixTo4.Contains(a):
			return PublicAddr(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// targetsNonPublic reports whether p lies inside one non-public range, so
// that an allow rule naming it opens exactly that part of private space. A
// broad rule such as 0.0.0.0/0 covers public space too and so opens only
// public addresses: nobody reaches the metadata address by accident.
func targetsNonPublic(p netip.Prefix) bool {
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p))
	for _, np := range nonPublic {
		if np.Bits() <= p.Bits() && np.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}
