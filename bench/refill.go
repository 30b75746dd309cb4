package main

// Issue 21: pools must refill "without stealing the CPU the running
// sandboxes need (measure the foreground exec RTT while they refill)".

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	refillRounds  = 4
	refillSamples = 50                     // per phase and round
	refillLead    = 200 * time.Millisecond // drainer running before the busy phase's samples
	refillPoll    = 50 * time.Millisecond  // how often the pool's ready count is read
)

// refillRun is what the refill benchmark measured.
type refillRun struct {
	Idle, Busy []time.Duration
	Cycles     int           // the drainer's create → delete cycles
	DrainTime  time.Duration // how long it ran in all
	MinReady   int           // the default pool's fewest ready guests seen while it ran
	Target     int
	DrainErr   error
}

func refillMethod() []string {
	return []string{
		fmt.Sprintf("One sandbox (default image) is the foreground. %d rounds, each of two phases of %d SDK exec round trips of `true` in it "+
			"(clock around `client.Exec`, as in the exec table). **Idle**: taken once the default pool (`%s`) is full and the daemon idle. "+
			"**While the pool refills**: a second SDK client, on its own connections, loops `Create` (default image) → `Delete` with force as fast "+
			"as it can, taking the pool's warm guests as soon as they are ready and so keeping the daemon refilling; its loop starts %s before the "+
			"phase's first sample and stops after its last.", refillRounds, refillSamples, defaultPool, refillLead),
		fmt.Sprintf("The pool's ready count is read every %s while the drainer runs; the fewest seen shows that it was drained. "+
			"On this 2-core machine the drainer's own requests and the daemon's answers to them share the CPU with the foreground too, "+
			"not only the refill.", refillPoll),
	}
}

// benchRefill measures the exec round trip in a running sandbox while
// another client drains the default pool, against the same when idle.
func benchRefill(ctx context.Context, r *rig) *section {
	s := &section{Method: refillMethod()}
	var run refillRun
	s.Err = r.withSandbox(ctx, api.CreateRequest{}, func(id string) error { return r.refill(ctx, id, &run) })
	is, bs := summarize(run.Idle), summarize(run.Busy)
	t := table{Header: []string{"exec round trip of `true`", "n", "median", "p90", "p99", "÷ idle median"}}
	if is.N > 0 {
		t.add("idle (pools full)", fmt.Sprint(is.N), ms(is.Median), ms(is.P90), ms(is.P99), "1.00×")
	}
	if bs.N > 0 {
		t.add("while another client drains the pool", fmt.Sprint(bs.N), ms(bs.Median), ms(bs.P90), ms(bs.P99), ratio(bs.Median, is.Median))
	}
	s.Tables = append(s.Tables, t)
	if run.DrainTime > 0 {
		s.note("the drainer ran %d create → delete cycles in %s (%.1f/s); the pool's ready guests fell to %d of %d",
			run.Cycles, seconds(run.DrainTime), float64(run.Cycles)/run.DrainTime.Seconds(), run.MinReady, run.Target)
	}
	b := bar{Issue: 21, What: "foreground exec round trip of `true` while another client drains the default pool (it refills), vs idle",
		Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if is.N > 0 && bs.N > 0 {
		b.Value = fmt.Sprintf("median %s vs %s idle (%s), p99 %s vs %s", ms(bs.Median), ms(is.Median), ratio(bs.Median, is.Median), ms(bs.P99), ms(is.P99))
		b.Verdict = reported
	}
	s.Bars = []bar{b}
	return s
}

func (r *rig) refill(ctx context.Context, id string, run *refillRun) error {
	drainer, err := client.New(r.daemon.host)
	if err != nil {
		return fmt.Errorf("making the drainer's client: %w", err)
	}
	defer drainer.Close()
	run.MinReady = -1
	for range refillRounds {
		if err := r.waitFullPool(ctx, defaultPool); err != nil {
			return err
		}
		idle, err := r.rttBlock(ctx, id)
		run.Idle = append(run.Idle, idle...)
		if err != nil {
			return err
		}
		busy, err := r.whileDraining(ctx, drainer, run, func() ([]time.Duration, error) {
			time.Sleep(refillLead)
			return r.rttBlock(ctx, id)
		})
		run.Busy = append(run.Busy, busy...)
		if err != nil {
			return err
		}
	}
	return nil
}

// rttBlock takes refillSamples exec round trips of `true`.
func (r *rig) rttBlock(ctx context.Context, id string) ([]time.Duration, error) {
	return r.execTrues(ctx, id, refillSamples)
}

// whileDraining runs f while c loops create → delete and a watcher reads
// the default pool's ready count; both stop when f returns.
func (r *rig) whileDraining(ctx context.Context, c *client.Client, run *refillRun, f func() ([]time.Duration, error)) ([]time.Duration, error) {
	dctx, stop := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		drainErr error
		cycles   int
	)
	t0 := time.Now()
	wg.Add(2)
	go func() {
		defer wg.Done()
		for dctx.Err() == nil {
			// A cycle runs to its end after the stop, on its own
			// deadline: a create cut off mid-way could leave a sandbox
			// the harness never heard of.
			cctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			sb, err := c.Create(cctx, api.CreateRequest{})
			if err != nil {
				cancel()
				drainErr = fmt.Errorf("drainer: %w", err)
				return
			}
			r.track(sb.ID)
			err = c.Delete(cctx, sb.ID, true)
			cancel()
			if err != nil && !client.IsNotFound(err) {
				drainErr = fmt.Errorf("drainer: removing %s: %w", sb.ID, err)
				return
			}
			r.untrack(sb.ID)
			cycles++
		}
	}()
	go func() {
		defer wg.Done()
		for dctx.Err() == nil {
			if p, err := r.client.Pools(dctx); err == nil {
				if n := p.Ready[defaultPool]; run.MinReady < 0 || n < run.MinReady {
					run.MinReady = n
				}
				run.Target = p.Target[defaultPool]
			}
			select {
			case <-dctx.Done():
			case <-time.After(refillPoll):
			}
		}
	}()
	out, err := f()
	stop()
	wg.Wait()
	run.DrainTime += time.Since(t0)
	run.Cycles += cycles
	return out, errors.Join(err, drainErr)
}
