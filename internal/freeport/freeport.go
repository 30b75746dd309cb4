// Package freeport picks loopback TCP ports for servers that tests start
// in other processes (the daemon, a gateway, kube-apiserver, SeaweedFS).
//
// A port that a listener on port 0 was given and then closed lies in the
// kernel's ephemeral range: any connect or listen on the host may be
// handed it again before the child binds it, and the child then fails
// with "address already in use". These ports come from below that range,
// where the kernel never hands out a port by itself. Each is reserved for
// the life of the process with an abstract unix socket, so test binaries
// running side by side never pick the same one, and is checked free on
// 127.0.0.1 before it is returned.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port handed out: above the well-known and most
// registered service ports.
const lowest = 10000

var (
	mu       sync.Mutex
	next     int
	reserved []net.Listener // held until the process exits
)

// Ports returns n distinct ports free on 127.0.0.1, reserved for this
// process.
func Ports(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	lo, hi, err := span()
	if err != nil {
		return nil, err
	}
	if next < lo || next >= hi {
		next = lo + rand.IntN(hi-lo)
	}
	var out []int
	for tried := 0; len(out) < n; tried++ {
		if tried == hi-lo {
			return nil, fmt.Errorf("freeport: no free port left in %d-%d", lo, hi-1)
		}
		p := next
		if next++; next == hi {
			next = lo
		}
		if take(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Addr returns "127.0.0.1:port" for one port from Ports.
func Addr() (string, error) {
	ps, err := Ports(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ps[0])), nil
}

// take reserves port p for this process if no other process holds it
// and nothing listens on it now.
func take(p int) bool {
	r, err := net.Listen("unix", fmt.Sprintf("@paddock-freeport-%d", p))
	if err != nil {
		return false
	}
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		r.Close()
		return false
	}
	l.Close()
	reserved = append(reserved, r)
	return true
}

// span is the range [lo, hi) ports are taken from: below the kernel's
// ephemeral range, or above it when that range starts too low, or from
// lowest up when it leaves too little room either side.
func span() (lo, hi int, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, fmt.Errorf("freeport: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("freeport: ip_local_port_range reads %q", b)
	}
	first, err1 := strconv.Atoi(f[0])
	last, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("freeport: ip_local_port_range reads %q", b)
	}
	if first-lowest >= 1000 {
		return lowest, first, nil
	}
	if 65536-(last+1) >= 1000 {
		return last + 1, 65536, nil
	}
	// The ephemeral range covers nearly every port: the kernel may hand
	// one of these out too, as it could the old way's.
	return lowest, 65536, nil
}
