package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// The table, as `nft list table inet <Name>` prints it (Name "pd", subnet
// 10.224.0.0/16, proxy 15001, DNS 15053, self 15080; counters and the
// comments, which carry each rule's reason, left out):
//
//	set conns   { type ipv4_addr; size 65536; flags dynamic; }
//	set dnsrate { type ipv4_addr; size 65536; flags dynamic,timeout; timeout 1m; }
//	chain guard {        # filter prerouting, priority raw (-300): before conntrack
//	  iifname != "pd-*" accept
//	  meta nfproto ipv6 drop
//	  ip saddr & 255.255.0.3 != 10.224.0.2 drop
//	  fib saddr . iif oif 0 drop
//	}
//	chain redirect {     # nat prerouting, priority dstnat (-100)
//	  iifname "pd-*" udp dport 53 redirect to :15053
//	  iifname "pd-*" tcp dport 53 redirect to :15053
//	  iifname "pd-*" ip daddr & 255.255.0.3 == 10.224.0.1 tcp dport 80 redirect to :15080
//	  iifname "pd-*" meta l4proto tcp redirect to :15001
//	}
//	chain input {        # filter input, priority filter (0)
//	  iifname "lo" accept
//	  iifname "pd-*" goto sandbox
//	  tcp dport 15001 drop   # and 15053 (tcp, udp), 15080
//	}
//	chain sandbox {      # input from a sandbox
//	  udp dport 15053 update @dnsrate { ip saddr limit rate over 1000/second burst 1000 packets } drop
//	  ct state established,related accept
//	  meta l4proto tcp ct state new add @conns { ip saddr ct count over 4096 } reject with icmpx admin-prohibited
//	  tcp dport 15001 accept
//	  tcp dport 15053 accept
//	  udp dport 15053 accept
//	  tcp dport 15080 accept
//	  reject with icmpx admin-prohibited
//	}
//	chain forward {      # filter forward, priority filter (0)
//	  iifname "pd-*" reject with icmpx admin-prohibited
//	  oifname "pd-*" drop
//	}
//	chain output {       # filter output, priority filter (0)
//	  oifname "pd-*" ct state new drop
//	}
//
// Why, chain by chain:
//
//   - guard: IPv6 never leaves a sandbox (the host side has IPv6 disabled
//     too, so this rule is the second line); a packet must come from the
//     sandbox-side address of the veth it arrived on (the mask rule, then
//     a strict reverse-path check, as rp_filter=1 on the interface), so a
//     sandbox with CAP_NET_RAW cannot pass as another sandbox, the host or
//     the internet, and Lookup(peer) is the truth.
//   - redirect: DNS to any server goes to the resolver, port 80 of the
//     gateway to the self endpoint, every other TCP connection to the
//     proxy, which reads the original destination with SO_ORIGINAL_DST.
//     redirect rewrites the destination to the primary address of the
//     incoming interface: the sandbox's own gateway. No route_localnet, and
//     the host's 127.0.0.1 services stay out of reach.
//   - input (and sandbox, for what comes from a sandbox): a sandbox
//     reaches only paddock's three ports on the host;
//     anything else (other ports, other host addresses, ICMP) is rejected
//     at once, so tools fail fast instead of timing out. Two per-sandbox
//     bounds keep one sandbox from filling the host's conntrack table:
//     open TCP connections (closed ones do not count) and DNS packets per
//     second (well above the resolver's own limit, which answers
//     REFUSED). Rejected packets are never confirmed in conntrack. The
//     last rules keep the three ports from the network (only the
//     sandboxes and the host itself reach them): no open proxy or resolver.
//   - forward: nothing is routed from a sandbox (other sandboxes, the LAN,
//     169.254.169.254 other than through the proxy, the internet) or into
//     one, whatever net.ipv4.ip_forward says.
//   - output: host processes cannot open connections into a sandbox (the
//     daemon reaches a sandbox's ports through its guest); replies to what
//     the sandbox opened pass.
//
// Every base chain's policy is accept: the table only decides about
// packets to, from or for the sandboxes' interfaces, and about the three
// paddock ports, never about the rest of the host's traffic. Other tables
// at the same hooks still see the packets this one accepts: a host
// firewall that drops input by default must let the sandboxes' interfaces
// reach the three ports. Each packet's interface is looked at once or
// twice per chain: guard accepts what is not from a sandbox at once (the
// verdict its policy would give at the chain's end), input accepts
// loopback and sends what comes from a sandbox to a chain of its own,
// whose rules need not ask again.

