package main

import (
	"context"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/api"
)

const (
	densityCount  = 100
	densitySettle = 2 * time.Second
)

// memSnapshot is the host's and the daemon's memory at one moment.
type memSnapshot struct {
	DaemonRSS int64
	Available int64
}

func (r *rig) memSnapshot() (memSnapshot, error) {
	rss, err := r.daemon.rss()
	if err != nil {
		return memSnapshot{}, fmt.Errorf("reading daemon RSS: %w", err)
	}
	avail, err := memAvailable()
	if err != nil {
		return memSnapshot{}, fmt.Errorf("reading MemAvailable: %w", err)
	}
	return memSnapshot{DaemonRSS: rss, Available: avail}, nil
}

// sandboxMemory is what one running sandbox costs the host.
type sandboxMemory struct {
	GuestRSS  int64 // the guest (PID 1 inside), as the host sees it
	GuestPSS  int64 // the same with shared pages split among sharers
	ProcsRSS  int64 // every process in the sandbox's cgroup
	Procs     int
	CgroupMem int64 // the sandbox's memory cgroup charge (-1 if unreadable)
}

// densityRun is what the density benchmark measured.
type densityRun struct {
	Before, With, After memSnapshot
	Starts, Removes     []time.Duration
	StartTotal          time.Duration
	RemoveTotal         time.Duration
	Sandboxes           []sandboxMemory
	Sleeping            int // sandboxes whose sleep was running
}

// benchDensity starts 100 sandboxes back to back, each with `sleep 3600`
// started through ExecStream and its stream closed (the process keeps
// running), measures what they cost the host, and removes them.
func benchDensity(ctx context.Context, r *rig) *section {
	s := &section{Method: densityMethod()}
	var d densityRun
	s.Err = r.density(ctx, &d)
	densityTable(s, &d)
	s.Bars = densityBars(&d)
	return s
}

func (r *rig) density(ctx context.Context, d *densityRun) error {
	// One sandbox first, so that one-time costs are not in the numbers.
	if err := r.withSandbox(ctx, api.CreateRequest{}, func(string) error { return nil }); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	r.idle(ctx)
	var err error
	if d.Before, err = r.memSnapshot(); err != nil {
		return err
	}
	var ids []string
	defer func() { r.removeAll(ids) }() // what the timed removal below did not get to
	t0 := time.Now()
	for i := 0; i < densityCount; i++ {
		t1 := time.Now()
		id, err := r.startSleeper(ctx)
		took := time.Since(t1)
		if id != "" {
			ids = append(ids, id)
		}
		if err != nil {
			d.StartTotal = time.Since(t0)
			return fmt.Errorf("sandbox %d: %w", i+1, err)
		}
		d.Starts = append(d.Starts, took)
	}
	d.StartTotal = time.Since(t0)
	r.log.Info("density: sandboxes running", "count", len(ids), "took", d.StartTotal.Round(time.Millisecond))

	time.Sleep(densitySettle)
	r.idle(ctx)
	if d.With, err = r.memSnapshot(); err != nil {
		return err
	}
	if err := r.measureSandboxes(ctx, ids, d); err != nil {
		return err
	}
	if err := r.timedRemove(ctx, ids, d); err != nil {
		return err
	}
	ids = nil
	time.Sleep(densitySettle)
	r.idle(ctx)
	d.After, err = r.memSnapshot()
	return err
}

// startSleeper creates a sandbox and starts `sleep 3600` in it without
// waiting for it: the stream is closed once the process runs.
func (r *rig) startSleeper(ctx context.Context) (string, error) {
	sb, err := r.create(ctx, api.CreateRequest{})
	if err != nil {
		return "", err
	}
	st, err := r.client.ExecStream(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "3600"}}, false)
	if err != nil {
		return sb.ID, fmt.Errorf("starting sleep in %s: %w", sb.ID, err)
	}
	st.Close()
	return sb.ID, nil
}

func (r *rig) measureSandboxes(ctx context.Context, ids []string, d *densityRun) error {
	for _, id := range ids {
		sb, err := r.client.Get(ctx, id)
		if err != nil {
			return fmt.Errorf("inspecting %s: %w", id, err)
		}
		if sb.Runtime == nil || sb.Runtime.HostPID == 0 {
			return fmt.Errorf("sandbox %s reports no host pid", id)
		}
		m := sandboxMemory{CgroupMem: -1}
		if m.GuestRSS, err = procStatusBytes(sb.Runtime.HostPID, "VmRSS"); err != nil {
			return fmt.Errorf("reading guest RSS of %s: %w", id, err)
		}
		m.GuestPSS, _ = kbField(fmt.Sprintf("/proc/%d/smaps_rollup", sb.Runtime.HostPID), "Pss")
		if mem, err := cgroupMemory(sb.Runtime.Cgroup); err == nil {
			m.CgroupMem = mem
		}
		pids, _ := cgroupProcs(sb.Runtime.Cgroup)
		for _, pid := range pids {
			rss, err := procStatusBytes(pid, "VmRSS")
			if err == nil {
				m.ProcsRSS += rss
				m.Procs++
			}
			if st, err := readProcStat(pid); err == nil && st.Comm == "sleep" {
				d.Sleeping++
			}
		}
		d.Sandboxes = append(d.Sandboxes, m)
	}
	return nil
}

