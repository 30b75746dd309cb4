package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/shrink"
)

// Manager wires sandboxes' network namespaces to the host. Its methods are
// safe for concurrent use.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	prefix string // cfg.Name + "-"

	host     netns.NsHandle  // the host's netns, to return to from a sandbox's
	hostIno  uint64          // its inode, to refuse attaching to it
	nl       *netlink.Handle // host netns, for Attach and Restore
	nlDelete *netlink.Handle // host netns, for the worker (a deletion holds its socket ~30 ms)
	probe    int             // a socket in the host netns, for the worker's SIOCGIFINDEX
	grace    time.Duration   // kernelGrace (tests lengthen it)

	mu     sync.RWMutex
	slots  *slots
	byID   map[string]Link
	byAddr map[netip.Addr]string
	making map[string]bool // ids being attached
	// names holds every host interface name this manager must not reuse:
	// attached, being made, being deleted, or found at start and not yet
	// restored.
	names map[string]bool
	// orphans are the "<Name>-*" interfaces found at start that no Restore
	// has claimed yet, by name, with their block (-1: none in the subnet).
	orphans map[string]int
	queue   []deletion
	closed  bool
	// byIDPeak, byAddrPeak, slotOfPeak and namesPeak are for shrink.Map.
	byIDPeak, byAddrPeak, slotOfPeak, namesPeak int

	// Slots (slot_linux.go): ready ones, those handed out and not yet
	// attached (by their namespace's inode), those attached (by sandbox),
	// and recycled ones waiting for their reset.
	ready      []*Slot
	lent       map[uint64]*Slot
	slotOf     map[string]*Slot
	resets     []*Slot
	slotWake   chan struct{}
	tcpMetrics uint16 // the tcp_metrics generic netlink family
	// quietResets counts the resets that found their slot untouched
	// since the last one (for tests).
	quietResets atomic.Int64
	// inflight counts Attach and Restore calls past the closed check:
	// Close waits for them before it closes the netlink handles.
	inflight sync.WaitGroup

	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// deletion is a host interface the worker sees gone (or deletes), then
// frees its block.
type deletion struct {
	name string
	slot int       // -1: no block to free
	at   time.Time // when it was queued
}

const (
	// closeDrain bounds how long Close keeps deleting interfaces still
	// queued; whatever is left is found and pruned by the next Manager.
	closeDrain = 5 * time.Second
	// kernelGrace is how long the worker leaves a queued interface to
	// the kernel, which deletes a veth pair with the network namespace
	// of its peer (once the sandbox's processes are gone), in batches
	// (one netns cleanup work for many): measured here, 20 pairs of dead
	// namespaces vanish within ~20 ms of each other, while deleting them
	// one by one costs ~30-50 ms each under the rtnl lock that every
	// Attach needs too. A pair still there after it is deleted here.
	kernelGrace = 500 * time.Millisecond
	// sweepEvery is how often the worker looks for queued interfaces the
	// kernel has deleted.
	sweepEvery = 20 * time.Millisecond
)