// Config.MaxConns and Config.MaxDNSRate set the bounds.
const (
	// setSize bounds the per-sandbox sets: more than a /16 of sandboxes.
	setSize = 65536
	// connlimitOver is NFT_CONNLIMIT_F_INV ("ct count over"), which x/sys
	// does not define.
	connlimitOver = 1
)

// rule is one rule and the reason it exists; the reason is stored as the
// rule's comment, so `nft list` shows it to an operator.
type rule struct {
	chain *nftables.Chain
	why   string
	exprs []expr.Any
}

// rules returns the table's sets, chains and rules for cfg.
func rules(cfg Config, t *nftables.Table) ([]*nftables.Set, []*nftables.Chain, []rule) {
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return &nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio}
	}
	guard := chain("guard", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	redirect := chain("redirect", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	input := chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	sandbox := &nftables.Chain{Name: "sandbox", Table: t} // input from a sandbox (a regular chain)
	forward := chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	output := chain("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)

	prefix := cfg.Name + "-"
	fromSandbox := ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, prefix)
	subnetMask := addrUint(netipMask(cfg.Subnet.Bits())) | 3
	sandboxSide := addrUint(cfg.Subnet.Addr()) | 2
	hostSide := addrUint(cfg.Subnet.Addr()) | 1

	conns := &nftables.Set{Table: t, Name: "conns", KeyType: nftables.TypeIPAddr, Dynamic: true, Size: setSize}
	dnsRate := &nftables.Set{Table: t, Name: "dnsrate", KeyType: nftables.TypeIPAddr, Dynamic: true,
		HasTimeout: true, Timeout: time.Minute, Size: setSize}

	var rs []rule
	add := func(c *nftables.Chain, why string, parts ...[]expr.Any) {
		var e []expr.Any
		for _, p := range parts {
			e = append(e, p...)
		}
		rs = append(rs, rule{chain: c, why: why, exprs: e})
	}

	// Every packet the host sends or gets meets the table's base chains,
	// loopback traffic above all (a client's stream to the daemon or to
	// a gateway on this host): each chain looks at a packet's interface
	// once or twice, not in every rule (a loopback packet met 15
	// interface-name loads and compares, 8% of a gateway's CPU splicing
	// a stream).
	//
	// guard runs before conntrack and NAT. Past its first rule every
	// packet is from a sandbox.
	add(guard, "not from a sandbox: nothing below is about it",
		ifname(expr.MetaKeyIIFNAME, expr.CmpOpNeq, prefix), verdict(expr.VerdictAccept))
	add(guard, "sandboxes have no IPv6: drop any they craft (raw sockets) before the host parses it",
		nfproto(unix.NFPROTO_IPV6), counter(), verdict(expr.VerdictDrop))
	add(guard, "a sandbox may only send from a sandbox-side address (.2 of a /30 in the subnet)",
		nfproto(unix.NFPROTO_IPV4), maskedAddr(12, subnetMask, sandboxSide, expr.CmpOpNeq), counter(), verdict(expr.VerdictDrop))
	add(guard, "... and only its own (strict reverse-path check): the peer address of a connection names its sandbox",
		[]expr.Any{
			&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
		}, counter(), verdict(expr.VerdictDrop))

	// redirect sends new connections to paddock's services on the
	// sandbox's own host-side address (redirect picks the address of the
	// incoming interface): no route_localnet, and the host's loopback
	// services stay out of reach.
	add(redirect, "DNS to any server, UDP: paddock's resolver",
		fromSandbox, l4proto(unix.IPPROTO_UDP), dport(53), redir(cfg.DNSPort))
	add(redirect, "DNS to any server, TCP: paddock's resolver",
		fromSandbox, l4proto(unix.IPPROTO_TCP), dport(53), redir(cfg.DNSPort))
	if cfg.SelfPort != 0 {
		add(redirect, "http://paddock.internal/ (a host-side address, port 80): the daemon's self endpoint",
			fromSandbox, nfproto(unix.NFPROTO_IPV4), maskedAddr(16, subnetMask, hostSide, expr.CmpOpEq),
			l4proto(unix.IPPROTO_TCP), dport(80), redir(cfg.SelfPort))
	}
	add(redirect, "every other TCP connection, to any address: the egress proxy decides (SO_ORIGINAL_DST)",
		fromSandbox, l4proto(unix.IPPROTO_TCP), redir(cfg.ProxyPort))

	// input: a sandbox reaches the host only on paddock's ports (its
	// own chain, sandbox), the network not at all on them.
	add(input, "the host's own loopback traffic: nothing below is about it",
		ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, "lo\x00"), verdict(expr.VerdictAccept))
	add(input, "from a sandbox: its own chain decides",
		fromSandbox, []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: sandbox.Name}})
	add(sandbox, fmt.Sprintf("at most %d DNS packets a second per sandbox, new flows or not: a flood is dropped before the resolver or conntrack keeps it", cfg.MaxDNSRate),
		l4proto(unix.IPPROTO_UDP), dport(cfg.DNSPort), nfproto(unix.NFPROTO_IPV4), saddrTo1(), []expr.Any{
			&expr.Dynset{SrcRegKey: 1, SetName: dnsRate.Name, Operation: unix.NFT_DYNSET_OP_UPDATE,
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(cfg.MaxDNSRate), Over: true, Unit: expr.LimitTimeSecond, Burst: uint32(cfg.MaxDNSRate)}}},
		}, counter(), verdict(expr.VerdictDrop))
	add(sandbox, "replies and ICMP errors of connections already allowed",
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))
	add(sandbox, fmt.Sprintf("at most %d open TCP connections per sandbox", cfg.MaxConns),
		l4proto(unix.IPPROTO_TCP), ctState(expr.CtStateBitNEW), nfproto(unix.NFPROTO_IPV4), saddrTo1(), []expr.Any{
			&expr.Dynset{SrcRegKey: 1, SetName: conns.Name, Operation: unix.NFT_DYNSET_OP_ADD,
				Exprs: []expr.Any{&expr.Connlimit{Count: uint32(cfg.MaxConns), Flags: connlimitOver}}},
		}, counter(), reject())
	ports := []struct {
		proto byte
		port  uint16
		what  string
	}{
		{unix.IPPROTO_TCP, cfg.ProxyPort, "egress proxy"},
		{unix.IPPROTO_TCP, cfg.DNSPort, "resolver over TCP"},
		{unix.IPPROTO_UDP, cfg.DNSPort, "resolver over UDP"},
	}
	if cfg.SelfPort != 0 {
		ports = append(ports, struct {
			proto byte
			port  uint16
			what  string
		}{unix.IPPROTO_TCP, cfg.SelfPort, "self endpoint"})
	}
	for _, p := range ports {
		add(sandbox, "sandbox to paddock's "+p.what,
			l4proto(p.proto), dport(p.port), verdict(expr.VerdictAccept))
	}
	add(sandbox, "nothing else on the host: not its other ports, not its other addresses; refused at once rather than left to time out",
		counter(), reject())
	// What reaches these is neither loopback nor a sandbox's.
	for _, p := range ports {
		add(input, "paddock's "+p.what+" serves sandboxes (and the host), not the network: no open proxy or resolver",
			l4proto(p.proto), dport(p.port), counter(), verdict(expr.VerdictDrop))
	}

	// forward: nothing is routed through the host from or to a sandbox,
	// whatever net.ipv4.ip_forward says.
	add(forward, "a sandbox reaches no other network, no other sandbox, no metadata service, directly",
		fromSandbox, counter(), reject())
	add(forward, "nothing else routes into a sandbox",
		ifname(expr.MetaKeyOIFNAME, expr.CmpOpEq, prefix), counter(), verdict(expr.VerdictDrop))

	// output: the host answers sandboxes but opens nothing to them (the
	// daemon reaches a sandbox's ports through its guest, not its network).
	add(output, "host processes cannot open connections into a sandbox",
		ifname(expr.MetaKeyOIFNAME, expr.CmpOpEq, prefix), ctState(expr.CtStateBitNEW), counter(), verdict(expr.VerdictDrop))

	return []*nftables.Set{conns, dnsRate}, []*nftables.Chain{guard, redirect, sandbox, input, forward, output}, rs
}

