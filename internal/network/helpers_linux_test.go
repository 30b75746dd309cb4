package network

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/deathsig"
)

// Bounds on every wait in these tests.
const (
	waitOK  = 3 * time.Second        // something that must happen
	waitNot = 400 * time.Millisecond // something that must not: how long we watch
)

// requireRoot skips tests that create namespaces, veths and tables.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs and nftables tables")
	}
}

// testName returns a Name no daemon and no other test uses.
func testName(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	return "t" + hex.EncodeToString(b) // 7 characters
}

// testSubnet returns a /24 in 10.200.0.0/12-ish space that no route covers.
func testSubnet(t testing.TB) netip.Prefix {
	t.Helper()
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for try := 0; try < 50; try++ {
		b := make([]byte, 2)
		rand.Read(b)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200 + b[0]%20, b[1], 0}), 24)
		free := true
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && ones > 0 && netip.PrefixFrom(a, ones).Overlaps(p) {
				free = false
			}
		}
		if free {
			return p
		}
	}
	t.Fatal("no free test subnet")
	return netip.Prefix{}
}

// hit is one connection or datagram a host-side test service received.
type hit struct {
	peer netip.AddrPort
	orig netip.AddrPort // SO_ORIGINAL_DST, TCP only
}

// tcpService accepts on ln; to each connection it writes "<tag> <original
// destination>\n" and closes it. Every connection is recorded in hits.
type tcpService struct {
	ln   net.Listener
	port uint16
	hits chan hit
}

func startTCP(t testing.TB, addr, tag string) *tcpService {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &tcpService{ln: ln, port: uint16(ln.Addr().(*net.TCPAddr).Port), hits: make(chan hit, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h := hit{peer: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
			h.peer = netip.AddrPortFrom(h.peer.Addr().Unmap(), h.peer.Port())
			if o, err := originalDst(c.(*net.TCPConn)); err == nil {
				h.orig = o
			}
			select {
			case s.hits <- h:
			default:
			}
			c.SetDeadline(time.Now().Add(waitOK))
			fmt.Fprintf(c, "%s %s\n", tag, h.orig)
			c.Close()
		}
	}()
	return s
}

// udpService echoes "<tag> <payload>" to every datagram and records it.
type udpService struct {
	conn  *net.UDPConn
	port  uint16
	hits  chan hit
	count atomic.Int64
}

func startUDP(t testing.TB, network, addr, tag string) *udpService {
	t.Helper()
	pc, err := net.ListenPacket(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	c := pc.(*net.UDPConn)
	s := &udpService{conn: c, port: uint16(c.LocalAddr().(*net.UDPAddr).Port), hits: make(chan hit, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() { c.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			s.count.Add(1)
			select {
			case s.hits <- hit{peer: netip.AddrPortFrom(from.Addr().Unmap(), from.Port())}:
			default:
			}
			c.WriteToUDPAddrPort([]byte(tag+" "+string(buf[:n])), from)
		}
	}()
	return s
}

// expectHit waits for one hit.
func expectHit(t testing.TB, what string, hits chan hit) hit {
	t.Helper()
	select {
	case h := <-hits:
		return h
	case <-time.After(waitOK):
		t.Fatalf("%s: nothing arrived", what)
	}
	return hit{}
}

// expectNone checks that nothing arrived (or arrives for a little while).
func expectNone(t testing.TB, what string, hits chan hit) {
	t.Helper()
	select {
	case h := <-hits:
		t.Errorf("%s: something arrived from %s (original destination %s)", what, h.peer, h.orig)
	case <-time.After(waitNot):
	}
}

// fixture is a Manager on a unique table and subnet, with test services on
// its proxy, DNS and self ports (all on 0.0.0.0, as the daemon's would be).
type fixture struct {
	m      *Manager
	cfg    Config
	proxy  *tcpService
	dnsTCP *tcpService
	dnsUDP *udpService
	self   *tcpService
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	requireRoot(t)
	f := &fixture{
		proxy: startTCP(t, "0.0.0.0:0", "proxy"),
		self:  startTCP(t, "0.0.0.0:0", "self"),
	}
	// The resolver listens on one port for UDP and TCP.
	for try := 0; ; try++ {
		f.dnsUDP = startUDP(t, "udp4", "0.0.0.0:0", "dns")
		ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", f.dnsUDP.port))
		if err == nil {
			ln.Close()
			f.dnsTCP = startTCP(t, ln.Addr().String(), "dnstcp")
			break
		}
		if try > 20 {
			t.Fatal(err)
		}
	}
	f.cfg = Config{
		Subnet:    testSubnet(t),
		ProxyPort: f.proxy.port,
		DNSPort:   f.dnsUDP.port,
		SelfPort:  f.self.port,
		Name:      testName(t),
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	name := f.cfg.Name
	t.Cleanup(func() {
		if err := Uninstall(name); err != nil {
			t.Errorf("uninstalling %s: %v", name, err)
		}
	})
	m, err := New(f.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.m = m
	t.Cleanup(func() { m.Close() })
	return f
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// sandboxNS is a stand-in sandbox: a process in new user and network
// namespaces, as the runtime's guests are, and an fd of its netns.
type sandboxNS struct {
	fd  int
	pid int
}

func newSandboxNS(t testing.TB) *sandboxNS {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1_900_000_000, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1_900_000_000, Size: 1}},
	}
	// Dies with the test binary, not with the thread that started it
	// (inNS ends threads).
	done, err := deathsig.Start(cmd)
	if err != nil {
		t.Fatalf("starting a stand-in sandbox: %v", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		cmd.Process.Kill()
		<-done
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(fd)
		cmd.Process.Kill()
		<-done
	})
	// The guest brings its loopback up; so does the stand-in.
	var lerr error
	inNS(t, fd, func() {
		if lo, err := netlink.LinkByName("lo"); err != nil {
			lerr = err
		} else {
			lerr = netlink.LinkSetUp(lo)
		}
	})
	if lerr != nil {
		t.Fatalf("setting lo up: %v", lerr)
	}
	return &sandboxNS{fd: fd, pid: cmd.Process.Pid}
}

// plainNetns makes a bare network namespace and returns an fd of it (no
// process, no user namespace: cheap, for benchmarks).
func plainNetns(tb testing.TB) int {
	tb.Helper()
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
		tb.Fatal(r.err)
	}
	return r.fd
}

// inNS runs fn on a thread inside the netns fd (sockets fn makes belong to
// that netns). The thread is never unlocked, so it ends with fn.
func inNS(t testing.TB, fd int, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		fn()
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("entering netns: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("code inside the netns did not finish")
	}
}

// dialTCP connects to addr and returns the first line the server sends.
func dialTCP(addr string) (string, error) {
	c, err := net.DialTimeout("tcp4", addr, waitOK)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitOK))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// udpExchange sends payload to addr from a connected socket and returns
// the answer.
func udpExchange(addr, payload string, wait time.Duration) (string, error) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte(payload)); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// sendRaw sends hand-made Ethernet frames out of the sandbox's eth0 to the
// host side's MAC, as sandbox code with CAP_NET_RAW could. Must run inside
// the sandbox's netns.
func sendRaw(dst net.HardwareAddr, ethertype uint16, packets ...[]byte) error {
	l, err := netlink.LinkByName(SandboxIf)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(ethertype)))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Protocol: htons(ethertype), Ifindex: l.Attrs().Index, Halen: 6}
	copy(sa.Addr[:], dst)
	for _, p := range packets {
		frame := append(append(append([]byte{}, dst...), l.Attrs().HardwareAddr...), byte(ethertype>>8), byte(ethertype))
		if err := unix.Sendto(fd, append(frame, p...), 0, sa); err != nil {
			return err
		}
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// udp4 builds an IPv4 UDP packet.
func udp4(src, dst netip.AddrPort, payload string) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload) // checksum 0: none, valid for IPv4
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	ip[6] = 0x40 // DF
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip, 0))
	return append(ip, udp...)
}

