package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// originalDst returns where a connection redirected by the table was going
// (SO_ORIGINAL_DST, from conntrack). The egress proxy has its own
// (egress.OriginalDst); this one keeps the tests independent of it.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", err)
	}
	var (
		mreq *unix.IPv6Mreq
		serr error
	)
	// SO_ORIGINAL_DST fills a sockaddr_in; IPv6Mreq is the 16-byte
	// getsockopt helper x/sys offers for it.
	if err := rc.Control(func(fd uintptr) {
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", err)
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading original destination: %w", serr)
	}
	sa := mreq.Multiaddr
	port := binary.BigEndian.Uint16(sa[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port), nil
}
