package network

import (
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tenantUID is the host uid root of a stand-in tenant maps to.
const tenantUID = 1_900_000_000

// runTenant runs script (sh) as a stand-in sandbox in slot s, forked as
// the forker forks a guest: into a user namespace of its own, whose root
// has every capability there, from a thread inside the slot's network
// namespace (which it inherits, and does not own). It returns the
// script's output once it has exited.
func runTenant(t *testing.T, s *Slot, script string) string {
	t.Helper()
	type res struct {
		out []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Setns(s.FD(), unix.CLONE_NEWNET); err != nil {
			ch <- res{err: err}
			return
		}
		cmd := exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: tenantUID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: tenantUID, Size: 1}},
			Credential:  &syscall.Credential{Uid: 0, Gid: 0},
			Pdeathsig:   unix.SIGKILL,
		}
		out, err := cmd.CombinedOutput()
		ch <- res{out, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("tenant: %v: %s", r.err, r.out)
		}
		return string(r.out)
	case <-time.After(30 * time.Second):
		t.Fatal("the tenant did not finish")
		return ""
	}
}

// takeAttached takes a slot and attaches it as sandbox id, as the runtime
// does once its guest is forked into it.
func takeAttached(t *testing.T, m *Manager, id string) (*Slot, Link) {
	t.Helper()
	s, err := m.TakeSlot()
	if err != nil {
		t.Fatalf("TakeSlot: %v", err)
	}
	l, err := m.Attach(id, s.FD())
	if err != nil {
		t.Fatalf("Attach(%s) of a slot: %v", id, err)
	}
	if l != s.link {
		t.Fatalf("Attach gave %s, want the slot's %s", l, s.link)
	}
	return s, l
}

// A tenant, root with every capability in its own user namespace, can
// change nothing of its slot: the host's user namespace owns it. What it
// may do there works: bind a port below 1024, open an ICMP echo socket.
func TestSlotTenantCannotReconfigure(t *testing.T) {
	f := newFixture(t)
	s, l := takeAttached(t, f.m, "tenant")
	tries := []string{
		"ip link set eth0 mtu 1280",
		"ip link set eth0 address 02:00:00:00:00:01",
		"ip link set eth0 down",
		"ip addr add 10.99.0.1/32 dev lo",
		"ip addr del " + l.SandboxAddr.String() + "/30 dev eth0",
		"ip route add 192.0.2.0/24 via " + l.HostAddr.String(),
		"ip route del default",
		"ip link add d0 type dummy",
		"ip tuntap add t0 mode tun",
		"ip neigh replace " + l.HostAddr.String() + " lladdr 02:00:00:00:00:02 dev eth0",
		"tc qdisc add dev eth0 root netem delay 100ms",
		"echo 1 > /proc/sys/net/ipv4/ip_forward",
		"echo 1 > /proc/sys/net/ipv4/tcp_max_tw_buckets",
		"echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6",
		"echo '0 0' > /proc/sys/net/ipv4/ping_group_range",
	}
	var script strings.Builder
	for _, c := range tries {
		fmt.Fprintf(&script, "if %s 2>/dev/null; then echo 'CHANGED: %s'; fi\n", c, strings.ReplaceAll(c, "'", ""))
	}
	// What a sandbox may do.
	script.WriteString(`/usr/bin/python3 -c '
import socket
s = socket.socket(); s.bind(("0.0.0.0", 80)); print("bound 80")
socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print("icmp socket")
'`)
	out := runTenant(t, s, script.String())
	if strings.Contains(out, "CHANGED") {
		t.Errorf("the tenant changed its slot:\n%s", out)
	}
	if !strings.Contains(out, "bound 80") || !strings.Contains(out, "icmp socket") {
		t.Errorf("the tenant could not bind port 80 or open an ICMP echo socket:\n%s", out)
	}
}