// New installs (or replaces) the nftables table, and finds the "<Name>-*"
// interfaces an earlier daemon left: their blocks stay taken until Restore
// claims them or Prune deletes them. It must be called from the host's
// network namespace (the daemon's own).
func New(cfg Config) (_ *Manager, retErr error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Manager{
		probe:   -1,
		grace:   kernelGrace,
		cfg:     cfg,
		log:     cfg.Logger.With("component", "network"),
		prefix:  cfg.Name + "-",
		slots:   newSlots(cfg.Subnet),
		byID:    map[string]Link{},
		byAddr:  map[netip.Addr]string{},
		making:  map[string]bool{},
		names:   map[string]bool{},
		orphans: map[string]int{},
		lent:    map[uint64]*Slot{},
		slotOf:  map[string]*Slot{},
		wake:    make(chan struct{}, 1),

		slotWake: make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	defer func() {
		if retErr != nil {
			m.release()
		}
	}()
	if m.host, err = netns.Get(); err != nil {
		return nil, fmt.Errorf("opening the host netns: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(m.host), &st); err != nil {
		return nil, fmt.Errorf("reading the host netns: %w", err)
	}
	m.hostIno = st.Ino
	if m.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	if m.nlDelete, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	if m.probe, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("opening a probe socket: %w", err)
	}
	if err := m.checkRoutes(); err != nil {
		return nil, err
	}
	if err := m.discover(); err != nil {
		return nil, err
	}
	if err := install(cfg); err != nil {
		return nil, err
	}
	m.tcpMetrics = lookupTCPMetrics()
	m.wg.Add(2)
	go m.worker()
	go m.slotWorker()
	return m, nil
}

// release closes the manager's handles.
func (m *Manager) release() {
	if m.nl != nil {
		m.nl.Close()
	}
	if m.nlDelete != nil {
		m.nlDelete.Close()
	}
	if m.probe >= 0 {
		unix.Close(m.probe)
	}
	if m.host.IsOpen() {
		m.host.Close()
	}
}

// checkRoutes refuses a subnet that overlaps a route the host has (other
// than the default route and this manager's own interfaces): sandboxes
// would shadow, or be shadowed by, part of the host's network.
func (m *Manager) checkRoutes() error {
	routes, err := m.nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue
		}
		dst, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		if !netip.PrefixFrom(dst, ones).Overlaps(m.cfg.Subnet) {
			continue
		}
		l, err := m.nl.LinkByIndex(r.LinkIndex)
		var gone netlink.LinkNotFoundError
		switch {
		case err == nil && strings.HasPrefix(l.Attrs().Name, m.prefix):
			continue
		case errors.As(err, &gone):
			continue // deleted since the list, its routes with it
		}
		dev := fmt.Sprintf("interface %d", r.LinkIndex)
		if err == nil {
			dev = l.Attrs().Name
		}
		return errdefs.Conflict("sandbox subnet %s overlaps the host's route to %s (on %s)", m.cfg.Subnet, r.Dst, dev)
	}
	return nil
}

// discover reserves the blocks and names of the "<Name>-*" interfaces that
// exist already.
func (m *Manager) discover() error {
	links, err := m.nl.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("listing links: %w", err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, m.prefix) {
			continue
		}
		slot := -1
		addrs, _ := m.nl.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
				if i, ok := m.slots.index(ip); ok && m.slots.link(i).HostAddr == ip {
					slot = i
					break
				}
			}
		}
		if slot >= 0 && m.slots.taken(slot) {
			slot = -1 // two interfaces with one block: only one may keep it
		}
		if slot >= 0 {
			m.slots.mark(slot)
		}
		m.names[name] = true
		m.orphans[name] = slot
	}
	return nil
}

