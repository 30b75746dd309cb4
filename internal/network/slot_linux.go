package network

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A Slot is a network namespace the Manager made ahead of time, wired to
// the host (the veth pair, both addresses, the default route) and set up
// (loopback up, ICMP echo sockets for every group, every port bindable,
// no IPv6 on eth0). A guest is forked into it instead of a namespace of
// its own; Attach, given the namespace, only records whose it is.
//
// The host's user namespace owns it, not the sandbox's: root in the
// sandbox has no CAP_NET_ADMIN over it (nor does the guest), so nothing
// in the sandbox can change its interfaces, addresses, routes, sysctls,
// qdiscs, rules or neighbours, or add a device. What a sandbox can leave
// in it is what unprivileged code can: sockets (all closed with their
// processes but TCP ones the kernel finishes: orphans, which reset
// destroys, and TIME_WAIT, which the slot never keeps), its kernel's TCP
// metrics and neighbour entries (reset flushes them), and counters
// (interface and SNMP statistics, which no kernel interface resets: the
// next sandbox can read how many packets and bytes the slot's earlier
// sandboxes moved, nothing else of them).
//
// Recycle hands a slot whose sandbox's processes are gone back to the
// Manager, which resets it (reset) and gives it to the next guest; a slot
// whose reset fails, or that was detached rather than recycled, is
// destroyed: its namespace and veth pair go with the last reference.
type Slot struct {
	m     *Manager
	ns    int // the namespace, owned by the slot
	sysfs int // a detached read-only sysfs mount made in it
	ino   uint64
	block int
	link  Link
	// captured: a sandbox had its egress captured in it (SetCapture),
	// which reset undoes.
	captured bool
	// hostIndex is the host side's interface index, for naming the
	// slot's owner without looking the interface up.
	hostIndex int
	// counters is its interfaces' counters (/proc/net/dev read in it) as
	// the last reset left them; nil until a reset has run.
	counters []byte
}

// FD is the slot's network namespace, open while the slot is.
func (s *Slot) FD() int { return s.ns }

// Sysfs returns a new detached, read-only sysfs mount of the slot's
// namespace, for the guest's /sys: a user namespace that does not own the
// network namespace may not mount sysfs itself. The caller closes it.
func (s *Slot) Sysfs() (int, error) {
	fd, err := unix.OpenTree(s.sysfs, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err == nil {
		return fd, nil
	}
	// Kernels before 6.15 clone no detached mount: make another in it.
	var fresh int
	err = s.m.inNetns(s.ns, func() error {
		var err error
		fresh, err = mountSysfs()
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("mounting sysfs for the slot's namespace: %w", err)
	}
	return fresh, nil
}

// Close destroys a slot that no Attach claimed (its guest never became a
// sandbox). A claimed slot belongs to its sandbox: Close does nothing.
func (s *Slot) Close() {
	m := s.m
	m.mu.Lock()
	if m.lent[s.ino] != s {
		m.mu.Unlock()
		return
	}
	delete(m.lent, s.ino)
	m.mu.Unlock()
	m.destroySlot(s)
}

// TakeSlot hands out a ready slot, or makes one now if none is ready. The
// caller forks a guest into it and Attaches it, or Closes it.
func (m *Manager) TakeSlot() (*Slot, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: network manager closed", errdefs.ErrUnavailable)
	}
	var s *Slot
	if n := len(m.ready); n > 0 {
		s = m.ready[n-1]
		m.ready[n-1] = nil
		m.ready = m.ready[:n-1]
		m.lent[s.ino] = s
	}
	m.inflight.Add(1)
	m.mu.Unlock()
	defer m.inflight.Done()
	m.pokeSlots()
	if s != nil {
		return s, nil
	}
	s, err := m.makeSlot()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.lent[s.ino] = s
	m.mu.Unlock()
	return s, nil
}

// Recycle is Detach for a sandbox whose processes are known to be gone
// (its cgroup was removed): a slot it was attached through is reset and
// made ready for another guest instead of destroyed. Without a slot it is
// Detach.
func (m *Manager) Recycle(id string) error {
	m.mu.Lock()
	s, ok := m.slotOf[id]
	if !ok || m.closed {
		m.mu.Unlock()
		return m.Detach(id)
	}
	m.forgetLocked(id, s.link.SandboxAddr)
	m.resets = append(m.resets, s)
	m.mu.Unlock()
	m.pokeSlots()
	return nil
}

// claimLocked attaches lent slot s to sandbox id; m.mu is held.
func (m *Manager) claimLocked(id string, s *Slot) {
	delete(m.lent, s.ino)
	m.slotOf[id] = s
	m.byID[id] = s.link
	m.byAddr[s.link.SandboxAddr] = id
}

// slotWorker resets recycled slots and keeps cfg.Slots of them ready.
func (m *Manager) slotWorker() {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		var s *Slot
		if len(m.resets) > 0 {
			// Popped without leaving s in the backing array, which
			// would keep a slot destroyed below (and its names)
			// alive until the array is outgrown (issue 21).
			s = m.resets[0]
			m.resets[0] = nil
			if m.resets = m.resets[1:]; len(m.resets) == 0 {
				m.resets = nil
			}
		}
		short := len(m.ready) < m.cfg.Slots
		m.mu.Unlock()
		switch {
		case s != nil:
			m.recycle(s)
		case short:
			s, err := m.makeSlot()
			if err != nil {
				m.log.Warn("making a network slot", "err", err)
				if !m.sleep(time.Second) {
					return
				}
				continue
			}
			if !m.keep(s) {
				m.destroySlot(s)
			}
		default:
			select {
			case <-m.slotWake:
			case <-m.stop:
				return
			}
		}
		select {
		case <-m.stop:
			return
		default:
		}
	}
}

