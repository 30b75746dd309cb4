package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	streamSize     = 1 << 30
	streamRuns     = 3
	streamBarMBps  = 500.0
	streamMemory   = 3 << 30 // keeps the 1 GiB file in the page cache
	rssSampleEvery = 50 * time.Millisecond

	fanSandboxes = 20
	fanExecs     = 200
	fanLines     = 200
	fanInterval  = 10 * time.Millisecond
)

// fanScript prints "SEQ UNIX_NANOS" lines at a fixed interval, without a
// fork per line. Arguments: count, interval in seconds.
const fanScript = `import sys, time
out = sys.stdout.buffer
n, step = int(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
for i in range(n):
    out.write(b"%d %d\n" % (i, time.time_ns()))
    out.flush()
    d = start + (i + 1) * step - time.monotonic()
    if d > 0:
        time.sleep(d)
`

// throughputRun is what the 1 GiB stream measured.
type throughputRun struct {
	Prepare   time.Duration
	Down      []time.Duration
	Up        time.Duration
	PeakRSS   int64 // the daemon's, sampled during the transfers
	BeforeRSS int64
	DownCPU   cpuUse // over the timed downloads
	UpCPU     cpuUse
}

// fanRun is what the concurrent streams measured.
type fanRun struct {
	Execs, Failed                   int
	Lines, Missing, Late, Malformed int
	Gap, Tail, Lossy                int // missing inside a stream, at its end; streams that lost any
	Latency                         []time.Duration
	Wall                            time.Duration
	CPU                             cpuUse
	Errors                          []string
}

func benchStream(ctx context.Context, r *rig) *section {
	s := &section{Method: streamMethod()}
	var tp throughputRun
	var fan fanRun
	err := r.throughput(ctx, &tp)
	if ctx.Err() == nil {
		err = errors.Join(err, r.fanOut(ctx, &fan))
	}
	s.Err = err
	throughputTable(s, &tp)
	fanTable(s, &fan)
	s.Bars = append(throughputBars(&tp), fanBars(&fan))
	s.note("upload and download through the files API are in their own section (\"files\")")
	return s
}

func streamMethod() []string {
	return []string{
		fmt.Sprintf("**Download**: in one sandbox (memory limit raised to %d GiB so that the file stays in the page cache), "+
			"`head -c 1073741824 /dev/zero > /tmp/f` is run untimed; then `Exec(cat /tmp/f)` into a byte-counting writer, "+
			"1 warm-up and %d timed runs. The clock runs around the Exec call; every run must deliver exactly 1 GiB. MB/s = 10^6 bytes/s.", streamMemory>>30, streamRuns),
		"**Upload**: `Exec(wc -c)` with 1 GiB of zeros streamed as its stdin (the SDK's upgraded exec stream), timed the same way; " +
			"`wc` must count 1073741824 bytes. It measures the stream, not the sandbox's disk.",
		fmt.Sprintf("The daemon's VmRSS is sampled every %s during the transfers.", rssSampleEvery),
		fmt.Sprintf("**Concurrent streams**: %d sandboxes; %d execs (%d per sandbox) start together, each running a python3 "+
			"loop that prints `SEQ UNIX_NANOS` every %s, %d lines (%s). The SDK's stdout writer stamps each line on "+
			"arrival; frame latency = arrival − the line's timestamp (same host, same clock). A missing sequence number "+
			"is a dropped line.", fanSandboxes, fanExecs, fanExecs/fanSandboxes, fanInterval, fanLines,
			time.Duration(fanLines)*fanInterval),
	}
}

func (r *rig) throughput(ctx context.Context, t *throughputRun) error {
	req := api.CreateRequest{Resources: api.Resources{MemoryBytes: streamMemory}}
	return r.withSandbox(ctx, req, func(id string) error {
		t0 := time.Now()
		if err := r.exec(ctx, id, nil, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero > /tmp/f", streamSize)); err != nil {
			return fmt.Errorf("writing the 1 GiB file: %w", err)
		}
		t.Prepare = time.Since(t0)
		r.idle(ctx)
		t.BeforeRSS, _ = r.daemon.rss()
		stopRSS := r.sampleRSS(&t.PeakRSS)
		defer stopRSS()
		if _, err := r.download(ctx, id); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		sbs := []api.RuntimeInfo{r.runtimeOf(ctx, id)}
		m := startCPU(r.daemon.pid(), sbs)
		for i := 0; i < streamRuns; i++ {
			d, err := r.download(ctx, id)
			if err != nil {
				return err
			}
			t.Down = append(t.Down, d)
		}
		t.DownCPU = m.stop()
		r.log.Info("stream: download done", "runs", streamRuns)
		m = startCPU(r.daemon.pid(), sbs)
		var err error
		t.Up, err = r.upload(ctx, id)
		t.UpCPU = m.stop()
		return err
	})
}