// Attach wires the network namespace netnsFD (an fd of /proc/PID/ns/net,
// or a pidfd's PIDFD_GET_NET_NAMESPACE, owned by the caller) to the host as
// sandbox id: a veth pair with the host side "<Name>-<hash of id>" holding
// the lowest free /30's .1 and the sandbox side "eth0" holding its .2, both
// up, the default route via .1, and IPv6 disabled on eth0 and on any
// interface made later in that namespace. It fails with ErrConflict if id
// is attached already, ErrUnavailable if the subnet is full.
func (m *Manager) Attach(id string, netnsFD int) (_ Link, retErr error) {
	if id == "" {
		return Link{}, errdefs.Invalid("id", "empty")
	}
	var st unix.Stat_t
	if err := unix.Fstat(netnsFD, &st); err != nil {
		return Link{}, errdefs.Invalid("netns", "fd %d: %v", netnsFD, err)
	}
	if st.Ino == m.hostIno {
		return Link{}, errdefs.Invalid("netns", "fd %d is the host's network namespace", netnsFD)
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Link{}, fmt.Errorf("attaching %s: %w: network manager closed", id, errdefs.ErrUnavailable)
	}
	if _, ok := m.byID[id]; ok || m.making[id] {
		m.mu.Unlock()
		return Link{}, errdefs.Conflict("sandbox %s already has a network", id)
	}
	if s := m.lent[st.Ino]; s != nil {
		// A slot's namespace: wired already, it only changes hands.
		m.claimLocked(id, s)
		m.mu.Unlock()
		// The owner's id, for Restore after a daemon restart.
		hl := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.hostIndex, Name: s.link.HostIf}}
		if err := m.nl.LinkSetAlias(hl, id); err != nil {
			m.log.Warn("naming a slot's owner", "interface", s.link.HostIf, "err", err)
		}
		return s.link, nil
	}
	slot, ok := m.slots.take()
	if !ok {
		m.mu.Unlock()
		return Link{}, fmt.Errorf("attaching %s: %w: no free address in %s", id, errdefs.ErrUnavailable, m.cfg.Subnet)
	}
	m.making[id] = true
	m.inflight.Add(1)
	m.mu.Unlock()
	defer m.inflight.Done()

	l := m.slots.link(slot)
	defer func() {
		m.mu.Lock()
		delete(m.making, id)
		switch {
		case retErr == nil:
			m.byID[id] = l
			m.byAddr[l.SandboxAddr] = id
		case l.HostIf != "":
			// Half made: the worker deletes the veth, then frees the
			// name and the block.
			m.queue = append(m.queue, deletion{name: l.HostIf, slot: slot, at: time.Now()})
		default:
			m.slots.free(slot)
		}
		m.mu.Unlock()
		if retErr != nil && l.HostIf != "" {
			m.poke()
		}
	}()

	if err := m.addVeth(id, netnsFD, &l); err != nil {
		return Link{}, fmt.Errorf("attaching %s: %w", id, err)
	}
	if err := m.configure(id, netnsFD, l); err != nil {
		return Link{}, fmt.Errorf("attaching %s: %w", id, err)
	}
	return l, nil
}