// sleep waits d, or until Close; it reports whether to go on.
func (m *Manager) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-m.stop:
		return false
	}
}

// keep puts slot s among the ready ones, unless they are enough.
func (m *Manager) keep(s *Slot) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || len(m.ready) >= m.cfg.MaxSlots {
		return false
	}
	m.ready = append(m.ready, s)
	return true
}

// TrimSlots destroys the ready slots beyond the Slots kept ahead, and
// the recycled ones waiting for their reset that would go beyond them,
// and returns how many. Up to MaxSlots are kept so that churn reuses
// them, but after a mass removal they are what is left of the
// sandboxes: a network namespace each (about 0.3 MiB of the kernel's
// memory), and their Go objects, made while the sandboxes were, keep
// that much of the daemon's heap in use (issue 21).
func (m *Manager) TrimSlots() int {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return 0
	}
	var extra []*Slot
	if n := len(m.ready); n > m.cfg.Slots {
		extra = append(extra, m.ready[m.cfg.Slots:]...)
		m.ready = append([]*Slot(nil), m.ready[:m.cfg.Slots]...)
	}
	if keep := max(m.cfg.Slots-len(m.ready), 0); len(m.resets) > keep {
		extra = append(extra, m.resets[keep:]...)
		m.resets = append([]*Slot(nil), m.resets[:keep]...)
	}
	m.mu.Unlock()
	for _, s := range extra {
		m.destroySlot(s)
	}
	return len(extra)
}

// recycle resets s and keeps it, or destroys it.
func (m *Manager) recycle(s *Slot) {
	m.mu.Lock()
	full := len(m.ready) >= m.cfg.MaxSlots
	m.mu.Unlock()
	if full {
		m.destroySlot(s) // not worth its reset
		return
	}
	if err := m.reset(s); err != nil {
		m.log.Warn("destroying a network slot that could not be reset", "interface", s.link.HostIf, "err", err)
		m.destroySlot(s)
		return
	}
	if !m.keep(s) {
		m.destroySlot(s)
	}
}

func (m *Manager) pokeSlots() {
	select {
	case m.slotWake <- struct{}{}:
	default:
	}
}

// makeSlot makes a network namespace owned by the host's user namespace
// and wires it to a free block.
func (m *Manager) makeSlot() (_ *Slot, retErr error) {
	m.mu.Lock()
	block, ok := m.slots.take()
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("making a network slot: %w: no free address in %s", errdefs.ErrUnavailable, m.cfg.Subnet)
	}
	s := &Slot{m: m, ns: -1, sysfs: -1, block: block, link: m.slots.link(block)}
	defer func() {
		if retErr != nil {
			m.destroySlot(s)
		}
	}()
	if err := m.newNetns(s); err != nil {
		return nil, fmt.Errorf("making a network slot: %w", err)
	}
	if err := m.addVeth("slot#"+strconv.Itoa(block), s.ns, &s.link); err != nil {
		return nil, fmt.Errorf("making a network slot: %w", err)
	}
	if err := m.configure("", s.ns, s.link); err != nil {
		return nil, fmt.Errorf("making a network slot: %w", err)
	}
	hl, err := m.nl.LinkByName(s.link.HostIf)
	if err != nil {
		return nil, fmt.Errorf("making a network slot: finding %s: %w", s.link.HostIf, err)
	}
	s.hostIndex = hl.Attrs().Index
	return s, nil
}