func (r *rig) timedRemove(ctx context.Context, ids []string, d *densityRun) error {
	t0 := time.Now()
	for _, id := range ids {
		t1 := time.Now()
		if err := r.remove(ctx, id); err != nil {
			return err
		}
		d.Removes = append(d.Removes, time.Since(t1))
	}
	d.RemoveTotal = time.Since(t0)
	return nil
}

func densityMethod() []string {
	return []string{
		fmt.Sprintf("After one warm-up sandbox, %d sandboxes are started back to back (default image and limits). "+
			"Each start is `Create` then `ExecStream(sleep 3600)`, whose stream is closed as soon as the process runs; "+
			"the clock runs around both calls.", densityCount),
		fmt.Sprintf("Memory is read %s after the last start, once the daemon is idle: the daemon's VmRSS "+
			"(/proc/PID/status), the host's MemAvailable (/proc/meminfo) against the same readings before the first start, "+
			"and for each sandbox the VmRSS and PSS of its guest (host pid from `Get`: `runtime.host_pid`), the VmRSS of "+
			"every process in its cgroup, and its memory cgroup's charge.", densitySettle),
		"MemAvailable also moves with unrelated activity on the host and with the page cache of the sandboxes' disk images: " +
			"read it as an estimate. RSS counts shared pages in every process that maps them; PSS splits them.",
		"Then the sandboxes are removed one by one (`Delete` with force), timed, and the daemon's RSS is read again.",
	}
}

func densityTable(s *section, d *densityRun) {
	t := table{Header: []string{"measure", "value"}}
	if len(d.Starts) > 0 {
		sm := summarize(d.Starts)
		t.add(fmt.Sprintf("start %d sandboxes back to back", len(d.Starts)),
			fmt.Sprintf("%s total; per sandbox median %s, p90 %s, max %s", seconds(d.StartTotal), ms(sm.Median), ms(sm.P90), ms(sm.Max)))
	}
	if len(d.Sandboxes) > 0 {
		n := int64(len(d.Sandboxes))
		t.add("sandboxes whose `sleep` was running when measured", fmt.Sprintf("%d of %d", d.Sleeping, n))
		t.add("daemon RSS: before / with them / after removing them", fmt.Sprintf("%s / %s / %s", mib(d.Before.DaemonRSS), mib(d.With.DaemonRSS), afterRSS(d)))
		t.add("daemon RSS growth per sandbox", mib((d.With.DaemonRSS-d.Before.DaemonRSS)/n))
		t.add("host MemAvailable drop ÷ sandboxes", mib((d.Before.Available-d.With.Available)/n))
		var guest, pss, procs, cg int64
		var nproc, ncg int
		for _, m := range d.Sandboxes {
			guest += m.GuestRSS
			pss += m.GuestPSS
			procs += m.ProcsRSS
			nproc += m.Procs
			if m.CgroupMem >= 0 {
				cg += m.CgroupMem
				ncg++
			}
		}
		t.add("guest (PID 1) RSS: sum / per sandbox", fmt.Sprintf("%s / %s", mib(guest), mib(guest/n)))
		t.add("guest PSS per sandbox", mib(pss/n))
		t.add("RSS of every process in a sandbox (guest + sleep) per sandbox", fmt.Sprintf("%s (%.1f processes each)", mib(procs/n), float64(nproc)/float64(n)))
		if ncg > 0 {
			t.add("memory cgroup charge per sandbox", mib(cg/int64(ncg)))
		}
	}
	if len(d.Removes) > 0 {
		sm := summarize(d.Removes)
		t.add(fmt.Sprintf("remove %d sandboxes one by one", len(d.Removes)),
			fmt.Sprintf("%s total; per sandbox median %s, p90 %s, max %s", seconds(d.RemoveTotal), ms(sm.Median), ms(sm.P90), ms(sm.Max)))
	}
	s.Tables = append(s.Tables, t)
	if len(d.Sandboxes) > 0 && d.Sleeping < len(d.Sandboxes) {
		s.note("only %d of %d sandboxes still ran their `sleep` when measured: closing an exec stream may have ended the process", d.Sleeping, len(d.Sandboxes))
	}
	if d.After.DaemonRSS > 0 && d.After.DaemonRSS > d.Before.DaemonRSS+(d.With.DaemonRSS-d.Before.DaemonRSS)/2 {
		s.note("after all sandboxes were removed the daemon still held more than half of the RSS it had grown by (%s before, %s after): a leak, or memory the Go runtime has not yet returned",
			mib(d.Before.DaemonRSS), mib(d.After.DaemonRSS))
	}
}

func afterRSS(d *densityRun) string {
	if d.After.DaemonRSS == 0 {
		return noPeerValue
	}
	return mib(d.After.DaemonRSS)
}

func densityBars(d *densityRun) []bar {
	b := bar{Issue: 2, What: fmt.Sprintf("%d sandboxes running sleep: daemon RSS and per-sandbox host memory", densityCount),
		Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if n := int64(len(d.Sandboxes)); n == densityCount {
		b.Value = fmt.Sprintf("daemon RSS %s → %s; per sandbox %s (MemAvailable drop), guest RSS %s",
			mib(d.Before.DaemonRSS), mib(d.With.DaemonRSS), mib((d.Before.Available-d.With.Available)/n), mib(sumGuestRSS(d)/n))
		b.Verdict = reported
	}
	return []bar{b}
}

func sumGuestRSS(d *densityRun) int64 {
	var s int64
	for _, m := range d.Sandboxes {
		s += m.GuestRSS
	}
	return s
}
