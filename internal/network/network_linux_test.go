package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// attach makes a stand-in sandbox and attaches it as id. The host side
// gets forwarding on, as on a host with net.ipv4.ip_forward=1 (Docker's
// hosts, routers): the forward chain, not the host's sysctl, must stop
// what a sandbox sends elsewhere.
func (f *fixture) attach(t *testing.T, id string) (*sandboxNS, Link) {
	t.Helper()
	ns := newSandboxNS(t)
	l, err := f.m.Attach(id, ns.fd)
	if err != nil {
		t.Fatalf("Attach(%s): %v", id, err)
	}
	if err := writeSysctl("ipv4/conf/"+l.HostIf+"/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	return ns, l
}

func TestAttachWiring(t *testing.T) {
	f := newFixture(t)
	out, err := exec.Command("nft", "list", "table", "inet", f.cfg.Name).CombinedOutput()
	t.Logf("nft list table inet %s (%v):\n%s", f.cfg.Name, err, out)

	a, la := f.attach(t, "sandbox-a")
	b, lb := f.attach(t, "sandbox-b")
	t.Logf("a: %s; b: %s", la, lb)

	t.Run("addresses", func(t *testing.T) {
		first := f.m.slots.link(0)
		if la.Prefix != first.Prefix || la.HostAddr != first.HostAddr || la.SandboxAddr != first.SandboxAddr {
			t.Errorf("first link %+v, want the lowest block %+v", la, first)
		}
		if lb.Prefix != f.m.slots.link(1).Prefix {
			t.Errorf("second link %s, want the next block", lb.Prefix)
		}
		if len(la.HostIf) > 15 || !strings.HasPrefix(la.HostIf, f.cfg.Name+"-") || la.HostIf != f.m.ifname("sandbox-a", 0) {
			t.Errorf("host interface %q", la.HostIf)
		}
		hl, err := netlink.LinkByName(la.HostIf)
		if err != nil {
			t.Fatal(err)
		}
		if hl.Attrs().Alias != "sandbox-a" || hl.Attrs().OperState != netlink.OperUp {
			t.Errorf("host side: alias %q, state %s", hl.Attrs().Alias, hl.Attrs().OperState)
		}
		inNS(t, a.fd, func() {
			sl, err := netlink.LinkByName(SandboxIf)
			if err != nil {
				t.Error(err)
				return
			}
			addrs, _ := netlink.AddrList(sl, netlink.FAMILY_V4)
			if len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(la.SandboxAddr, 30).String() {
				t.Errorf("sandbox eth0 addresses %v", addrs)
			}
			routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
			var gw bool
			for _, r := range routes {
				if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(la.HostAddr.AsSlice()) {
					gw = true
				}
			}
			if !gw {
				t.Errorf("no default route via %s: %v", la.HostAddr, routes)
			}
		})
	})

	// (h) the peer address names the sandbox.
	t.Run("lookup", func(t *testing.T) {
		for _, c := range []struct {
			addr netip.Addr
			id   string
			ok   bool
		}{
			{la.SandboxAddr, "sandbox-a", true},
			{lb.SandboxAddr, "sandbox-b", true},
			{netip.AddrFrom16(la.SandboxAddr.As16()), "sandbox-a", true}, // v4-in-v6, as a dual-stack listener reports it
			{la.HostAddr, "", false},
			{netip.MustParseAddr("127.0.0.1"), "", false},
		} {
			if id, ok := f.m.Lookup(c.addr); id != c.id || ok != c.ok {
				t.Errorf("Lookup(%s) = %q, %v; want %q, %v", c.addr, id, ok, c.id, c.ok)
			}
		}
		if l, ok := f.m.Link("sandbox-a"); !ok || l != la {
			t.Errorf("Link = %+v, %v", l, ok)
		}
		if got := f.m.Links(); len(got) != 2 || got["sandbox-b"] != lb {
			t.Errorf("Links = %v", got)
		}
	})

	// (a) TCP to anywhere lands on the proxy, which reads the original
	// destination.
	t.Run("tcp to the proxy", func(t *testing.T) {
		for _, dst := range []string{"203.0.113.5:443", "1.1.1.1:80", "192.0.2.1:22", "10.0.0.1:8080"} {
			var line string
			var err error
			inNS(t, a.fd, func() { line, err = dialTCP(dst) })
			if err != nil {
				t.Errorf("%s: %v", dst, err)
				continue
			}
			if line != "proxy "+dst {
				t.Errorf("%s: answered %q, want the proxy", dst, line)
			}
			h := expectHit(t, dst, f.proxy.hits)
			if h.orig.String() != dst || h.peer.Addr() != la.SandboxAddr {
				t.Errorf("%s: proxy saw peer %s, original destination %s", dst, h.peer, h.orig)
			}
			if id, ok := f.m.Lookup(h.peer.Addr()); !ok || id != "sandbox-a" {
				t.Errorf("%s: Lookup(peer) = %q, %v", dst, id, ok)
			}
		}
	})

	// (b) DNS to any server, UDP and TCP, reaches the resolver; the
	// answer comes back from the server the sandbox asked.
	t.Run("dns to the resolver", func(t *testing.T) {
		var udpAns, tcpAns string
		var uerr, terr error
		inNS(t, a.fd, func() {
			udpAns, uerr = udpExchange("8.8.8.8:53", "query", waitOK)
			tcpAns, terr = dialTCP("9.9.9.9:53")
		})
		if uerr != nil || udpAns != "dns query" {
			t.Errorf("UDP 8.8.8.8:53: %q, %v", udpAns, uerr)
		} else if h := expectHit(t, "udp dns", f.dnsUDP.hits); h.peer.Addr() != la.SandboxAddr {
			t.Errorf("resolver saw peer %s", h.peer)
		}
		if terr != nil || tcpAns != "dnstcp 9.9.9.9:53" {
			t.Errorf("TCP 9.9.9.9:53: %q, %v", tcpAns, terr)
		} else {
			expectHit(t, "tcp dns", f.dnsTCP.hits)
		}
	})

	t.Run("self endpoint", func(t *testing.T) {
		var line string
		var err error
		inNS(t, a.fd, func() { line, err = dialTCP(netip.AddrPortFrom(la.HostAddr, 80).String()) })
		if err != nil || !strings.HasPrefix(line, "self ") {
			t.Fatalf("http://%s/: %q, %v; want the self endpoint", la.HostAddr, line, err)
		}
		if h := expectHit(t, "self", f.self.hits); h.peer.Addr() != la.SandboxAddr {
			t.Errorf("self endpoint saw peer %s", h.peer)
		}
		// Port 80 elsewhere is the proxy's.
		inNS(t, a.fd, func() { line, err = dialTCP("203.0.113.9:80") })
		if line != "proxy 203.0.113.9:80" {
			t.Errorf("203.0.113.9:80 answered %q, %v", line, err)
		}
		expectHit(t, "proxy", f.proxy.hits)
	})

	// (c) the host's loopback services and its other ports are out of reach.
	t.Run("host services", func(t *testing.T) {
		loTCP := startTCP(t, "127.0.0.1:0", "loopback")
		loUDP := startUDP(t, "udp4", "127.0.0.1:0", "loopback")
		anyTCP := startTCP(t, "0.0.0.0:0", "host")
		anyUDP := startUDP(t, "udp4", "0.0.0.0:0", "host")
		hostMAC := hostMAC(t, la)
		var loErr, anyUDPErr, rawErr error
		var anyLine string
		inNS(t, a.fd, func() {
			// The sandbox's 127.0.0.1 is its own loopback.
			_, loErr = dialTCP(fmt.Sprintf("127.0.0.1:%d", loTCP.port))
			anyLine, _ = dialTCP(fmt.Sprintf("%s:%d", la.HostAddr, anyTCP.port))
			_, anyUDPErr = udpExchange(fmt.Sprintf("%s:%d", la.HostAddr, anyUDP.port), "x", waitNot)
			// Hand-made frames to the host's loopback; then one the
			// host must accept, so we know the frames were sent.
			src := netip.AddrPortFrom(la.SandboxAddr, 40000)
			rawErr = sendRaw(hostMAC, unix.ETH_P_IP,
				udp4(src, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", loUDP.port)), "raw"),
				udp4(src, netip.AddrPortFrom(la.HostAddr, loUDP.port), "raw"),
				udp4(src, netip.AddrPortFrom(la.HostAddr, f.cfg.DNSPort), "control"))
		})
		if loErr == nil {
			t.Errorf("127.0.0.1:%d answered from inside the sandbox", loTCP.port)
		}
		if anyLine != fmt.Sprintf("proxy %s:%d", la.HostAddr, anyTCP.port) {
			t.Errorf("TCP to the host side's port %d: %q, want the proxy", anyTCP.port, anyLine)
		}
		expectHit(t, "proxy", f.proxy.hits)
		if anyUDPErr == nil {
			t.Errorf("UDP to the host side's port %d got an answer", anyUDP.port)
		}
		if rawErr != nil {
			t.Fatalf("sending raw frames: %v", rawErr)
		}
		expectHit(t, "control frame", f.dnsUDP.hits)
		expectNone(t, "host loopback TCP", loTCP.hits)
		expectNone(t, "host loopback UDP", loUDP.hits)
		expectNone(t, "host TCP on 0.0.0.0", anyTCP.hits)
		expectNone(t, "host UDP on 0.0.0.0", anyUDP.hits)
	})

	// (d) another sandbox is out of reach, by any address; and the host
	// opens nothing into a sandbox.
	t.Run("other sandbox", func(t *testing.T) {
		var bTCP *net.TCPListener
		var bUDP *net.UDPConn
		inNS(t, b.fd, func() {
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{Port: 7000})
			if err != nil {
				t.Error(err)
				return
			}
			bTCP = l
			bUDP, _ = net.ListenUDP("udp4", &net.UDPAddr{Port: 7001})
		})
		if bTCP == nil || bUDP == nil {
			t.Fatal("no listeners in b")
		}
		defer bTCP.Close()
		defer bUDP.Close()
		got := make(chan string, 4)
		go func() {
			if c, err := bTCP.Accept(); err == nil {
				got <- "tcp from " + c.RemoteAddr().String()
				c.Close()
			}
		}()
		go func() {
			buf := make([]byte, 64)
			if _, from, err := bUDP.ReadFrom(buf); err == nil {
				got <- "udp from " + from.String()
			}
		}()
		var line string
		var uerr error
		inNS(t, a.fd, func() {
			line, _ = dialTCP(netip.AddrPortFrom(lb.SandboxAddr, 7000).String())
			_, uerr = udpExchange(netip.AddrPortFrom(lb.SandboxAddr, 7001).String(), "x", waitNot)
			udpExchange(netip.AddrPortFrom(lb.HostAddr, 7001).String(), "x", waitNot)
		})
		if want := fmt.Sprintf("proxy %s:7000", lb.SandboxAddr); line != want {
			t.Errorf("a → b TCP: %q, want %q", line, want)
		}
		expectHit(t, "proxy", f.proxy.hits)
		if uerr == nil {
			t.Error("a → b UDP got an answer")
		}
		// From the host itself.
		if c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(lb.SandboxAddr, 7000).String(), waitNot); err == nil {
			c.Close()
			t.Error("the host opened a connection into sandbox b")
		}
		select {
		case s := <-got:
			t.Errorf("sandbox b received %s", s)
		case <-time.After(waitNot):
		}
	})

	// Spoofed sources are dropped, so Lookup(peer) cannot be lied to.
	t.Run("spoofing", func(t *testing.T) {
		mac := hostMAC(t, la)
		dns := netip.AddrPortFrom(la.HostAddr, f.cfg.DNSPort)
		var err error
		inNS(t, a.fd, func() {
			err = sendRaw(mac, unix.ETH_P_IP,
				udp4(netip.AddrPortFrom(lb.SandboxAddr, 40001), dns, "as b"),
				udp4(netip.AddrPortFrom(la.HostAddr, 40002), dns, "as the host side"),
				udp4(netip.MustParseAddrPort("203.0.113.7:40003"), dns, "as a public address"),
				udp4(netip.MustParseAddrPort("127.0.0.1:40004"), dns, "as loopback"),
				udp4(netip.AddrPortFrom(la.SandboxAddr, 40005), dns, "control"))
		})
		if err != nil {
			t.Fatal(err)
		}
		h := expectHit(t, "control", f.dnsUDP.hits)
		if h.peer.Port() != 40005 {
			t.Errorf("first datagram to arrive came from %s, want the control", h.peer)
		}
		expectNone(t, "spoofed datagrams", f.dnsUDP.hits)
	})

	// (e) the metadata address only through the proxy.
	t.Run("metadata", func(t *testing.T) {
		var line string
		var uerr error
		inNS(t, a.fd, func() {
			line, _ = dialTCP("169.254.169.254:80")
			_, uerr = udpExchange("169.254.169.254:80", "x", waitNot)
		})
		if line != "proxy 169.254.169.254:80" {
			t.Errorf("169.254.169.254:80 TCP: %q, want the proxy", line)
		}
		expectHit(t, "proxy", f.proxy.hits)
		if uerr == nil {
			t.Error("UDP to the metadata address got an answer")
		}
	})

	// (f) other UDP goes nowhere, and is refused at once.
	t.Run("udp elsewhere", func(t *testing.T) {
		dst := netip.MustParseAddrPort("8.8.8.8:123")
		sn := sniff(t, dst, f.cfg.Name+"-")
		before := nftCounter(t, f.cfg.Name, "a sandbox reaches no other network")
		var err error
		start := time.Now()
		inNS(t, a.fd, func() { _, err = udpExchange(dst.String(), "ntp", waitOK) })
		took := time.Since(start)
		if err == nil {
			t.Fatal("UDP to 8.8.8.8:123 got an answer")
		}
		if !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to 8.8.8.8:123: %v after %s, want refused at once", err, took)
		}
		select {
		case s := <-sn.seen:
			t.Errorf("a datagram to %s left the host (%s)", dst, s)
		case <-time.After(waitNot):
		}
		if after := nftCounter(t, f.cfg.Name, "a sandbox reaches no other network"); after <= before {
			t.Errorf("forward reject counter %d → %d", before, after)
		}
	})

	// (g) no IPv6 in the sandbox, and what it crafts goes nowhere.
	t.Run("ipv6", func(t *testing.T) {
		host6 := startUDP(t, "udp6", "[::]:0", "v6")
		var dialErr, rawErr error
		var sysAll, sysEth0, sysDefault string
		var routes []netlink.Route
		var addrs []netlink.Addr
		mac := hostMAC(t, la)
		inNS(t, a.fd, func() {
			sysEth0 = readSysctl("ipv6/conf/eth0/disable_ipv6")
			sysDefault = readSysctl("ipv6/conf/default/disable_ipv6")
			sysAll = readSysctl("ipv6/conf/all/disable_ipv6")
			sl, _ := netlink.LinkByName(SandboxIf)
			addrs, _ = netlink.AddrList(sl, netlink.FAMILY_V6)
			routes, _ = netlink.RouteList(nil, netlink.FAMILY_V6)
			var c net.Conn
			if c, dialErr = net.DialTimeout("tcp6", "[2001:db8::1]:443", waitNot); c != nil {
				c.Close()
			}
			src := netip.MustParseAddrPort("[fe80::1]:40000")
			rawErr = sendRaw(mac, 0x86dd,
				udp6(src, netip.AddrPortFrom(netip.MustParseAddr("ff02::1"), host6.port), "multicast"),
				udp6(netip.MustParseAddrPort("[fd00::99]:40000"), netip.AddrPortFrom(netip.IPv6Loopback(), host6.port), "loopback"))
		})
		t.Logf("inside: all=%s default=%s eth0=%s", sysAll, sysDefault, sysEth0)
		if sysEth0 != "1" || sysDefault != "1" {
			t.Errorf("disable_ipv6: eth0=%s default=%s, want 1", sysEth0, sysDefault)
		}
		if len(addrs) != 0 {
			t.Errorf("eth0 has IPv6 addresses %v", addrs)
		}
		for _, r := range routes {
			if r.LinkIndex != 1 { // lo
				t.Errorf("IPv6 route %v", r)
			}
		}
		if dialErr == nil {
			t.Error("an IPv6 connection succeeded")
		}
		if rawErr != nil {
			t.Fatal(rawErr)
		}
		expectNone(t, "crafted IPv6", host6.hits)
		if v := readSysctl("ipv6/conf/" + la.HostIf + "/disable_ipv6"); v != "1" {
			t.Errorf("host side disable_ipv6 = %s", v)
		}
	})

	t.Run("conflict", func(t *testing.T) {
		ns := newSandboxNS(t)
		if _, err := f.m.Attach("sandbox-a", ns.fd); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("second Attach of an id: %v, want ErrConflict", err)
		}
		if _, err := f.m.Attach("sandbox-c", a.fd); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Attach into a netns that has an eth0: %v, want ErrConflict", err)
		}
		// This thread's netns, not /proc/self's: the main thread may be
		// one an inNS goroutine left in a sandbox's netns.
		host, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		if _, err := f.m.Attach("sandbox-c", int(host)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Attach of the host netns: %v, want ErrInvalid", err)
		}
		if got := f.m.Links(); len(got) != 2 {
			t.Errorf("failed Attaches left links: %v", got)
		}
	})
}

