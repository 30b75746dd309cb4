//go:build unix

package netpipe

import (
	"net"
	"syscall"
)

// Alive reports whether an idle connection is still open: a peek finds
// neither an end (the peer closed it) nor unexpected bytes. Pools of
// kept connections check it before they hand one out.
func Alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = err == syscall.EAGAIN
		return true
	})
	return err == nil && alive
}
