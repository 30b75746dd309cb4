package network

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Capture sends a sandbox's outbound TCP connections to a port of its own
// (an egress sidecar: a container of the sandbox that listens there),
// except those the sidecar itself opens, which go out as before, through
// the host's rules and paddock's proxy, the outer boundary.
//
// The rules live in the sandbox's slot, in a table of their own, as `nft
// list table ip paddock-capture` prints it (port 3128, sidecar uids
// 420065536-420131071, sandbox 10.224.0.2, gateway 10.224.0.1):
//
//	chain capture {      # nat output, priority dstnat (-100)
//	  ip daddr 127.0.0.0/8 return
//	  ip daddr 10.224.0.2 return
//	  ip daddr 10.224.0.1 return
//	  meta skuid 420065536-420131071 return
//	  meta l4proto tcp counter redirect to :3128
//	}
//
// Loopback and the sandbox's own address are its containers talking to
// each other (localhost:5432); the gateway is paddock's resolver and self
// endpoint. The sidecar is told apart by its uid range: every container
// has its own, its processes cannot leave it (their user namespace maps
// nothing else), the slot's namespace belongs to the host's user
// namespace so `meta skuid` reads host uids, and it holds on cgroup v1,
// hybrid and v2 alike (a `socket cgroupv2` match would not on v1, where
// the members' processes are in no v2 group of their own). Nothing in
// the sandbox can change the table: it has no CAP_NET_ADMIN over the
// slot.
type Capture struct {
	// Port is where the sidecar listens (on loopback or any address).
	Port uint16
	// FirstUID and LastUID are the sidecar's host uid range.
	FirstUID, LastUID uint32
}

// captureTable is the table Capture installs in a slot.
const captureTable = "paddock-capture"

// SetCapture installs c in sandbox id's slot, replacing any earlier one;
// nil removes it. The sandbox must run in a slot (the gateway's case): a
// namespace its own user namespace owns could drop the rules.
func (m *Manager) SetCapture(id string, c *Capture) error {
	if c != nil && (c.Port == 0 || c.FirstUID > c.LastUID) {
		return errdefs.Invalid("capture", "port %d, uids %d-%d", c.Port, c.FirstUID, c.LastUID)
	}
	m.mu.Lock()
	s, ok := m.slotOf[id]
	if ok && c != nil {
		s.captured = true
	}
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("capturing %s's egress: %w: the sandbox has no network slot", id, errdefs.ErrUnavailable)
	}
	return installCapture(s.ns, s.link, c)
}

// installCapture replaces the capture table of the namespace netnsFD (of
// link l) with c's rules, in one transaction; nil deletes it.
func installCapture(netnsFD int, l Link, c *Capture) error {
	conn, err := nftables.New(nftables.WithNetNSFd(netnsFD))
	if err != nil {
		return fmt.Errorf("opening nftables in the slot: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: captureTable}
	conn.AddTable(t)
	conn.DelTable(t)
	if c != nil {
		conn.AddTable(t)
		ch := conn.AddChain(&nftables.Chain{
			Name: "capture", Table: t,
			Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest,
		})
		for _, r := range captureRules(l, c) {
			conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.why)})
		}
	}
	if err := conn.Flush(); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("setting the slot's capture: %w: %v", errdefs.ErrDenied, err)
		}
		return fmt.Errorf("setting the slot's capture: %w", err)
	}
	return nil
}

// captureRules are c's rules for a slot of link l (see Capture).
func captureRules(l Link, c *Capture) []rule {
	ret := verdict(expr.VerdictReturn)
	daddr := func(mask, want uint32) []expr.Any {
		return append(maskedAddr(16, mask, want, expr.CmpOpEq), ret...)
	}
	return []rule{
		{exprs: daddr(0xff000000, 0x7f000000), why: "loopback: the sandbox's containers to each other"},
		{exprs: daddr(^uint32(0), addrUint(l.SandboxAddr)), why: "the sandbox's own address"},
		{exprs: daddr(^uint32(0), addrUint(l.HostAddr)), why: "the gateway: paddock's resolver and self endpoint"},
		{exprs: append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
			// skuid is in host byte order; range compares bytes.
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Range{Op: expr.CmpOpEq, Register: 1,
				FromData: binaryutil.BigEndian.PutUint32(c.FirstUID), ToData: binaryutil.BigEndian.PutUint32(c.LastUID)},
		}, ret...), why: "the sidecar's own connections go out through paddock's proxy"},
		{exprs: slices.Concat(l4proto(unix.IPPROTO_TCP), counter(), redir(c.Port)), why: "every other TCP connection goes to the sidecar"},
	}
}