// slotSysctls are set in every slot's namespace when it is made (the
// guest cannot: it is not root in the namespace's owner).
var slotSysctls = []struct{ path, val string }{
	// Every group may open ICMP echo sockets: ping without CAP_NET_RAW.
	// The range is of the host's gids (the writer's): all of them.
	{"ipv4/ping_group_range", "0 4294967294"},
	// Binding a port below 1024 needs CAP_NET_BIND_SERVICE over the
	// namespace's owner, which no sandbox has: any port is bindable,
	// as in Docker's default.
	{"ipv4/ip_unprivileged_port_start", "0"},
	// A closed connection leaves no TIME_WAIT socket in the slot for
	// the next sandbox to see or collide with.
	{"ipv4/tcp_max_tw_buckets", "0"},
	// Nothing learned of a destination (RTT, window) is kept for the
	// next sandbox to read with `ip tcp_metrics` (reset flushes the
	// rest).
	{"ipv4/tcp_no_metrics_save", "1"},
	// No redirect changes the slot's routes.
	{"ipv4/conf/all/accept_redirects", "0"},
	{"ipv4/conf/default/accept_redirects", "0"},
}

// newNetns makes s's namespace from a thread that returns to the host's,
// sets it up and mounts a sysfs of it.
func (m *Manager) newNetns(s *Slot) error {
	type made struct {
		ns, sysfs int
		err       error
	}
	ch := make(chan made, 1)
	go func() {
		runtime.LockOSThread()
		r := made{ns: -1, sysfs: -1}
		if r.err = unix.Unshare(unix.CLONE_NEWNET); r.err != nil {
			runtime.UnlockOSThread() // still in the host's namespace
			ch <- r
			return
		}
		r.ns, r.err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if r.err == nil {
			r.err = setUpSlot()
		}
		if r.err == nil {
			r.sysfs, r.err = mountSysfs()
		}
		if err := unix.Setns(int(m.host), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and ends with the goroutine.
			r.err = errors.Join(r.err, fmt.Errorf("returning to the host netns: %w", err))
			ch <- r
			return
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	s.ns, s.sysfs = r.ns, r.sysfs
	if r.err != nil {
		return r.err
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.ns, &st); err != nil {
		return err
	}
	s.ino = st.Ino
	return m.checkOwner(s.ns)
}

// setUpSlot sets up the calling thread's (new) network namespace.
func setUpSlot() error {
	for _, s := range slotSysctls {
		if err := writeSysctl(s.path, s.val); err != nil {
			return err
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting lo up: %w", err)
	}
	return nil
}

// SysfsOf makes a detached read-only sysfs mount of network namespace
// netnsFD (for a guest whose user namespace does not own it, so may not
// mount one itself), from a thread that enters it and comes back. The
// caller closes it.
func SysfsOf(netnsFD int) (int, error) {
	back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the host's netns: %w", err)
	}
	defer unix.Close(back)
	fd := -1
	err = inNetns(netnsFD, back, func() error {
		var err error
		fd, err = mountSysfs()
		return err
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	return fd, err
}

// mountSysfs makes a detached read-only sysfs mount of the calling
// thread's network namespace.
func mountSysfs() (int, error) {
	fs, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("opening sysfs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("creating sysfs: %w", err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("mounting sysfs: %w", err)
	}
	return fd, nil
}

// checkOwner refuses a namespace not owned by the daemon's own user
// namespace: only then can nothing in a sandbox reconfigure it.
func (m *Manager) checkOwner(nsFD int) error {
	owner, err := unix.IoctlRetInt(nsFD, unix.NS_GET_USERNS)
	if err != nil {
		return fmt.Errorf("reading the slot's owner: %w", err)
	}
	defer unix.Close(owner)
	var got, want unix.Stat_t
	if err := unix.Fstat(owner, &got); err != nil {
		return err
	}
	if err := unix.Stat("/proc/self/ns/user", &want); err != nil {
		return err
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		return fmt.Errorf("the slot's namespace is owned by user namespace %d, not the daemon's %d", got.Ino, want.Ino)
	}
	return nil
}

// destroySlot closes s's descriptors: its namespace goes with its last
// process, and the veth pair with it; the worker frees the block once
// the host side is gone (as for a sandbox's own namespace).
func (m *Manager) destroySlot(s *Slot) {
	for _, fd := range []*int{&s.sysfs, &s.ns} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	m.mu.Lock()
	switch {
	case s.link.HostIf != "":
		m.queue = append(m.queue, deletion{name: s.link.HostIf, slot: s.block, at: time.Now()})
	case s.block >= 0:
		m.slots.free(s.block)
	}
	m.mu.Unlock()
	m.poke()
}

// reset makes a recycled slot as a new one is: no socket (orphaned TCP
// connections are destroyed; any other socket means a process outside
// the sandbox holds one, and the slot is not reused), no neighbour entry,
// no TCP metrics, no conntrack entry, no capture table inside; and on the host, no set
// element or conntrack entry of its address, as when a block is freed.
// The host's user namespace owns the slot, so its configuration is as it
// was made: nothing in the sandbox could change it.
func (m *Manager) reset(s *Slot) error {
	quiet := false
	err := m.inNetns(s.ns, func() error {
		// Before this thread opens a socket in the namespace.
		idle, err := settledNoSockets()
		if err != nil {
			return err
		}
		seen, err := os.ReadFile(netDev)
		if err != nil {
			return fmt.Errorf("reading the slot's counters: %w", err)
		}
		if idle && !s.captured && s.counters != nil && bytes.Equal(seen, s.counters) {
			// No socket, and no packet in or out of any interface
			// (loopback too) since the last reset: nothing made a
			// neighbour entry, TCP metrics or a conntrack entry in
			// it, nor set elements or conntrack entries of its
			// address on the host, which come from its packets.
			quiet = true
			return nil
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_INET_DIAG)
		if err != nil {
			return fmt.Errorf("opening netlink in the slot: %w", err)
		}
		defer h.Close()
		if !idle {
			if err := closeSockets(h); err != nil {
				return err
			}
		}
		neigh, err := h.NeighList(0, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing neighbours: %w", err)
		}
		for i := range neigh {
			if err := h.NeighDel(&neigh[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("deleting neighbour %s: %w", neigh[i].IP, err)
			}
		}
		if err := m.flushTCPMetrics(); err != nil {
			return err
		}
		if err := flushAllConntrack(); err != nil {
			return err
		}
		// A packet from now on (one still in flight to the old
		// sandbox's address, say) makes the next reset a full one.
		s.counters, err = os.ReadFile(netDev)
		if err != nil {
			s.counters = nil
			return fmt.Errorf("reading the slot's counters: %w", err)
		}
		return nil
	})
	if err == nil && s.captured {
		if err = installCapture(s.ns, s.link, nil); err == nil {
			s.captured = false
		}
	}
	if err != nil || quiet {
		if err == nil {
			m.quietResets.Add(1)
		}
		return err
	}
	addrs := []netip.Addr{s.link.SandboxAddr}
	if err := forgetAddrs(m.cfg.Name, addrs); err != nil {
		return fmt.Errorf("removing the slot's set elements: %w", err)
	}
	if err := forgetConntrack(m.nlDelete, addrs); err != nil {
		return fmt.Errorf("removing the slot's conntrack entries: %w", err)
	}
	return nil
}

// netDev holds the calling thread's network namespace's interface
// counters: the same bytes twice mean that no packet went in or out of
// any of its interfaces in between. Reading it costs one file read,
// where the reset's flushes cost a dozen netlink sockets and dumps
// (most of a slot's recycling under churn, issue 21).
const netDev = "/proc/thread-self/net/dev"

// noSockets reports whether the calling thread's network namespace holds
// no socket at all, from its counters (sockstat: O(CPUs)): every socket
// made in it ("sockets: used"), the TCP, UDP and raw ones hashed there
// (listening, connected, bound, orphaned: "inuse") and TIME_WAIT ("tw").
// A dump of TCP sockets walks the host's whole connection table, which
// under churn cost more than the rest of the reset; it is left for the
// namespaces whose counters are not all zero.
func noSockets() (bool, error) {
	idle, _, err := socketCounts()
	return idle, err
}

// socketCounts is noSockets, and whether "sockets: used" alone is not
// zero: sockets of other families (netlink, unix, packet), or sockets
// closed whose memory the kernel frees after an RCU grace period. The
// daemon's own netlink sockets of a slot's last reset or attach are
// counted until then: a slot recycled within milliseconds of it (a
// fast host, churn) would never find its counters at rest.
func socketCounts() (idle, onlyUsed bool, err error) {
	onlyUsed = true
	idle = true
	for _, f := range []string{"sockstat", "sockstat6"} {
		b, err := os.ReadFile("/proc/thread-self/net/" + f)
		if err != nil {
			return false, false, fmt.Errorf("reading the slot's %s: %w", f, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			for i := 1; i+1 < len(fields); i += 2 {
				switch fields[i] {
				case "used", "inuse", "tw":
					if fields[i+1] != "0" {
						idle = false
						onlyUsed = onlyUsed && fields[i] == "used"
					}
				}
			}
		}
	}
	return idle, !idle && onlyUsed, nil
}

// settledNoSockets is noSockets once sockets that only "sockets: used"
// counts (closed ones among them, freed after a grace period) had up to
// socketSettle to go.
func settledNoSockets() (bool, error) {
	deadline := time.Now().Add(socketSettle)
	for {
		idle, onlyUsed, err := socketCounts()
		if err != nil || idle || !onlyUsed || time.Now().After(deadline) {
			return idle, err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// socketSettle bounds settledNoSockets' wait: an RCU grace period is a
// few milliseconds on an idle host, tens on a busy one.
const socketSettle = 100 * time.Millisecond

// closeSockets destroys the TCP sockets the kernel still finishes for
// dead processes, then checks that no socket is left in the namespace.
func closeSockets(h *netlink.Handle) error {
	tcp, err := h.SocketDiagTCP(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("listing TCP sockets: %w", err)
	}
	for _, s := range tcp {
		local := &net.TCPAddr{IP: s.ID.Source, Port: int(s.ID.SourcePort)}
		remote := &net.TCPAddr{IP: s.ID.Destination, Port: int(s.ID.DestinationPort)}
		if err := h.SocketDestroy(local, remote); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("destroying a TCP socket %s → %s: %w", local, remote, err)
		}
	}
	var left []string
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		tcp, err := h.SocketDiagTCP(fam)
		if err != nil {
			return fmt.Errorf("listing TCP sockets: %w", err)
		}
		for _, s := range tcp {
			left = append(left, fmt.Sprintf("tcp %s:%d", s.ID.Source, s.ID.SourcePort))
		}
		udp, err := h.SocketDiagUDP(fam)
		if err != nil {
			return fmt.Errorf("listing UDP sockets: %w", err)
		}
		for _, s := range udp {
			left = append(left, fmt.Sprintf("udp %s:%d", s.ID.Source, s.ID.SourcePort))
		}
	}
	unixSocks, err := h.UnixSocketDiag()
	if err != nil {
		return fmt.Errorf("listing unix sockets: %w", err)
	}
	for _, s := range unixSocks {
		left = append(left, fmt.Sprintf("unix inode %d", s.INode))
	}
	if len(left) > 0 {
		return fmt.Errorf("sockets left in the slot: %v", left)
	}
	return nil
}

// TCP metrics (linux/tcp_metrics.h): a delete with no address flushes the
// namespace's.
const tcpMetricsCmdDel = 2

// flushTCPMetrics flushes the calling thread's namespace's TCP metrics.
func (m *Manager) flushTCPMetrics() error {
	if m.tcpMetrics == 0 {
		return nil // the kernel has none
	}
	req := nl.NewNetlinkRequest(int(m.tcpMetrics), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: tcpMetricsCmdDel, Version: 1})
	if _, err := req.Execute(unix.NETLINK_GENERIC, 0); err != nil {
		return fmt.Errorf("flushing TCP metrics: %w", err)
	}
	return nil
}

// flushAllConntrack flushes the calling thread's namespace's conntrack
// table (empty unless something there used conntrack).
func flushAllConntrack() error {
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("flushing the slot's conntrack table: %w", err)
	}
	return nil
}

// lookupTCPMetrics finds the tcp_metrics generic netlink family (0: none).
func lookupTCPMetrics() uint16 {
	f, err := netlink.GenlFamilyGet("tcp_metrics")
	if err != nil {
		return 0
	}
	return f.ID
}