func hostMAC(t testing.TB, l Link) net.HardwareAddr {
	t.Helper()
	hl, err := netlink.LinkByName(l.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	return hl.Attrs().HardwareAddr
}

func readSysctl(path string) string {
	b, err := os.ReadFile("/proc/sys/net/" + path)
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// (i) Detach costs the caller nothing, the interface goes in the
// background, and its address is handed out again only once it has gone.
func TestDetach(t *testing.T) {
	f := newFixture(t)
	_, la := f.attach(t, "a")
	_, lb := f.attach(t, "b")

	start := time.Now()
	if err := f.m.Detach("a"); err != nil {
		t.Fatal(err)
	}
	t.Logf("Detach returned after %s", time.Since(start))
	if _, ok := f.m.Lookup(la.SandboxAddr); ok {
		t.Error("Lookup still answers after Detach")
	}
	if err := f.m.Detach("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Detach: %v, want ErrNotFound", err)
	}
	// Until the interface is gone, its block stays taken.
	slot, _ := f.m.slots.index(la.SandboxAddr)
	deadline := time.Now().Add(waitOK)
	for {
		f.m.mu.RLock()
		taken := f.m.slots.taken(slot)
		f.m.mu.RUnlock()
		_, err := netlink.LinkByName(la.HostIf)
		exists := err == nil
		if !taken {
			if exists {
				t.Fatal("block freed while its interface still exists")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("block never freed")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("interface gone and block free after %s", time.Since(start))

	// The lowest block is handed out again.
	_, lc := f.attach(t, "c")
	if lc.Prefix != la.Prefix {
		t.Errorf("next Attach got %s, want the freed %s", lc.Prefix, la.Prefix)
	}

	// A sandbox that died first: its netns took the veth pair with it.
	nsD, ld := f.attach(t, "d")
	unix.Close(nsD.fd)
	syscall.Kill(nsD.pid, syscall.SIGKILL)
	waitGone(t, ld.HostIf)
	if err := f.m.Detach("d"); err != nil {
		t.Fatal(err)
	}
	waitFree(t, f.m, ld)
	_ = lb
}

// TestDetachLeavesDeadToKernel: the veth pairs of sandboxes whose
// processes are gone go with their network namespaces, which the kernel
// cleans up in batches: the worker frees their blocks without deleting
// anything itself (its own deletions are held back here for an hour).
func TestDetachLeavesDeadToKernel(t *testing.T) {
	f := newFixture(t)
	f.m.mu.Lock()
	f.m.grace = time.Hour
	f.m.mu.Unlock()
	var links []Link
	for i := range 8 {
		ns, l := f.attach(t, fmt.Sprintf("dead-%d", i))
		if i == 0 {
			// What the host keeps per address: a set element and a
			// conntrack entry for a TCP connection, one for DNS.
			inNS(t, ns.fd, func() {
				dialTCP("203.0.113.5:1000")
				udpExchange("8.8.8.8:53", "query", waitOK)
			})
			expectHit(t, "tcp", f.proxy.hits)
			expectHit(t, "udp dns", f.dnsUDP.hits)
			if left := addrTraces(t, f.cfg.Name, l.SandboxAddr); len(left) == 0 {
				t.Fatal("the sandbox's connections left no set element or conntrack entry to test with")
			}
		}
		unix.Close(ns.fd)
		syscall.Kill(ns.pid, syscall.SIGKILL)
		links = append(links, l)
	}
	for i := range links {
		if err := f.m.Detach(fmt.Sprintf("dead-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range links {
		waitFree(t, f.m, l)
		if _, err := netlink.LinkByName(l.HostIf); err == nil {
			t.Errorf("%s freed while it exists", l.HostIf)
		}
		if left := addrTraces(t, f.cfg.Name, l.SandboxAddr); len(left) > 0 {
			t.Errorf("%s freed while the host keeps %v", l.SandboxAddr, left)
		}
	}
}

// addrTraces lists what the host keeps of a sandbox address: elements of
// table name's per-sandbox sets and conntrack entries from it.
func addrTraces(t testing.TB, name string, a netip.Addr) []string {
	t.Helper()
	var left []string
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"conns", "dnsrate"} {
		elems, err := c.GetSetElements(&nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: name}, Name: set, KeyType: nftables.TypeIPAddr})
		if err != nil {
			t.Fatalf("listing set %s: %v", set, err)
		}
		for _, e := range elems {
			if k, ok := netip.AddrFromSlice(e.Key); ok && k == a {
				left = append(left, "element of "+set)
			}
		}
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		t.Fatalf("listing conntrack: %v", err)
	}
	for _, f := range flows {
		if src, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && src == a {
			left = append(left, "conntrack "+f.String())
		}
	}
	return left
}

func waitFree(t testing.TB, m *Manager, l Link) {
	t.Helper()
	slot, _ := m.slots.index(l.SandboxAddr)
	deadline := time.Now().Add(waitOK)
	for {
		m.mu.RLock()
		taken := m.slots.taken(slot)
		m.mu.RUnlock()
		if !taken {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("block %s never freed", l.Prefix)
		}
		time.Sleep(time.Millisecond)
	}
}

// (j) A new Manager on the same table finds existing links; Restore
// claims them, Prune deletes the rest.
func TestRestore(t *testing.T) {
	f := newFixture(t)
	a, la := f.attach(t, "a")
	_, lb := f.attach(t, "b")
	f.m.Close()

	// The daemon restarts: the table is replaced, the links are not.
	m2, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	if _, ok := m2.Lookup(la.SandboxAddr); ok {
		t.Error("Lookup answers before Restore")
	}
	if err := m2.Restore("a", la); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := m2.Restore("a", la); err != nil {
		t.Errorf("Restore again: %v, want idempotent", err)
	}
	if id, ok := m2.Lookup(la.SandboxAddr); !ok || id != "a" {
		t.Errorf("Lookup after Restore = %q, %v", id, ok)
	}
	// Wrong owner, wrong address, a link that is gone.
	if err := m2.Restore("not-b", lb); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Restore under another id: %v, want ErrNotFound", err)
	}
	bad := lb
	bad.HostIf = la.HostIf
	if err := m2.Restore("b", bad); err == nil {
		t.Error("Restore of a's interface with b's addresses succeeded")
	}
	gone := lb
	gone.HostIf = f.cfg.Name + "-nothere"
	if err := m2.Restore("b", gone); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Restore of a missing interface: %v, want ErrNotFound", err)
	}

	// b was found at start and not claimed: its block is not handed out.
	_, lc := attachTo(t, m2, "c")
	if lc.Prefix == la.Prefix || lc.Prefix == lb.Prefix {
		t.Errorf("Attach after restart got %s, a taken block", lc.Prefix)
	}

	// The rules still apply to the restored sandbox.
	var line string
	inNS(t, a.fd, func() { line, err = dialTCP("203.0.113.5:443") })
	if line != "proxy 203.0.113.5:443" {
		t.Errorf("after restart: %q, %v", line, err)
	}
	expectHit(t, "proxy", f.proxy.hits)

	if n := m2.Prune(); n != 1 {
		t.Errorf("Prune = %d, want 1 (b)", n)
	}
	waitGone(t, lb.HostIf)
	waitFree(t, m2, lb)
	if err := m2.Restore("b", lb); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Restore after Prune: %v, want ErrNotFound", err)
	}
	if _, err := netlink.LinkByName(la.HostIf); err != nil {
		t.Errorf("Prune deleted a restored link: %v", err)
	}
}