// A recycled slot comes back to the next tenant as new: what the previous
// one left (connections through the proxy, which the host keeps conntrack
// entries and set elements of, a neighbour entry, sockets of a connection
// it closed first, which TIME_WAIT would keep) is gone, and its address
// names the new sandbox only once that one attaches.
func TestSlotRecycle(t *testing.T) {
	f := newFixture(t)
	s, l := takeAttached(t, f.m, "first")
	if err := writeSysctl("ipv4/conf/"+l.HostIf+"/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	out := runTenant(t, s, fmt.Sprintf(`/usr/bin/python3 -c '
import socket
c = socket.create_connection(("203.0.113.5", 1000), timeout=3); print(c.recv(100).decode().strip())
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(("127.0.0.1", 7777)); srv.listen()
c = socket.create_connection(("127.0.0.1", 7777)); a, _ = srv.accept(); c.close(); a.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"q", ("%s", 53))
'`, l.HostAddr))
	t.Logf("first tenant: %s", out)
	expectHit(t, "tcp", f.proxy.hits)
	if left := addrTraces(t, f.cfg.Name, l.SandboxAddr); len(left) == 0 {
		t.Fatal("the first tenant left nothing on the host to test with")
	}
	if n := neighbours(t, s); n == 0 {
		t.Fatal("the first tenant left no neighbour entry to test with")
	}

	if err := f.m.Recycle("first"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.m.Lookup(l.SandboxAddr); ok {
		t.Error("the recycled slot's address still names the first sandbox")
	}
	waitReady(t, f.m, s)
	next, err := f.m.TakeSlot()
	if err != nil {
		t.Fatal(err)
	}
	if next != s {
		t.Fatalf("TakeSlot gave %s, want the recycled %s", next.link, s.link)
	}
	if _, ok := f.m.Lookup(l.SandboxAddr); ok {
		t.Error("a slot's address names a sandbox before one attaches")
	}
	if left := addrTraces(t, f.cfg.Name, l.SandboxAddr); len(left) > 0 {
		t.Errorf("the host keeps %v of the first tenant", left)
	}
	if n := neighbours(t, s); n > 0 {
		t.Errorf("%d neighbour entries of the first tenant left", n)
	}
	// The sockets apart from the link: a random MAC address may hold
	// ":53" (a CI run failed on one that did).
	socks := runTenant(t, s, `ss -Htan; ss -Huan; ss -Hxa`)
	if strings.Contains(socks, "7777") || strings.Contains(socks, ":53") {
		t.Errorf("the next tenant sees the first one's sockets:\n%s", socks)
	}
	out = runTenant(t, s, `ip -4 -o addr show dev eth0; ip link show eth0`)
	if !strings.Contains(out, l.SandboxAddr.String()+"/30") || !strings.Contains(out, "mtu 1500") {
		t.Errorf("the recycled slot is not as made:\n%s", out)
	}
	if got, err := f.m.Attach("second", s.FD()); err != nil || got != l {
		t.Fatalf("Attach(second) = %s, %v; want %s", got, err, l)
	}
	if id, _ := f.m.Lookup(l.SandboxAddr); id != "second" {
		t.Errorf("the slot's address names %q, want second", id)
	}
	if hl, err := netlink.LinkByName(l.HostIf); err != nil || hl.Attrs().Alias != "second" {
		t.Errorf("host side %s: alias %v, %v; want second", l.HostIf, hl, err)
	}
}

// A slot whose tenant moved no packet and left no socket is reset by a
// look at its counters alone; the next tenant that does make traffic is
// still cleaned up after in full.
func TestSlotQuietReset(t *testing.T) {
	f := newFixture(t)
	recycle := func(id string, s *Slot) {
		t.Helper()
		if err := f.m.Recycle(id); err != nil {
			t.Fatal(err)
		}
		waitReady(t, f.m, s)
		next, err := f.m.TakeSlot()
		if err != nil {
			t.Fatal(err)
		}
		if next != s {
			t.Fatalf("TakeSlot gave %s, want the recycled %s", next.link, s.link)
		}
	}
	s, l := takeAttached(t, f.m, "a")
	runTenant(t, s, "true")
	recycle("a", s) // the first reset of a slot is a full one
	quiet := f.m.quietResets.Load()
	if _, err := f.m.Attach("b", s.FD()); err != nil {
		t.Fatal(err)
	}
	runTenant(t, s, "true")
	recycle("b", s)
	if got := f.m.quietResets.Load(); got != quiet+1 {
		t.Fatalf("quiet resets %d → %d after a tenant that moved no packet, want one more", quiet, got)
	}
	if _, err := f.m.Attach("c", s.FD()); err != nil {
		t.Fatal(err)
	}
	if err := writeSysctl("ipv4/conf/"+l.HostIf+"/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	runTenant(t, s, fmt.Sprintf(`/usr/bin/python3 -c '
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"q", ("%s", 53))
'`, l.HostAddr))
	if n := neighbours(t, s); n == 0 {
		t.Fatal("the noisy tenant left no neighbour entry to test with")
	}
	recycle("c", s)
	if got := f.m.quietResets.Load(); got != quiet+1 {
		t.Errorf("the reset after a tenant that sent a packet was a quiet one")
	}
	if n := neighbours(t, s); n > 0 {
		t.Errorf("%d neighbour entries of the noisy tenant left", n)
	}
	if left := addrTraces(t, f.cfg.Name, l.SandboxAddr); len(left) > 0 {
		t.Errorf("the host keeps %v of the noisy tenant", left)
	}
	s.Close()
}

// A slot whose reset fails is destroyed, never handed out again: here a
// socket held outside the sandbox (by this test, as a process that
// escaped the sandbox's cgroup would) keeps a listener in it.
func TestSlotResetFailureDestroys(t *testing.T) {
	f := newFixture(t)
	s, l := takeAttached(t, f.m, "leaky")
	var ln net.Listener
	inNS(t, s.FD(), func() {
		var err error
		if ln, err = net.Listen("tcp4", "127.0.0.1:8080"); err != nil {
			t.Error(err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	defer ln.Close()
	if err := f.m.Recycle("leaky"); err != nil {
		t.Fatal(err)
	}
	// Destroyed: its host interface is queued for deletion.
	deadline := time.Now().Add(waitOK)
	for !queued(f.m, l.HostIf) {
		if time.Now().After(deadline) {
			t.Fatal("the slot with a socket left was not destroyed")
		}
		time.Sleep(time.Millisecond)
	}
	f.m.mu.Lock()
	for _, r := range f.m.ready {
		if r == s {
			t.Error("the slot with a socket left is ready for another tenant")
		}
	}
	f.m.mu.Unlock()
	next, err := f.m.TakeSlot()
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if next.link.Prefix == l.Prefix {
		t.Errorf("the next slot has the destroyed one's block %s while its interface exists", l.Prefix)
	}
}

// A slot handed out and closed without an Attach is destroyed; Detach of
// an attached one destroys it too.
func TestSlotCloseAndDetachDestroy(t *testing.T) {
	f := newFixture(t)
	s, err := f.m.TakeSlot()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, l := takeAttached(t, f.m, "detached")
	if err := f.m.Detach("detached"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{s.link.HostIf, l.HostIf} {
		waitGone(t, name)
	}
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if len(f.m.ready) != 0 || len(f.m.lent) != 0 || len(f.m.slotOf) != 0 {
		t.Errorf("slots kept: %d ready, %d lent, %d attached", len(f.m.ready), len(f.m.lent), len(f.m.slotOf))
	}
}

// TrimSlots destroys the recycled slots kept beyond those made ahead
// (none here), as after a mass removal.
func TestSlotTrim(t *testing.T) {
	f := newFixture(t)
	var slots []*Slot
	for i := range 3 {
		s, _ := takeAttached(t, f.m, fmt.Sprint("trim", i))
		slots = append(slots, s)
	}
	for i, s := range slots {
		if err := f.m.Recycle(fmt.Sprint("trim", i)); err != nil {
			t.Fatal(err)
		}
		waitReady(t, f.m, s)
	}
	if n := f.m.TrimSlots(); n != len(slots) {
		t.Errorf("TrimSlots destroyed %d slots, want %d", n, len(slots))
	}
	for _, s := range slots {
		waitGone(t, s.link.HostIf)
	}
	f.m.mu.Lock()
	ready := len(f.m.ready)
	f.m.mu.Unlock()
	if ready != 0 {
		t.Errorf("%d slots ready after TrimSlots, want 0", ready)
	}
	if n := f.m.TrimSlots(); n != 0 {
		t.Errorf("a second TrimSlots destroyed %d slots", n)
	}
}

func neighbours(t *testing.T, s *Slot) int {
	t.Helper()
	var n int
	inNS(t, s.FD(), func() {
		l, err := netlink.NeighList(0, netlink.FAMILY_ALL)
		if err != nil {
			t.Error(err)
		}
		n = len(l)
	})
	return n
}

func waitReady(t *testing.T, m *Manager, s *Slot) {
	t.Helper()
	deadline := time.Now().Add(waitOK)
	for {
		m.mu.Lock()
		for _, r := range m.ready {
			if r == s {
				m.mu.Unlock()
				return
			}
		}
		m.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the recycled slot never became ready")
		}
		time.Sleep(time.Millisecond)
	}
}

func queued(m *Manager, name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.queue {
		if d.name == name {
			return true
		}
	}
	return false
}

// noSockets sees any socket in the namespace, bound or not, and none in
// a new one.
func TestNoSockets(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name   string
		domain int
		typ    int
		want   bool
	}{
		{"none", -1, 0, true},
		{"unbound udp", unix.AF_INET, unix.SOCK_DGRAM, false},
		{"unix", unix.AF_UNIX, unix.SOCK_STREAM, false},
		{"tcp6", unix.AF_INET6, unix.SOCK_STREAM, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bool
			var err error
			inNS(t, plainNetns(t), func() {
				if tc.domain >= 0 {
					fd, serr := unix.Socket(tc.domain, tc.typ|unix.SOCK_CLOEXEC, 0)
					if serr != nil {
						err = serr
						return
					}
					defer unix.Close(fd)
				}
				got, err = noSockets()
			})
			if err != nil || got != tc.want {
				t.Errorf("noSockets() = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