// udp6 builds an IPv6 UDP packet (with its mandatory checksum).
func udp6(src, dst netip.AddrPort, payload string) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	s, d := src.Addr().As16(), dst.Addr().As16()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, unix.IPPROTO_UDP)
	sum := checksum(append(pseudo, udp...), 0)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6] = unix.IPPROTO_UDP
	ip[7] = 64
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(ip, udp...)
}

func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// sniffer records IPv4 UDP packets to dst leaving the host on any
// interface but the sandboxes' (PACKET_OUTGOING, host netns).
type sniffer struct {
	fd   int
	dst  netip.AddrPort
	seen chan string
	done chan struct{}
}

func sniff(t testing.TB, dst netip.AddrPort, prefix string) *sniffer {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	s := &sniffer{fd: fd, dst: dst, seen: make(chan string, 16), done: make(chan struct{})}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		buf := make([]byte, 65536)
		for {
			select {
			case <-s.done:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			ll, ok := from.(*unix.SockaddrLinklayer)
			if !ok || ll.Pkttype != unix.PACKET_OUTGOING || n < 14+28 {
				continue
			}
			if l, err := netlink.LinkByIndex(ll.Ifindex); err == nil && strings.HasPrefix(l.Attrs().Name, prefix) {
				continue
			}
			p := buf[14:n]
			if binary.BigEndian.Uint16(buf[12:14]) != unix.ETH_P_IP || p[9] != unix.IPPROTO_UDP {
				continue
			}
			ihl := int(p[0]&0xf) * 4
			to := netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), binary.BigEndian.Uint16(p[ihl+2:]))
			if to == dst {
				select {
				case s.seen <- fmt.Sprintf("ifindex %d", ll.Ifindex):
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(s.done)
		<-stopped
		unix.Close(fd)
	})
	return s
}

// nftCounter returns the packets counted by the rule of table name whose
// comment contains what, read with the nft tool (tests only).
func nftCounter(t testing.TB, name, what string) int {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "inet", name).CombinedOutput()
	if err != nil {
		t.Skipf("nft: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, what) {
			continue
		}
		var pk int
		if i := strings.Index(line, "counter packets "); i >= 0 {
			fmt.Sscanf(line[i:], "counter packets %d", &pk)
			return pk
		}
	}
	t.Fatalf("no counted rule %q in table %s:\n%s", what, name, out)
	return 0
}

// waitGone waits for a host interface to disappear.
func waitGone(t testing.TB, name string) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < waitOK {
		_, err := netlink.LinkByName(name)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("interface %s still exists after %s", name, waitOK)
	return 0
}