func attachTo(t *testing.T, m *Manager, id string) (*sandboxNS, Link) {
	t.Helper()
	ns := newSandboxNS(t)
	l, err := m.Attach(id, ns.fd)
	if err != nil {
		t.Fatalf("Attach(%s): %v", id, err)
	}
	return ns, l
}

func TestSubnetFull(t *testing.T) {
	requireRoot(t)
	f := newFixture(t)
	f.m.Close()
	cfg := f.cfg
	cfg.Subnet = netip.PrefixFrom(cfg.Subnet.Addr(), 29) // two blocks
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	attachTo(t, m, "one")
	_, l2 := attachTo(t, m, "two")
	ns := newSandboxNS(t)
	if _, err := m.Attach("three", ns.fd); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Attach on a full subnet: %v, want ErrUnavailable", err)
	}
	m.Detach("two")
	waitFree(t, m, l2)
	if _, err := m.Attach("three", ns.fd); err != nil {
		t.Fatalf("Attach after a Detach: %v", err)
	}
}

func TestNewIdempotentAndOverlap(t *testing.T) {
	f := newFixture(t)
	count := func() int {
		out, err := exec.Command("nft", "-a", "list", "table", "inet", f.cfg.Name).CombinedOutput()
		if err != nil {
			t.Skipf("nft: %v: %s", err, out)
		}
		return strings.Count(string(out), "# handle") - 1 // minus the table's own
	}
	before := count()
	m2, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m2.Close()
	if after := count(); after != before || before == 0 {
		t.Errorf("objects in the table: %d before the second New, %d after", before, after)
	}
	// A subnet that overlaps a host route is refused.
	cfg := f.cfg
	cfg.Name = testName(t)
	cfg.Subnet = netip.Prefix{}
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.To4() == nil {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones >= 8 && ones <= 30 {
			a, _ := netip.AddrFromSlice(r.Dst.IP.To4())
			cfg.Subnet = netip.PrefixFrom(a, ones).Masked()
			break
		}
	}
	if !cfg.Subnet.IsValid() {
		t.Skip("no host route to overlap")
	}
	if m, err := New(cfg); !errors.Is(err, errdefs.ErrConflict) {
		if m != nil {
			m.Close()
			Uninstall(cfg.Name)
		}
		t.Errorf("New over the host's route %s: %v, want ErrConflict", cfg.Subnet, err)
	}
}

