package dns

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/network"
)

// TestThroughNetwork puts the resolver behind paddock's network: a query a
// sandbox sends to any server reaches it, is attributed to the sandbox by
// its address, and is answered as if from the server it asked.
func TestThroughNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace, a veth pair and an nftables table")
	}
	up := startUpstream(t)
	log := &auditLog{}
	// The resolver starts first (the network needs its port); it reaches
	// the manager through this pointer.
	var nmp atomic.Pointer[network.Manager]
	var selfp atomic.Pointer[netip.Addr]
	s, err := Start(Config{
		Addr:     "0.0.0.0:0",
		Upstream: []string{up.addr},
		Sandbox: func(peer netip.Addr) (string, bool) {
			if nm := nmp.Load(); nm != nil {
				return nm.Lookup(peer)
			}
			return "", false
		},
		Allowed: allowList,
		Special: map[string]func(string) []netip.Addr{"paddock.internal": func(string) []netip.Addr { return []netip.Addr{*selfp.Load()} }},
		Log:     log.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := make([]byte, 3)
	rand.Read(b)
	name := "d" + hex.EncodeToString(b)
	t.Cleanup(func() { network.Uninstall(name) })
	nm, err := network.New(network.Config{
		Subnet:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 218, b[0], 0}), 24),
		ProxyPort: 1, // nothing listens: this test sends no other TCP
		DNSPort:   s.Addr().Port(),
		Name:      name,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nm.Close() })
	nmp.Store(nm)

	fd := bareNetns(t)
	l, err := nm.Attach("sb1", fd)
	if err != nil {
		t.Fatal(err)
	}
	selfp.Store(&l.HostAddr)

	type result struct {
		r   *mdns.Msg
		err error
	}
	query := func(proto, server, qname string) result {
		var res result
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread() // never unlocked: the thread ends here
			if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
				res.err = err
				return
			}
			c := &mdns.Client{Net: proto, Timeout: 3 * time.Second}
			m := new(mdns.Msg)
			m.SetQuestion(qname, mdns.TypeA)
			res.r, _, res.err = c.Exchange(m, server)
		}()
		<-done
		return res
	}
	for _, c := range []struct{ proto, server, name, want string }{
		{"udp", "8.8.8.8:53", "allowed.test.", "192.0.2.10"},
		{"tcp", "1.1.1.1:53", "multi.test.", "192.0.2.11"},
		{"udp", net.JoinHostPort(l.HostAddr.String(), "53"), "paddock.internal.", l.HostAddr.String()},
		{"udp", "9.9.9.9:53", "denied.test.", "REFUSED"},
	} {
		res := query(c.proto, c.server, c.name)
		if res.err != nil {
			t.Errorf("%s %s %s: %v", c.proto, c.server, c.name, res.err)
			continue
		}
		got := mdns.RcodeToString[res.r.Rcode]
		if len(res.r.Answer) > 0 {
			got = res.r.Answer[0].(*mdns.A).A.String()
		}
		if got != c.want {
			t.Errorf("%s %s %s: %s, want %s", c.proto, c.server, c.name, got, c.want)
		}
	}
	if q := log.wait(t, "denied.test"); q.Allowed {
		t.Errorf("logged %+v", q)
	}
}

// bareNetns returns an fd of a new network namespace with loopback up.
func bareNetns(t *testing.T) int {
	t.Helper()
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{-1, err}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- res{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}
