package egress

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (and IP6T_SO_ORIGINAL_DST): the
// destination a connection had before an nftables redirect.
const soOriginalDst = 80

var errNoOriginalDst = errors.New("no original destination (the connection was not redirected)")

// OriginalDst returns the destination c was addressed to before the
// netfilter REDIRECT that brought it to the proxy. It fails for a
// connection that was not redirected.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errNoOriginalDst
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	var buf [unix.SizeofSockaddrInet6]byte
	var sysErr error
	err = rc.Control(func(fd uintptr) {
		level := unix.SOL_IP
		if local.Addr().Is6() && !local.Addr().Is4In6() {
			level = unix.SOL_IPV6
		}
		size := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), soOriginalDst,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			sysErr = e
		}
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	if sysErr != nil {
		if sysErr == syscall.ENOENT {
			return netip.AddrPort{}, errNoOriginalDst
		}
		return netip.AddrPort{}, sysErr
	}
	port := binary.BigEndian.Uint16(buf[2:4])
	switch binary.NativeEndian.Uint16(buf[0:2]) {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port), nil
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])).Unmap(), port), nil
	}
	return netip.AddrPort{}, errNoOriginalDst
}