// Costs, measured: go test -run XXX -bench . ./internal/network/
func BenchmarkAttach(b *testing.B) {
	requireRoot(b)
	m, _ := benchManager(b)
	// As the runtime's guests: a process in new user and net namespaces.
	sbs := make([]*sandboxNS, b.N)
	for i := range sbs {
		sbs[i] = newSandboxNS(b)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Attach(fmt.Sprintf("bench-%d", i), sbs[i].fd); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDetach(b *testing.B) {
	requireRoot(b)
	m, _ := benchManager(b)
	for i := 0; i < b.N; i++ {
		fd := plainNetns(b)
		defer unix.Close(fd)
		if _, err := m.Attach(fmt.Sprintf("bench-%d", i), fd); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.Detach(fmt.Sprintf("bench-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLookup(b *testing.B) {
	requireRoot(b)
	m, _ := benchManager(b)
	fd := plainNetns(b)
	defer unix.Close(fd)
	l, err := m.Attach("x", fd)
	if err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := m.Lookup(l.SandboxAddr); !ok {
				b.Fatal("not found")
			}
		}
	})
}

func benchManager(b *testing.B) (*Manager, string) {
	b.Helper()
	cfg := Config{Subnet: netip.MustParsePrefix("10.219.0.0/16"), ProxyPort: 1, DNSPort: 2, SelfPort: 3, Name: testName(b)}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		m.Close()
		Uninstall(cfg.Name)
	})
	return m, cfg.Name
}