// countWriter counts bytes.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

func (r *rig) download(ctx context.Context, id string) (time.Duration, error) {
	return timedCat(ctx, r.client, id)
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func (r *rig) upload(ctx context.Context, id string) (time.Duration, error) {
	cmd := []string{"wc", "-c"}
	var out, stderr strings.Builder
	t0 := time.Now()
	st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd},
		client.ExecIO{Stdin: io.LimitReader(zeros{}, streamSize), Stdout: &out, Stderr: &stderr})
	d := time.Since(t0)
	if err := execResult(cmd, st, err, stderr.String()); err != nil {
		return 0, err
	}
	if got := strings.TrimSpace(out.String()); got != strconv.Itoa(streamSize) {
		return 0, fmt.Errorf("wc counted %q bytes of stdin, want %d", got, streamSize)
	}
	return d, nil
}

// sampleRSS records the daemon's peak VmRSS into peak until the returned
// function is called.
func (r *rig) sampleRSS(peak *int64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(rssSampleEvery)
		defer tick.Stop()
		for {
			if rss, err := r.daemon.rss(); err == nil && rss > *peak {
				*peak = rss
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

func mbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e6
}

func throughputTable(s *section, t *throughputRun) {
	tbl := table{Header: []string{"transfer of 1 GiB", "runs", "median", "best", "median time"}}
	if len(t.Down) > 0 {
		sm := summarize(t.Down)
		tbl.add("download: exec `cat` → SDK stdout", fmt.Sprint(sm.N),
			fmt.Sprintf("%.0f MB/s", mbps(streamSize, sm.Median)), fmt.Sprintf("%.0f MB/s", mbps(streamSize, sm.Min)), seconds(sm.Median))
	}
	if t.Up > 0 {
		tbl.add("upload: SDK stdin → exec `wc -c`", "1",
			fmt.Sprintf("%.0f MB/s", mbps(streamSize, t.Up)), "", seconds(t.Up))
	}
	s.Tables = append(s.Tables, tbl)
	if t.Prepare > 0 {
		s.note("writing the 1 GiB file in the sandbox took %s", seconds(t.Prepare))
	}
	if t.PeakRSS > 0 {
		s.note("the daemon's RSS was %s before the transfers and at most %s during them", mib(t.BeforeRSS), mib(t.PeakRSS))
	}
	if len(t.Down) > 0 {
		s.note("CPU time over the %d timed downloads (%s moved): %s", len(t.Down), mib(int64(len(t.Down))*streamSize), t.DownCPU)
	}
	if t.Up > 0 {
		s.note("CPU time over the upload: %s", t.UpCPU)
	}
}

func throughputBars(t *throughputRun) []bar {
	b1 := bar{Issue: 3, What: "streaming throughput of `cat` of a 1 GiB file through exec, median", Target: "≥ 500 MB/s", Value: noPeerValue, Verdict: notMeasured}
	b2 := bar{Issue: 3, What: "upload and download throughput", Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if len(t.Down) > 0 {
		down := mbps(streamSize, summarize(t.Down).Median)
		b1.Value, b1.Verdict = fmt.Sprintf("%.0f MB/s", down), check(down >= streamBarMBps)
		if t.Up > 0 {
			b2.Value = fmt.Sprintf("download %.0f MB/s, upload %.0f MB/s (through exec)", down, mbps(streamSize, t.Up))
			b2.Verdict = reported
		}
	}
	return []bar{b1, b2}
}

// fanOut runs the concurrent streams.
func (r *rig) fanOut(ctx context.Context, f *fanRun) error {
	var ids []string
	var sbs []api.RuntimeInfo
	defer func() { r.removeAll(ids) }()
	for i := 0; i < fanSandboxes; i++ {
		sb, err := r.create(ctx, api.CreateRequest{})
		if err != nil {
			return err
		}
		ids = append(ids, sb.ID)
		sbs = append(sbs, r.runtimeOf(ctx, sb.ID))
	}
	r.idle(ctx)
	m := startCPU(r.daemon.pid(), sbs)
	results := make([]*lineWriter, fanExecs)
	errs := make([]error, fanExecs)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range fanExecs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = r.streamLines(ctx, ids[i%len(ids)])
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	f.Wall = time.Since(t0)
	f.CPU = m.stop()
	f.collect(results, errs)
	r.log.Info("stream: concurrent execs done", "execs", fanExecs, "missing", f.Missing, "failed", f.Failed)
	return ctx.Err()
}

func (r *rig) streamLines(ctx context.Context, id string) (*lineWriter, error) {
	cmd := []string{"python3", "-S", "-c", fanScript, strconv.Itoa(fanLines), strconv.FormatFloat(fanInterval.Seconds(), 'f', -1, 64)}
	lw := &lineWriter{}
	var stderr strings.Builder
	st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: lw, Stderr: &stderr})
	lw.finish(fanLines)
	return lw, execResult([]string{"python3", "(line printer)"}, st, err, stderr.String())
}

func (f *fanRun) collect(results []*lineWriter, errs []error) {
	f.Execs = len(results)
	for i, lw := range results {
		if errs[i] != nil {
			f.Failed++
			if len(f.Errors) < 5 {
				f.Errors = append(f.Errors, errs[i].Error())
			}
		}
		if lw == nil {
			f.Missing += fanLines
			f.Tail += fanLines
			f.Lossy++
			continue
		}
		f.Lines += lw.received
		f.Missing += lw.gap + lw.tail
		f.Gap += lw.gap
		f.Tail += lw.tail
		if lw.gap+lw.tail > 0 {
			f.Lossy++
		}
		f.Late += lw.late
		f.Malformed += lw.malformed
		f.Latency = append(f.Latency, lw.latency...)
	}
}

// lineWriter parses "SEQ UNIX_NANOS" lines as they arrive, stamping each
// with its arrival time and tracking gaps in the sequence.
type lineWriter struct {
	partial   []byte
	next      int
	received  int
	gap       int // missing lines followed by later ones
	tail      int // missing lines at the end: the stream ended early
	late      int // a sequence number at or below one already seen
	malformed int
	latency   []time.Duration
}

func (w *lineWriter) Write(p []byte) (int, error) {
	now := time.Now()
	data := append(w.partial, p...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		w.line(data[:i], now)
		data = data[i+1:]
	}
	w.partial = bytes.Clone(data)
	return len(p), nil
}

func (w *lineWriter) line(l []byte, now time.Time) {
	seqText, tsText, ok := strings.Cut(string(l), " ")
	seq, err1 := strconv.Atoi(seqText)
	ts, err2 := strconv.ParseInt(tsText, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		w.malformed++
		return
	}
	w.received++
	switch {
	case seq > w.next:
		w.gap += seq - w.next
	case seq < w.next:
		w.late++
	}
	w.next = max(w.next, seq+1)
	w.latency = append(w.latency, now.Sub(time.Unix(0, ts)))
}

// finish counts the lines that never came.
func (w *lineWriter) finish(want int) {
	if len(w.partial) > 0 {
		w.malformed++
	}
	if w.next < want {
		w.tail += want - w.next
	}
}

func fanTable(s *section, f *fanRun) {
	if f.Execs == 0 {
		return
	}
	want := f.Execs * fanLines
	t := table{Caption: "Concurrent streams:", Header: []string{"measure", "value"}}
	t.add("execs (failed)", fmt.Sprintf("%d (%d)", f.Execs, f.Failed))
	t.add("lines received / expected", fmt.Sprintf("%d / %d", f.Lines, want))
	t.add("dropped (missing) lines: total / inside a stream / at a stream's end", fmt.Sprintf("%d / %d / %d", f.Missing, f.Gap, f.Tail))
	t.add("streams that lost lines (all exited 0 unless counted as failed)", fmt.Sprint(f.Lossy))
	t.add("out-of-order or duplicate lines; malformed lines", fmt.Sprintf("%d; %d", f.Late, f.Malformed))
	if len(f.Latency) > 0 {
		sm := summarize(f.Latency)
		t.add("frame latency median / p90 / p99 / max", fmt.Sprintf("%s / %s / %s / %s", ms(sm.Median), ms(sm.P90), ms(sm.P99), ms(sm.Max)))
	}
	t.add("wall time for all streams (ideal ≈ "+seconds(time.Duration(fanLines)*fanInterval)+")", seconds(f.Wall))
	t.add("CPU time during the streams", f.CPU.String())
	s.Tables = append(s.Tables, t)
	for _, e := range f.Errors {
		s.note("a concurrent exec failed: %s", e)
	}
}

func fanBars(f *fanRun) bar {
	b := bar{Issue: 3, What: fmt.Sprintf("%d concurrent streaming execs across %d sandboxes: none dropped; p99 frame latency", fanExecs, fanSandboxes),
		Target: "0 dropped; p99 reported", Value: noPeerValue, Verdict: notMeasured}
	if f.Execs == 0 {
		return b
	}
	p99 := noPeerValue
	if len(f.Latency) > 0 {
		p99 = ms(summarize(f.Latency).P99)
	}
	b.Value = fmt.Sprintf("%d of %d lines dropped, %d execs failed; p99 %s", f.Missing, f.Execs*fanLines, f.Failed, p99)
	b.Verdict = check(f.Missing == 0 && f.Failed == 0 && f.Late == 0 && f.Malformed == 0)
	return b
}