// addVeth creates the pair, the peer directly inside the sandbox's netns,
// and sets l.HostIf. A host name already taken (a hash collision, or the
// same id's earlier interface still being deleted) is salted.
func (m *Manager) addVeth(id string, netnsFD int, l *Link) error {
	for salt := 0; salt < 8; salt++ {
		name := m.ifname(id, salt)
		m.mu.Lock()
		taken := m.names[name]
		if !taken {
			m.names[name] = true
		}
		m.mu.Unlock()
		if taken {
			continue
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		veth := &netlink.Veth{LinkAttrs: attrs, PeerName: SandboxIf, PeerNamespace: netlink.NsFd(netnsFD)}
		err := m.nl.LinkAdd(veth)
		if err == nil {
			l.HostIf = name
			return nil
		}
		if !errors.Is(err, unix.EEXIST) {
			m.mu.Lock()
			delete(m.names, name)
			m.mu.Unlock()
			return fmt.Errorf("creating veth %s: %w", name, err)
		}
		// EEXIST: either a host interface of that name we did not know
		// of (keep the name reserved), or an eth0 in the sandbox.
		if _, lerr := m.nl.LinkByName(name); lerr != nil {
			m.mu.Lock()
			delete(m.names, name)
			m.mu.Unlock()
			return errdefs.Conflict("the network namespace already has an %s", SandboxIf)
		}
	}
	return errdefs.Conflict("no free interface name for %s", id)
}

// ifname is the host-side name of id's interface: the prefix and as many
// hex digits of a hash of id (and salt, after a collision) as fit in
// IFNAMSIZ-1.
func (m *Manager) ifname(id string, salt int) string {
	s := id
	if salt > 0 {
		s = fmt.Sprintf("%s#%d", id, salt)
	}
	sum := sha256.Sum256([]byte(s))
	return m.prefix + hex.EncodeToString(sum[:])[:unix.IFNAMSIZ-1-len(m.prefix)]
}

// configure sets up both ends of l: the host side's sysctls, address and
// link state in the host netns, then the sandbox side from a thread inside
// the sandbox's netns.
func (m *Manager) configure(id string, netnsFD int, l Link) error {
	hl, err := m.nl.LinkByName(l.HostIf)
	if err != nil {
		return fmt.Errorf("finding %s: %w", l.HostIf, err)
	}
	// The owner's id, for Restore and for operators (ip link shows it).
	// The kernel ignores an alias given at creation. A slot gets its
	// owner's when one claims it.
	if id != "" {
		if err := m.nl.LinkSetAlias(hl, id); err != nil {
			return fmt.Errorf("naming %s's owner: %w", l.HostIf, err)
		}
	}
	// Before the link is up, so it never gets an IPv6 link-local address.
	for _, s := range []struct{ path, val string }{
		// No IPv6 at all on the host side: the kernel drops what a
		// sandbox crafts before any hook (the guard chain drops it too).
		{"ipv6/conf/" + l.HostIf + "/disable_ipv6", "1"},
		// Strict reverse-path filtering, as the guard chain's fib rule:
		// belt and braces against spoofed sources.
		{"ipv4/conf/" + l.HostIf + "/rp_filter", "1"},
		// Answer ARP only for the address on this interface, so a
		// sandbox cannot map the host's other addresses.
		{"ipv4/conf/" + l.HostIf + "/arp_ignore", "1"},
		// Source ARP requests from this interface's own address.
		{"ipv4/conf/" + l.HostIf + "/arp_announce", "2"},
	} {
		if err := writeSysctl(s.path, s.val); err != nil {
			return err
		}
	}
	if err := m.nl.AddrAdd(hl, &netlink.Addr{IPNet: ipNet(l.HostAddr, l.Prefix.Bits())}); err != nil {
		return fmt.Errorf("adding %s to %s: %w", l.HostAddr, l.HostIf, err)
	}
	if err := m.nl.LinkSetUp(hl); err != nil {
		return fmt.Errorf("setting %s up: %w", l.HostIf, err)
	}
	return m.inNetns(netnsFD, func() error {
		// default first: an interface made later in the sandbox gets no
		// IPv6 either. Loopback keeps ::1 (services bound to it, the
		// guest's port connects), which reaches nothing outside.
		for _, p := range []string{"ipv6/conf/default/disable_ipv6", "ipv6/conf/" + SandboxIf + "/disable_ipv6"} {
			if err := writeSysctl(p, "1"); err != nil {
				return err
			}
		}
		return addressSandboxSide(l)
	})
}

// addressSandboxSide gives the sandbox side of l, from a thread inside
// its netns, its address, link state and default route (again, when
// they are there already).
func addressSandboxSide(l Link) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening netlink in the sandbox: %w", err)
	}
	defer h.Close()
	sl, err := h.LinkByName(SandboxIf)
	if err != nil {
		return fmt.Errorf("finding the sandbox's %s: %w", SandboxIf, err)
	}
	if err := h.AddrReplace(sl, &netlink.Addr{IPNet: ipNet(l.SandboxAddr, l.Prefix.Bits())}); err != nil {
		return fmt.Errorf("adding %s to the sandbox's %s: %w", l.SandboxAddr, SandboxIf, err)
	}
	if err := h.LinkSetUp(sl); err != nil {
		return fmt.Errorf("setting the sandbox's %s up: %w", SandboxIf, err)
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: l.HostAddr.AsSlice()}); err != nil {
		return fmt.Errorf("adding the sandbox's default route: %w", err)
	}
	return nil
}

// Readdress gives the sandbox side of sandbox id's link, in network
// namespace netnsFD (its own), its address and default route again: a
// gVisor netstack that took the interface over took them off, and a
// kernel restored into the same namespace takes them from there.
func (m *Manager) Readdress(id string, netnsFD int) error {
	m.mu.Lock()
	l, ok := m.byID[id]
	m.mu.Unlock()
	if !ok {
		return errdefs.NotFound("sandbox network", id)
	}
	if err := m.inNetns(netnsFD, func() error { return addressSandboxSide(l) }); err != nil {
		return fmt.Errorf("readdressing %s: %w", id, err)
	}
	return nil
}

// inNetns runs fn on a thread inside the network namespace netnsFD. The
// thread returns to the host's netns afterwards; if it cannot, it stays
// locked, and the Go runtime ends it with its goroutine rather than reuse
// a thread in a sandbox's namespace.
func (m *Manager) inNetns(netnsFD int, fn func() error) error {
	return inNetns(netnsFD, int(m.host), fn)
}

