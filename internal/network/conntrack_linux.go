package network

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Attributes of a conntrack flush with a filter (linux/netfilter/
// nfnetlink_conntrack.h), which the netlink package does not name.
const (
	ctaFilter           = 25     // CTA_FILTER
	ctaFilterOrigFlags  = 1      // CTA_FILTER_ORIG_FLAGS
	ctaFilterReplyFlags = 2      // CTA_FILTER_REPLY_FLAGS
	ctaFilterFIPSrc     = 1 << 0 // CTA_FILTER_F_CTA_IP_SRC
)

// forgetConntrack deletes the host's conntrack entries whose original
// source is one of addrs: one filtered flush per address, which the
// kernel runs over its table itself (Linux 6.3 and later). The netlink
// package's filtered delete instead dumps the whole table to user space
// and deletes matches one by one, ~1 ms of CPU per thousand entries for
// every batch of freed addresses; it remains the fallback for kernels
// that refuse a filter (they answer EINVAL, never flush everything: a
// delete with an original tuple and no filter is the delete of that one
// tuple, which needs a protocol this request does not give).
func forgetConntrack(fallback *netlink.Handle, addrs []netip.Addr) error {
	n, err := flushConntrack(addrs)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
		return dumpAndDelete(fallback, addrs[n:])
	}
	return err
}

// flushConntrack flushes the entries from each of addrs in turn, and
// returns how many addresses it flushed before an error.
func flushConntrack(addrs []netip.Addr) (int, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("opening ctnetlink: %w", err)
	}
	defer s.Close()
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: s}}
	for i, a := range addrs {
		if err := flushConntrackFrom(sockets, a); err != nil {
			return i, fmt.Errorf("flushing conntrack entries from %s: %w", a, err)
		}
	}
	return len(addrs), nil
}

// flushConntrackFrom asks the kernel to delete every IPv4 entry whose
// original source is a.
func flushConntrackFrom(sockets map[int]*nl.SocketHandle, a netip.Addr) error {
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
	req.Sockets = sockets
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	tuple := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	ip := tuple.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	ip.AddRtAttr(nl.CTA_IP_V4_SRC, a.AsSlice())
	req.AddData(tuple)
	filter := nl.NewRtAttr(unix.NLA_F_NESTED|ctaFilter, nil)
	filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(ctaFilterFIPSrc))
	filter.AddRtAttr(ctaFilterReplyFlags, nl.Uint32Attr(0))
	req.AddData(filter)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// dumpAndDelete is the netlink package's filtered delete (a dump of the
// whole table), for kernels without filtered flushes.
func dumpAndDelete(h *netlink.Handle, addrs []netip.Addr) error {
	var filters []netlink.CustomConntrackFilter
	for _, a := range addrs {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(netlink.ConntrackOrigSrcIP, a.AsSlice()); err == nil {
			filters = append(filters, f)
		}
	}
	_, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, filters...)
	return err
}
