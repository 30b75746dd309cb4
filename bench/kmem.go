package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// kernelMemory is the host's memory by kind, from /proc/meminfo, and the
// kernel's slab caches by name, from /proc/slabinfo: read before and with
// the density run's sandboxes, their difference says where the
// MemAvailable drop went.
type kernelMemory struct {
	Meminfo map[string]int64 // bytes by /proc/meminfo field
	Slabs   map[string]int64 // bytes by slab cache (its slabs' pages)
}

// meminfoFields are the /proc/meminfo fields the breakdown shows, in
// order: user pages (anonymous, shared memory, file cache) and the
// kernel's own (slab, stacks, page tables, per-CPU, vmalloc).
var meminfoFields = []string{"MemAvailable", "MemFree", "AnonPages", "Shmem", "Cached", "Slab", "SReclaimable", "SUnreclaim",
	"KernelStack", "PageTables", "SecPageTables", "Percpu", "VmallocUsed"}

func readKernelMemory() (kernelMemory, error) {
	k := kernelMemory{Meminfo: map[string]int64{}, Slabs: map[string]int64{}}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return k, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
			k.Meminfo[name] = kb << 10
		}
	}
	// slabinfo 2.1: name active_objs num_objs objsize objperslab
	// pagesperslab : tunables ... : slabdata active_slabs num_slabs ...
	s, err := os.Open("/proc/slabinfo")
	if err != nil {
		return k, nil // not readable: the meminfo half alone
	}
	defer s.Close()
	sc = bufio.NewScanner(s)
	page := int64(os.Getpagesize())
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		i := 0
		for i < len(f) && f[i] != "slabdata" {
			i++
		}
		if i < 6 || i+2 >= len(f) {
			continue
		}
		pages, err1 := strconv.ParseInt(f[5], 10, 64)
		slabs, err2 := strconv.ParseInt(f[i+2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		k.Slabs[f[0]] += slabs * pages * page
	}
	return k, nil
}

// kmemBreakdown is what n sandboxes added between before and with, per
// sandbox: the meminfo fields that moved and the slab caches that grew
// most.
func kmemBreakdown(before, with kernelMemory, n int64) (meminfo, slabs string) {
	if n <= 0 || len(before.Meminfo) == 0 || len(with.Meminfo) == 0 {
		return "", ""
	}
	var parts []string
	for _, name := range meminfoFields {
		b, ok1 := before.Meminfo[name]
		w, ok2 := with.Meminfo[name]
		if !ok1 || !ok2 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s", name, kib((w-b)/n)))
	}
	meminfo = strings.Join(parts, ", ")
	type grew struct {
		name  string
		bytes int64
	}
	var gs []grew
	var total int64
	for name, w := range with.Slabs {
		if d := w - before.Slabs[name]; d > 0 {
			gs = append(gs, grew{name, d})
			total += d
		}
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].bytes > gs[j].bytes })
	parts = nil
	for _, g := range gs[:min(len(gs), 12)] {
		parts = append(parts, fmt.Sprintf("%s %s", g.name, kib(g.bytes/n)))
	}
	if len(parts) > 0 {
		slabs = fmt.Sprintf("%s in all; %s", kib(total/n), strings.Join(parts, ", "))
	}
	return meminfo, slabs
}

// kib formats bytes as KiB with a sign.
func kib(n int64) string { return fmt.Sprintf("%+d KiB", n>>10) }