// inNetns runs fn on a thread that entered network namespace netnsFD and
// then returns to back (the host's). A thread that cannot return stays
// locked and ends with its goroutine.
func inNetns(netnsFD, back int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(netnsFD, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering the sandbox's netns: %w", err)
			return
		}
		err := fn()
		if rerr := unix.Setns(back, unix.CLONE_NEWNET); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("returning to the host netns: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Restore registers a link that an earlier daemon attached, after checking
// that its host interface still exists, belongs to id and holds its
// address: Lookup answers for it again. ErrNotFound if it is gone.
func (m *Manager) Restore(id string, l Link) error {
	if id == "" {
		return errdefs.Invalid("id", "empty")
	}
	slot, err := m.slots.check(l)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("restoring %s: %w: network manager closed", id, errdefs.ErrUnavailable)
	}
	m.inflight.Add(1)
	m.mu.Unlock()
	defer m.inflight.Done()
	if !strings.HasPrefix(l.HostIf, m.prefix) {
		return errdefs.Invalid("link", "interface %q is not one of %s*", l.HostIf, m.prefix)
	}
	hl, err := m.nl.LinkByName(l.HostIf)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return errdefs.NotFound("host interface", l.HostIf)
		}
		return fmt.Errorf("restoring %s: finding %s: %w", id, l.HostIf, err)
	}
	if alias := hl.Attrs().Alias; alias != id {
		return fmt.Errorf("restoring %s: %w: host interface %s belongs to %q", id, errdefs.ErrNotFound, l.HostIf, alias)
	}
	addrs, err := m.nl.AddrList(hl, netlink.FAMILY_V4)
	// Another link's change during the dump interrupts it, its list maybe
	// incomplete: common on a busy host, and no reason to lose a sandbox.
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 10; try++ {
		addrs, err = m.nl.AddrList(hl, netlink.FAMILY_V4)
	}
	if err != nil {
		return fmt.Errorf("restoring %s: listing addresses: %w", id, err)
	}
	found := false
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == l.HostAddr && ones == l.Prefix.Bits() {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("restoring %s: %w: host interface %s no longer holds %s", id, errdefs.ErrNotFound, l.HostIf, l.HostAddr)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.byID[id]; ok {
		if cur == l {
			return nil
		}
		return errdefs.Conflict("sandbox %s already has network %s", id, cur)
	}
	if m.making[id] {
		return errdefs.Conflict("sandbox %s is being attached", id)
	}
	if other, ok := m.byAddr[l.SandboxAddr]; ok {
		return errdefs.Conflict("address %s belongs to sandbox %s", l.SandboxAddr, other)
	}
	if orphan, ok := m.orphans[l.HostIf]; ok {
		if orphan != slot && orphan >= 0 {
			m.slots.free(orphan)
		}
		delete(m.orphans, l.HostIf)
	} else if m.names[l.HostIf] || m.slots.taken(slot) {
		return errdefs.Conflict("interface %s or block %s is in use", l.HostIf, l.Prefix)
	}
	m.slots.mark(slot)
	m.names[l.HostIf] = true
	m.byID[id] = l
	m.byAddr[l.SandboxAddr] = id
	return nil
}

// Prune deletes, in the background, the "<Name>-*" interfaces found at
// start that no Restore claimed (their sandboxes are gone or unknown), and
// returns how many. The daemon calls it once every running sandbox has been
// restored.
func (m *Manager) Prune() int {
	m.mu.Lock()
	n := 0
	for name, slot := range m.orphans {
		delete(m.orphans, name)
		m.queue = append(m.queue, deletion{name: name, slot: slot, at: time.Now()})
		n++
	}
	m.mu.Unlock()
	if n > 0 {
		m.poke()
	}
	return n
}