// One sandbox cannot fill the host's conntrack table: its open TCP
// connections and its DNS packet rate are bounded by the table.
func TestFloodBounds(t *testing.T) {
	f := newFixture(t)
	f.m.Close()
	// A proxy that holds connections open.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	})
	cfg := f.cfg
	cfg.ProxyPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	cfg.MaxConns = 8
	cfg.MaxDNSRate = 50
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ns, _ := attachTo(t, m, "flood")

	var conns []net.Conn
	var extraErr error
	var took time.Duration
	inNS(t, ns.fd, func() {
		for i := 0; i < cfg.MaxConns; i++ {
			c, err := net.DialTimeout("tcp4", fmt.Sprintf("203.0.113.5:%d", 1000+i), waitOK)
			if err != nil {
				t.Errorf("connection %d: %v", i, err)
				return
			}
			conns = append(conns, c)
		}
		start := time.Now()
		var c net.Conn
		if c, extraErr = net.DialTimeout("tcp4", "203.0.113.5:2000", waitOK); c != nil {
			c.Close()
		}
		took = time.Since(start)
	})
	if extraErr == nil {
		t.Errorf("connection %d was accepted", cfg.MaxConns+1)
	} else if took > time.Second {
		t.Errorf("connection %d: %v after %s, want refused at once", cfg.MaxConns+1, extraErr, took)
	}
	// Closed connections no longer count.
	for _, c := range conns {
		c.Close()
	}
	for i := 0; i < cfg.MaxConns; i++ {
		(<-held).Close()
	}
	var againErr error
	deadline := time.Now().Add(waitOK)
	for {
		inNS(t, ns.fd, func() {
			var c net.Conn
			if c, againErr = net.DialTimeout("tcp4", "203.0.113.5:2001", waitOK); c != nil {
				c.Close()
			}
		})
		if againErr == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if againErr != nil {
		t.Errorf("after closing its connections: %v", againErr)
	}

	// DNS: a burst far beyond the rate gets through only up to it.
	const sent = 3000
	var sendErr error
	start := time.Now()
	inNS(t, ns.fd, func() {
		c, err := net.Dial("udp4", "8.8.8.8:53")
		if err != nil {
			sendErr = err
			return
		}
		defer c.Close()
		for i := 0; i < sent; i++ {
			if _, err := c.Write([]byte("q")); err != nil {
				sendErr = err
				return
			}
		}
	})
	elapsed := time.Since(start)
	if sendErr != nil {
		t.Fatal(sendErr)
	}
	time.Sleep(200 * time.Millisecond)
	got := f.dnsUDP.count.Load()
	limit := int64(cfg.MaxDNSRate) + int64(elapsed.Seconds()*float64(cfg.MaxDNSRate)) + 10
	t.Logf("%d DNS packets sent in %s, %d arrived", sent, elapsed, got)
	if got > limit || got < int64(cfg.MaxDNSRate)/2 {
		t.Errorf("%d of %d DNS packets arrived, want about %d", got, sent, cfg.MaxDNSRate)
	}
}

// TestReaddress: a sandbox side whose address and route were taken off
// (as gVisor's netstack takes them when it takes the interface over)
// gets them back, twice over does no harm, and an unknown id is
// ErrNotFound.
func TestReaddress(t *testing.T) {
	f := newFixture(t)
	ns, l := f.attach(t, "sandbox-a")
	state := func() (addrs []string, gw bool) {
		inNS(t, ns.fd, func() {
			sl, err := netlink.LinkByName(SandboxIf)
			if err != nil {
				t.Error(err)
				return
			}
			as, _ := netlink.AddrList(sl, netlink.FAMILY_V4)
			for _, a := range as {
				addrs = append(addrs, a.IPNet.String())
			}
			routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
			for _, r := range routes {
				if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(l.HostAddr.AsSlice()) {
					gw = true
				}
			}
		})
		return addrs, gw
	}
	want := netip.PrefixFrom(l.SandboxAddr, l.Prefix.Bits()).String()
	inNS(t, ns.fd, func() {
		sl, err := netlink.LinkByName(SandboxIf)
		if err != nil {
			t.Fatal(err)
		}
		as, _ := netlink.AddrList(sl, netlink.FAMILY_V4)
		for _, a := range as {
			if err := netlink.AddrDel(sl, &a); err != nil {
				t.Error(err)
			}
		}
	})
	if addrs, gw := state(); len(addrs) != 0 || gw {
		t.Fatalf("after the removal: addresses %v, default route %v", addrs, gw)
	}
	for i := 0; i < 2; i++ {
		if err := f.m.Readdress("sandbox-a", ns.fd); err != nil {
			t.Fatalf("Readdress %d: %v", i, err)
		}
		if addrs, gw := state(); len(addrs) != 1 || addrs[0] != want || !gw {
			t.Fatalf("after Readdress %d: addresses %v (want %s), default route %v", i, addrs, want, gw)
		}
	}
	if err := f.m.Readdress("sandbox-b", ns.fd); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Readdress of an unknown sandbox: %v", err)
	}
}
