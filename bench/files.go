package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// filePath is where the files benchmark writes its 1 GiB file: the
// sandbox's disk, not a tmpfs.
const filePath = "/workspace/big.bin"

// fileRun is what the files benchmark measured.
type fileRun struct {
	Up, Down           []time.Duration
	UpCPU, DownCPU     cpuUse
	BeforeRSS, PeakRSS int64
}

func benchFiles(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		fmt.Sprintf("**Upload**: `client.WriteFile` of 1 GiB to `%s` (the sandbox's disk): a 1 MiB block of random bytes "+
			"repeated, sent as the request body. The clock runs around the call, which returns once the daemon has "+
			"written the data to a temporary file, synced it and renamed it over the path (an atomic write); %d runs.", filePath, streamRuns),
		fmt.Sprintf("**Download**: `client.ReadFile` of the same file into a byte-counting writer, 1 warm-up and %d timed "+
			"runs (the file is in the page cache: the sandbox's memory limit is %d GiB). Every run must move exactly 1 GiB (WriteFile's answer "+
			"must report 1 GiB); after the uploads `cmp` in the sandbox checks every 1 MiB of the file against the block sent. MB/s = 10^6 bytes/s.", streamRuns, streamMemory>>30),
		fmt.Sprintf("The daemon's VmRSS is sampled every %s during the transfers: files stream, they are not held in memory.", rssSampleEvery),
	}}
	var f fileRun
	s.Err = r.fileTransfers(ctx, &f)
	tbl := table{Header: []string{"file transfer of 1 GiB (files API)", "runs", "median", "best", "median time"}}
	for _, row := range []struct {
		what    string
		samples []time.Duration
	}{{"upload: SDK → WriteFile (synced)", f.Up}, {"download: ReadFile → SDK", f.Down}} {
		if len(row.samples) == 0 {
			continue
		}
		sm := summarize(row.samples)
		tbl.add(row.what, fmt.Sprint(sm.N), fmt.Sprintf("%.0f MB/s", mbps(streamSize, sm.Median)),
			fmt.Sprintf("%.0f MB/s", mbps(streamSize, sm.Min)), seconds(sm.Median))
	}
	s.Tables = append(s.Tables, tbl)
	if f.PeakRSS > 0 {
		s.note("the daemon's RSS was %s before the transfers and at most %s during them", mib(f.BeforeRSS), mib(f.PeakRSS))
	}
	if len(f.Up) > 0 {
		s.note("CPU time over the %d uploads: %s. The guest's share is kernel time writing the page cache: on this VM "+
			"memory the kernel has not touched for a while costs about 3.5 s of system time per GiB to fault in again "+
			"(a python3 loop writing 1 GiB in a sandbox: 3.6 s the first time, 0.3 s right after)", len(f.Up), f.UpCPU)
	}
	if len(f.Down) > 0 {
		s.note("CPU time over the %d timed downloads: %s", len(f.Down), f.DownCPU)
	}
	b := bar{Issue: 3, What: "file upload and download of 1 GiB through the files API, medians", Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if len(f.Up) > 0 && len(f.Down) > 0 {
		b.Value = fmt.Sprintf("upload %.0f MB/s (synced to disk), download %.0f MB/s",
			mbps(streamSize, summarize(f.Up).Median), mbps(streamSize, summarize(f.Down).Median))
		b.Verdict = reported
	}
	s.Bars = []bar{b}
	return s
}

// repeatBlock reads as one random block repeated: incompressible data
// at no cost to the sender.
type repeatBlock struct {
	block []byte
	off   int
}

func (b *repeatBlock) Read(p []byte) (int, error) {
	n := copy(p, b.block[b.off:])
	b.off = (b.off + n) % len(b.block)
	return n, nil
}

func newRepeatBlock() *repeatBlock {
	block := make([]byte, 1<<20)
	rng := rand.NewChaCha8([32]byte{'p', 'a', 'd', 'd', 'o', 'c', 'k'})
	rng.Read(block)
	return &repeatBlock{block: block}
}

func (r *rig) fileTransfers(ctx context.Context, f *fileRun) error {
	req := api.CreateRequest{Resources: api.Resources{MemoryBytes: streamMemory}}
	return r.withSandbox(ctx, req, func(id string) error {
		data := newRepeatBlock()
		// The sandbox gets the block too, to check the upload with cmp.
		if _, err := r.client.WriteFile(ctx, id, "/tmp/block", bytes.NewReader(data.block), client.WriteOptions{}); err != nil {
			return fmt.Errorf("writing the reference block: %w", err)
		}
		r.idle(ctx)
		f.BeforeRSS, _ = r.daemon.rss()
		stopRSS := r.sampleRSS(&f.PeakRSS)
		defer stopRSS()
		sbs := []api.RuntimeInfo{r.runtimeOf(ctx, id)}
		m := startCPU(r.daemon.pid(), sbs)
		for range streamRuns {
			data.off = 0
			t0 := time.Now()
			fi, err := r.client.WriteFile(ctx, id, filePath, io.LimitReader(data, streamSize), client.WriteOptions{})
			if err != nil {
				return fmt.Errorf("uploading 1 GiB: %w", err)
			}
			f.Up = append(f.Up, time.Since(t0))
			if fi.Size != streamSize {
				return fmt.Errorf("the uploaded file has %d bytes, want %d", fi.Size, streamSize)
			}
		}
		f.UpCPU = m.stop()
		check := fmt.Sprintf("for i in $(seq 0 1023); do cmp -s -n 1048576 -i 0:$((i*1048576)) /tmp/block %s || { echo block $i differs; exit 1; }; done", filePath)
		if err := r.exec(ctx, id, nil, "sh", "-c", check); err != nil {
			return fmt.Errorf("checking the uploaded file: %w", err)
		}
		r.idle(ctx)
		if _, err := r.readFile(ctx, id); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		m = startCPU(r.daemon.pid(), sbs)
		for range streamRuns {
			d, err := r.readFile(ctx, id)
			if err != nil {
				return err
			}
			f.Down = append(f.Down, d)
		}
		f.DownCPU = m.stop()
		return nil
	})
}

func (r *rig) readFile(ctx context.Context, id string) (time.Duration, error) {
	t0 := time.Now()
	rc, err := r.client.ReadFile(ctx, id, filePath)
	if err != nil {
		return 0, fmt.Errorf("downloading 1 GiB: %w", err)
	}
	defer rc.Close()
	cw := &countWriter{}
	if _, err := io.Copy(cw, rc); err != nil {
		return 0, fmt.Errorf("downloading 1 GiB: %w", err)
	}
	d := time.Since(t0)
	if cw.n != streamSize {
		return 0, fmt.Errorf("ReadFile delivered %d bytes, want %d", cw.n, streamSize)
	}
	return d, nil
}