// install replaces (atomically, in one transaction) the table named
// cfg.Name with paddock's rules. Running sandboxes' traffic meets either
// the old table or the new one, never neither.
func install(cfg Config) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: cfg.Name}
	// Adding before deleting makes the delete valid whether or not the
	// table existed.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	sets, chains, rs := rules(cfg, t)
	for _, set := range sets {
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("adding set %s: %w", set.Name, err)
		}
	}
	for _, ch := range chains {
		c.AddChain(ch)
	}
	for _, r := range rs {
		c.AddRule(&nftables.Rule{
			Table:    t,
			Chain:    r.chain,
			Exprs:    r.exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, r.why),
		})
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("installing nftables table %s: %w: %v", cfg.Name, errdefs.ErrDenied, err)
		}
		return fmt.Errorf("installing nftables table %s: %w: %v", cfg.Name, errdefs.ErrUnavailable, err)
	}
	return nil
}

// deleteTable removes the table named name, if it exists.
func deleteTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("deleting nftables table %s: %w", name, err)
	}
	return nil
}

// forgetAddrs deletes addrs' elements from the per-sandbox sets of table
// name. Deleting an element that is not there fails the whole batch, so
// only those found are deleted; one that expires in between makes it try
// again.
func forgetAddrs(name string, addrs []netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	for attempt := 0; ; attempt++ {
		for _, setName := range []string{"conns", "dnsrate"} {
			set := &nftables.Set{Table: t, Name: setName, KeyType: nftables.TypeIPAddr}
			elems, err := c.GetSetElements(set)
			if err != nil {
				return fmt.Errorf("listing set %s: %w", setName, err)
			}
			var del []nftables.SetElement
			for _, e := range elems {
				if a, ok := netip.AddrFromSlice(e.Key); ok && want[a] {
					del = append(del, nftables.SetElement{Key: e.Key})
				}
			}
			if len(del) > 0 {
				if err := c.SetDeleteElements(set, del); err != nil {
					return fmt.Errorf("deleting from set %s: %w", setName, err)
				}
			}
		}
		err := c.Flush()
		if err == nil || attempt > 0 {
			return err
		}
	}
}

// ifname matches an interface name: exactly, if name ends in a NUL, or by
// prefix (nft's "pd-*"), since cmp compares only len(name) bytes.
func ifname(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(name)},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// dport matches the TCP or UDP destination port (both at offset 2).
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// maskedAddr compares the IPv4 address at offset off (12 source, 16
// destination) masked with mask against want.
func maskedAddr(off uint32, mask, want uint32, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.BigEndian.PutUint32(mask), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: binaryutil.BigEndian.PutUint32(want)},
	}
}

// saddrTo1 loads the IPv4 source address into register 1 (the key of a
// per-sandbox set).
func saddrTo1() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func redir(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func reject() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

func counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
