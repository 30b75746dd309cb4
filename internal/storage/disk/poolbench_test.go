package disk

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Pool-level benchmarks: what a sandbox's create and delete cost through
// the exported API, on an XFS substrate with 10 GiB disks, thin (the
// bench's --disk-overcommit 100) and a pool of 4 (the daemon's default).

func rusage(tb testing.TB, who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is the CPU time this process and its waited-for children
// (mkfs) have used; threadCPU the calling thread's, childrenCPU the
// children's.
func processCPU(tb testing.TB) time.Duration {
	return rusage(tb, unix.RUSAGE_SELF) + childrenCPU(tb)
}

func threadCPU(tb testing.TB) time.Duration { return rusage(tb, unix.RUSAGE_THREAD) }

func childrenCPU(tb testing.TB) time.Duration { return rusage(tb, unix.RUSAGE_CHILDREN) }

// machineBusy is the time every CPU spent not idle, from /proc/stat:
// kernel threads' work too, and other processes', so compare it only on a
// quiet machine.
func machineBusy(tb testing.TB) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	var user, nice, system, idle, iowait, irq, softirq uint64
	if _, err := fmt.Sscanf(string(b), "cpu %d %d %d %d %d %d %d", &user, &nice, &system, &idle, &iowait, &irq, &softirq); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(user+nice+system+irq+softirq) * 10 * time.Millisecond // USER_HZ is 100
}

func churnPool(b *testing.B, poolSize int) *Pool {
	b.Helper()
	s := testSubstrate(b, SubstrateOptions{Size: 256 << 30})
	p := substratePool(b, s, Config{DefaultSize: DefaultSize, PoolSize: poolSize, Overcommit: 100, Logger: slog.New(slog.DiscardHandler)})
	waitReady(b, p, poolSize)
	return p
}

// BenchmarkPoolChurn loops Acquire, a sandbox's few files, then Remove
// (or Recycle), from one client and from eight at once, with the pool
// refilling behind them. Reported: the wall and calling thread's CPU of
// each call, the cycles per second, and per cycle the CPU of the whole
// process (refill and removals included, until Close has finished them)
// and of the whole machine.
func BenchmarkPoolChurn(b *testing.B) {
	for _, bc := range []struct {
		name    string
		clients int
		recycle bool
	}{{"1", 1, false}, {"8", 8, false}, {"1-recycle", 1, true}, {"8-recycle", 8, true}} {
		clients := bc.clients
		remove := func(p *Pool) func(context.Context, string) error {
			if bc.recycle {
				return p.Recycle
			}
			return p.Remove
		}
		b.Run(bc.name, func(b *testing.B) {
			p := churnPool(b, 4)
			ctx := context.Background()
			var mu sync.Mutex
			var acqWall, acqCPU, remWall, remCPU time.Duration
			var n int
			cpu0, busy0, t0 := processCPU(b), machineBusy(b), time.Now()
			var wg sync.WaitGroup
			work := make(chan int)
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					for i := range work {
						id := fmt.Sprintf("c%d-%d", c, i)
						c0, w0 := threadCPU(b), time.Now()
						v, err := p.Acquire(ctx, id, 0, 1000, 1000)
						if err != nil {
							b.Error(err)
							return
						}
						sandboxFiles(b, v.Path)
						c1, w1 := threadCPU(b), time.Now()
						if err := remove(p)(ctx, id); err != nil {
							b.Error(err)
							return
						}
						c2, w2 := threadCPU(b), time.Now()
						mu.Lock()
						acqWall, acqCPU = acqWall+w1.Sub(w0), acqCPU+c1-c0
						remWall, remCPU = remWall+w2.Sub(w1), remCPU+c2-c1
						n++
						mu.Unlock()
					}
				}()
			}
			for i := 0; b.Loop(); i++ {
				work <- i
			}
			close(work)
			wg.Wait()
			elapsed := time.Since(t0)
			if err := p.Close(); err != nil {
				b.Fatal(err)
			}
			cpu, busy := processCPU(b)-cpu0, machineBusy(b)-busy0
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
			b.ReportMetric(us(acqWall), "acquire-µs")
			b.ReportMetric(us(acqCPU), "acquire-cpu-µs")
			b.ReportMetric(us(remWall), "remove-µs")
			b.ReportMetric(us(remCPU), "remove-cpu-µs")
			b.ReportMetric(float64(n)/elapsed.Seconds(), "cycles/s")
			b.ReportMetric(us(cpu), "process-cpu-µs/cycle")
			b.ReportMetric(us(busy), "machine-busy-µs/cycle")
		})
	}
}

