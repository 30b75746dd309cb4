package network

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// forgetConntrack deletes the entries from the addresses it is given and
// no others, by the kernel's filtered flush and by the dump it falls
// back to; run in a netns of its own, whose table holds only the test's.
func TestForgetConntrack(t *testing.T) {
	requireRoot(t)
	gone := []netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.10")}
	kept := netip.MustParseAddr("10.1.0.6")
	for _, tc := range []struct {
		name   string
		forget func(h *netlink.Handle, addrs []netip.Addr) error
	}{
		{"filtered flush", func(_ *netlink.Handle, addrs []netip.Addr) error {
			_, err := flushConntrack(addrs)
			return err
		}},
		{"dump and delete", dumpAndDelete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var left []netip.Addr
			var err error
			inNS(t, plainNetns(t), func() {
				h, herr := netlink.NewHandle(unix.NETLINK_NETFILTER)
				if herr != nil {
					err = herr
					return
				}
				defer h.Close()
				for _, a := range append([]netip.Addr{kept}, gone...) {
					for port := range uint16(3) {
						if err = h.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, tcpFlow(a, 1000+port)); err != nil {
							return
						}
					}
				}
				if err = tc.forget(h, gone); err != nil {
					return
				}
				flows, lerr := h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
				if lerr != nil {
					err = lerr
					return
				}
				for _, f := range flows {
					a, _ := netip.AddrFromSlice(f.Forward.SrcIP.To4())
					left = append(left, a)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := []netip.Addr{kept, kept, kept}; !slices.Equal(left, want) {
				t.Errorf("entries left from %v, want %v", left, want)
			}
		})
	}
}

// tcpFlow is an established TCP entry from a to a proxy-like address.
func tcpFlow(a netip.Addr, port uint16) *netlink.ConntrackFlow {
	dst := net.IPv4(10, 1, 0, 1).To4()
	return &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{SrcIP: a.AsSlice(), DstIP: dst, Protocol: unix.IPPROTO_TCP, SrcPort: port, DstPort: 80},
		Reverse:    netlink.IPTuple{SrcIP: dst, DstIP: a.AsSlice(), Protocol: unix.IPPROTO_TCP, SrcPort: 80, DstPort: port},
		TimeOut:    100,
		ProtoInfo:  &netlink.ProtoInfoTCP{State: 3}, // established
	}
}