// Detach forgets sandbox id at once (Lookup no longer answers for it) and
// hands its host interface to the background worker, which frees its
// address once the interface is gone: a dead sandbox's netns takes its
// veth pair with it, and one still there after kernelGrace is deleted.
// It does no system call.
func (m *Manager) Detach(id string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("detaching %s: %w: network manager closed", id, errdefs.ErrUnavailable)
	}
	l, ok := m.byID[id]
	if !ok {
		m.mu.Unlock()
		return errdefs.NotFound("sandbox network", id)
	}
	s, slotted := m.slotOf[id]
	m.forgetLocked(id, l.SandboxAddr)
	if slotted {
		m.mu.Unlock()
		m.destroySlot(s)
		return nil
	}
	slot, _ := m.slots.index(l.Prefix.Addr())
	m.queue = append(m.queue, deletion{name: l.HostIf, slot: slot, at: time.Now()})
	m.mu.Unlock()
	m.poke()
	return nil
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// worker frees the blocks of queued interfaces once they are gone. Most
// go with their sandbox's network namespace, which the kernel cleans up
// in batches; the worker only looks (SIOCGIFINDEX, no netlink dump) every
// sweepEvery. Those still there after kernelGrace it deletes, one at a
// time: deletions serialise on the kernel's rtnl lock anyway, and one
// goroutine bounds what a burst of them costs the host.
func (m *Manager) worker() {
	defer m.wg.Done()
	var deadline time.Time // set once Close asks the worker to stop
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		if deadline.IsZero() {
			select {
			case <-m.stop:
				deadline = time.Now().Add(closeDrain)
			default:
			}
		}
		m.mu.Lock()
		pending := append([]deletion(nil), m.queue...)
		m.mu.Unlock()
		if len(pending) == 0 {
			if !deadline.IsZero() {
				return
			}
			select {
			case <-m.wake:
			case <-m.stop:
			}
			continue
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			m.log.Warn("leaving interfaces for the next start to prune", "first", pending[0].name)
			return
		}
		var gone, stale []deletion
		for _, d := range pending {
			switch {
			case !m.exists(d.name):
				gone = append(gone, d)
			case !deadline.IsZero() || time.Since(d.at) > m.grace:
				stale = append(stale, d)
			}
		}
		// One explicit deletion per sweep: those the kernel deletes
		// meanwhile are not waited for behind it.
		if len(gone) == 0 && len(stale) > 0 {
			if m.delete(stale[0]) {
				gone = append(gone, stale[0])
			}
		}
		if len(gone) > 0 {
			m.free(gone)
			continue
		}
		select {
		case <-tick.C:
		case <-m.wake:
		case <-m.stop:
		}
	}
}

// free hands the blocks of gone interfaces back, once the host keeps
// nothing of their sandboxes' addresses: their elements in the table's
// per-sandbox sets (connection counts, DNS rate) and their conntrack
// entries (connections to the proxy that the dead sandbox left open) go
// first, so that the next sandbox given an address starts afresh. A
// failure is logged: what it leaves expires or is collected by the kernel.
func (m *Manager) free(gone []deletion) {
	var addrs []netip.Addr
	for _, d := range gone {
		if d.slot >= 0 {
			addrs = append(addrs, m.slots.link(d.slot).SandboxAddr)
		}
	}
	if len(addrs) > 0 {
		if err := forgetAddrs(m.cfg.Name, addrs); err != nil {
			m.log.Warn("removing sandboxes' set elements", "count", len(addrs), "err", err)
		}
		if err := forgetConntrack(m.nlDelete, addrs); err != nil {
			m.log.Warn("removing sandboxes' conntrack entries", "count", len(addrs), "err", err)
		}
	}
	for _, d := range gone {
		m.done(d)
	}
}

// exists reports whether the host has an interface named name (an error
// other than ENODEV counts as yes: the explicit deletion finds out).
func (m *Manager) exists(name string) bool {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return true
	}
	err = unix.IoctlIfreq(m.probe, unix.SIOCGIFINDEX, ifr)
	return !errors.Is(err, unix.ENODEV)
}

// forgetLocked removes sandbox id, whose sandbox address is addr, from
// the maps of attached sandboxes; m.mu is held. A map that held a
// thousand sandboxes is copied once it holds a quarter of that (issue
// 21: the daemon's memory after they are removed).
func (m *Manager) forgetLocked(id string, addr netip.Addr) {
	delete(m.byID, id)
	delete(m.byAddr, addr)
	delete(m.slotOf, id)
	m.byID = shrink.Map(m.byID, &m.byIDPeak)
	m.byAddr = shrink.Map(m.byAddr, &m.byAddrPeak)
	m.slotOf = shrink.Map(m.slotOf, &m.slotOfPeak)
}