// sandboxFiles writes what a short-lived sandbox leaves on its disk: the
// overlay's upper and work directories and a few small files.
func sandboxFiles(tb testing.TB, root string) {
	for _, d := range []string{"upper/etc", "upper/tmp", "work/work"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, f := range []string{"upper/etc/hostname", "upper/etc/hosts", "upper/tmp/out"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("hi\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkPoolRefill empties a pool of 16 and times its refill:
// disks/s is the rate at which the pool makes ready volumes.
func BenchmarkPoolRefill(b *testing.B) {
	const size = 16
	p := churnPool(b, size)
	ctx := context.Background()
	var refill time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range size {
			if _, err := p.Acquire(ctx, fmt.Sprintf("r%d", j), 0, 1000, 1000); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0 := time.Now()
		waitReady(b, p, size)
		refill += time.Since(t0)
		b.StopTimer()
		for j := range size {
			if err := p.Remove(ctx, fmt.Sprintf("r%d", j)); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(300 * time.Millisecond) // removals done before the next
		b.StartTimer()
	}
	b.ReportMetric(float64(size*b.N)/refill.Seconds(), "disks/s")
}

// BenchmarkSeedChurn loops AcquireFrom of a template-like image (its
// upper directory holding files entries in directories of eight), a
// sandbox's few files, then Recycle: from a seed (one image, used again
// and again) and cloned (nine copies of it in turn, each a first use for
// the pool, which remembers eight). Per cycle: the process's CPU (the
// mirrors, wipes, clones, mounts and teardowns, until Close has finished
// them) and the machine's busy time, which holds the kernel's loop and
// XFS workers: where a seed pays off and where a clone is cheaper.
func BenchmarkSeedChurn(b *testing.B) {
	for _, files := range []int{16, 64, 128} {
		for _, mode := range []string{"seed", "clone"} {
			b.Run(fmt.Sprintf("%s-%d", mode, files), func(b *testing.B) {
				p := churnPool(b, 4)
				ctx := context.Background()
				parent, err := p.Acquire(ctx, "parent", 0, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				for i := range files {
					dir := filepath.Join(parent.Path, "upper", fmt.Sprint("d", i/8))
					if err := os.MkdirAll(dir, 0o755); err != nil {
						b.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("f", i)), []byte("template file\n"), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				base := filepath.Dir(filepath.Dir(parent.Path))
				images := []string{filepath.Join(base, "tpl0.img")}
				if _, err := p.Snapshot(ctx, "parent", images[0], nil); err != nil {
					b.Fatal(err)
				}
				if mode == "clone" {
					for i := 1; i < 9; i++ {
						images = append(images, filepath.Join(base, fmt.Sprintf("tpl%d.img", i)))
						if err := Clone(images[0], images[i]); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.Cleanup(func() {
					for _, img := range images {
						os.Remove(img)
					}
				})
				cycle := func(i int) {
					id := fmt.Sprint("s", i)
					v, err := p.AcquireFrom(ctx, id, images[i%len(images)], 0, 0)
					if err != nil {
						b.Fatal(err)
					}
					sandboxFiles(b, v.Path)
					if err := p.Recycle(ctx, id); err != nil {
						b.Fatal(err)
					}
				}
				for i := range 3 { // the seed's first uses
					cycle(1<<20 + i)
				}
				p.reaper.wait()
				cpu0, busy0 := processCPU(b), machineBusy(b)
				n := 0
				for i := 0; b.Loop(); i++ {
					cycle(i)
					n++
				}
				p.reaper.wait()
				cpu, busy := processCPU(b)-cpu0, machineBusy(b)-busy0
				b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(n), "process-cpu-µs/cycle")
				b.ReportMetric(float64(busy)/float64(time.Microsecond)/float64(n), "machine-busy-µs/cycle")
			})
		}
	}
}
