package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// hostCosts reads what this host charges for the kernel work a
// sandbox's churn is made of, before any sandbox runs: a page fault on
// fresh anonymous memory, a spawn of /bin/true one at a time, and the
// spawns' throughput two at a time. The churn and burst bars are
// absolute rates and latencies on "this machine", and a virtual machine
// whose page-table changes go through its hypervisor charges several
// times what a quiet one does (issue 21's notes): these rows say which
// kind of day a run had.
func hostCosts(ctx context.Context) [][2]string {
	return [][2]string{
		{"host: a page fault (fresh anonymous memory)", faultCost()},
		{"host: spawn and wait of /bin/true", spawnCost(ctx)},
	}
}

// faultCost is the median time per page of touching 16 MiB of fresh
// anonymous memory (no huge pages), three rounds.
func faultCost() string {
	const size, page = 16 << 20, 4096
	var per []float64
	for range 3 {
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return "unknown (" + err.Error() + ")"
		}
		unix.Madvise(b, unix.MADV_NOHUGEPAGE)
		start := time.Now()
		for i := 0; i < size; i += page {
			b[i] = 1
		}
		per = append(per, float64(time.Since(start).Nanoseconds())/(size/page)/1000)
		unix.Munmap(b)
	}
	return fmt.Sprintf("%.2f µs (median of %d rounds of %d pages)", medianFloat(per), len(per), size/page)
}

// spawnCost is the median of 100 spawns of /bin/true one after another,
// and the wall time per spawn of 100 more run by two loops at once: on
// two CPUs that a spawn's work scales over, the second is about half
// the first.
func spawnCost(ctx context.Context) string {
	const n = 100
	argv := []string{"/bin/true"}
	var seq []time.Duration
	for range n {
		d, err := timeRun(ctx, argv)
		if err != nil {
			return "unknown (" + err.Error() + ")"
		}
		seq = append(seq, d)
	}
	slices.Sort(seq)
	alone := median(seq)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := time.Now()
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / 2 {
				if _, errs[i] = timeRun(ctx, argv); errs[i] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	pair := time.Since(start) / n
	return fmt.Sprintf("%s median one at a time; %s per spawn two at a time (%.2f× the first)",
		ms(alone), ms(pair), float64(pair)/float64(alone))
}
