package test

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// hostSlot is a cluster test's own slice of the host, so that clusters
// of tests running side by side never share a network, a uid or a name:
// a /16 for its nodes' networks (10.232.0.0/16 up, apart from the test
// daemons' 10.160-10.223 and the default 10.224), 64 Mi host uids from
// 3<<30 up (the test daemons' random ranges end below 2^29+2^31) and a
// digit for its interface and cgroup names.
type hostSlot struct{ k int }

// hostSlots bounds the clusters that run at once; one more waits for a
// slot to come back.
const hostSlots = 15

var (
	slotsOnce sync.Once
	slotsFree chan int
	slotsAny  bool // some slot's /16 is not routed on this host
)

// takeSlot gives the test a slot, given back once everything the test
// started is gone (the cleanup registered first runs last).
func takeSlot(t *testing.T) hostSlot {
	t.Helper()
	slotsOnce.Do(func() {
		slotsFree = make(chan int, hostSlots)
		routes := hostRoutes()
		for k := range hostSlots {
			_, blk, _ := net.ParseCIDR(fmt.Sprintf("10.%d.0.0/16", 232+k))
			if !routed(routes, blk) {
				slotsFree <- k
				slotsAny = true
			}
		}
	})
	if !slotsAny {
		t.Fatal("every /16 from 10.232 to 10.246 is routed on this host: no network for a cluster's nodes")
	}
	k := <-slotsFree
	t.Cleanup(func() { slotsFree <- k })
	return hostSlot{k}
}

// subnet is node i's network (i from 0 to 15): a /20 of the slot's /16.
func (s hostSlot) subnet(i int) string { return fmt.Sprintf("10.%d.%d.0/20", 232+s.k, 16*i) }

// uidStart is node i's first host uid (i from 0 to 7): 8 Mi uids each,
// 128 sandboxes' ranges.
func (s hostSlot) uidStart(i int) uint32 { return 3<<30 + uint32(s.k)<<26 + uint32(i)<<23 }

// name is node i's network name (its nftables table and interface
// prefix), from kind (two letters): short enough for the interface
// names made from it.
func (s hostSlot) name(kind string, i int) string { return fmt.Sprintf("%s%x%d", kind, s.k, i) }