// done frees the name and block of d, whose interface is gone, and takes
// it off the queue.
func (m *Manager) done(d deletion) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unqueueLocked(d.name)
	delete(m.names, d.name)
	m.names = shrink.Map(m.names, &m.namesPeak)
	if d.slot >= 0 {
		m.slots.free(d.slot)
	}
}

// unqueueLocked takes the interface name off the queue; m.mu is held.
func (m *Manager) unqueueLocked(name string) {
	for i, q := range m.queue {
		if q.name == name {
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
			return
		}
	}
}

// delete removes d's interface, retrying a failure twice, and reports
// whether it is gone. An interface that cannot be deleted keeps its name
// and block, and leaves the queue: a leak is better than two sandboxes
// with one address.
func (m *Manager) delete(d deletion) bool {
	var err error
	for attempt, wait := 0, 100*time.Millisecond; attempt < 3; attempt, wait = attempt+1, wait*10 {
		if attempt > 0 {
			time.Sleep(wait)
		}
		var l netlink.Link
		l, err = m.nlDelete.LinkByName(d.name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				err = nil
			}
			break
		}
		if err = m.nlDelete.LinkDel(l); err == nil || errors.Is(err, unix.ENODEV) {
			err = nil
			break
		}
	}
	if err != nil {
		m.log.Error("deleting a sandbox interface; its address stays reserved", "interface", d.name, "err", err)
		m.mu.Lock()
		m.unqueueLocked(d.name)
		m.mu.Unlock()
		return false
	}
	return true
}

// Lookup returns the sandbox whose address addr is: the peer address of a
// connection or query that arrived from a sandbox. It is a map read.
func (m *Manager) Lookup(addr netip.Addr) (id string, ok bool) {
	m.mu.RLock()
	id, ok = m.byAddr[addr.Unmap()]
	m.mu.RUnlock()
	return id, ok
}

// HostSide reports whether a is the host side (.1) of a block of the
// sandboxes' subnet: where paddock's services answer the sandbox that
// holds the block, attached now or not.
func (m *Manager) HostSide(a netip.Addr) bool {
	a = a.Unmap()
	i, ok := m.slots.index(a)
	return ok && m.slots.link(i).HostAddr == a
}

// Link returns sandbox id's link.
func (m *Manager) Link(id string) (Link, bool) {
	m.mu.RLock()
	l, ok := m.byID[id]
	m.mu.RUnlock()
	return l, ok
}

// Links returns every attached or restored link, by sandbox id.
func (m *Manager) Links() map[string]Link {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make(map[string]Link, len(m.byID))
	for id, l := range m.byID {
		out[id] = l
	}
	return out
}

// Close stops the worker, after it has deleted what is queued (for at most
// closeDrain). The table and the links stay: running sandboxes keep their
// wiring and rules across a daemon restart.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.inflight.Wait()
	close(m.stop)
	m.wg.Wait()
	// Ready and recycled slots go with their descriptors (those of
	// running sandboxes with their processes).
	m.mu.Lock()
	idle := append(m.ready, m.resets...)
	m.ready, m.resets = nil, nil
	m.mu.Unlock()
	for _, s := range idle {
		for _, fd := range []int{s.sysfs, s.ns} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	m.release()
	return nil
}

// Uninstall deletes the nftables table named name and every "<name>-*"
// interface, at once: paddock's network is gone from the host. For tests
// and for removing paddock; no Manager of that name may be running.
func Uninstall(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid("name", "%q must be 1 to 8 lower-case letters or digits", name)
	}
	var errs []error
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		errs = append(errs, fmt.Errorf("listing links: %w", err))
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, name+"-") {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if err := deleteTable(name); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// writeSysctl writes val to /proc/sys/net/<path>, in the netns of the
// calling thread.
func writeSysctl(path, val string) error {
	f, err := os.OpenFile("/proc/sys/net/"+path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("setting net.%s: %w", strings.ReplaceAll(path, "/", "."), err)
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("setting net.%s: %w", strings.ReplaceAll(path, "/", "."), err)
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}
