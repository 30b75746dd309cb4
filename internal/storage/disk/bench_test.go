package disk

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const benchData = 1 << 30 // what the benchmarks write: 1 GiB

// benchBase returns a directory for benchmark volumes: on the host's
// filesystem, or on an XFS substrate.
func benchBase(b *testing.B, xfs bool) string {
	b.Helper()
	if xfs {
		return testSubstrate(b, SubstrateOptions{Size: 16 << 30}).Dir()
	}
	return testDir(b)
}

// benchVolume makes a mounted volume in the new directory dir, attached
// with opts, and returns its root. It is torn down when b ends.
func benchVolume(b *testing.B, dir string, opts loopOptions) string {
	b.Helper()
	mkfs, err := findMkfs("")
	if err != nil {
		b.Skip(err)
	}
	log := testLogger(b)
	root := filepath.Join(dir, rootName)
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := teardown(context.Background(), dir, log); err != nil {
			b.Error(err)
		}
	})
	if err := formatPristine(mkfs, filepath.Join(dir, imageName), DefaultSize); err != nil {
		b.Fatal(err)
	}
	dev, err := mountLoop(filepath.Join(dir, imageName), root, "ext4", mountFlags, mountData, opts)
	if err != nil {
		b.Fatal(err)
	}
	if loopDirectIO(dev) != opts.directIO {
		b.Fatalf("%s: direct I/O %v, want %v", dev, loopDirectIO(dev), opts.directIO)
	}
	return root
}

// dropCaches evicts path and the image under it from the page cache, so a
// read comes from the disk.
func dropCaches(b *testing.B, paths ...string) {
	b.Helper()
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkLoopIO compares a volume's loop device buffered (the old
// attach) with direct I/O (volumeLoop), on the host's filesystem and on an
// XFS substrate: a 1 GiB write and fsync into a fresh volume, and a cold
// 1 GiB read.
func BenchmarkLoopIO(b *testing.B) {
	for _, fs := range []string{"host", "xfs"} {
		for _, mode := range []struct {
			name string
			opts loopOptions
		}{{"buffered", loopOptions{}}, {"direct", volumeLoop}} {
			b.Run(fs+"/"+mode.name+"/write", func(b *testing.B) {
				base := benchBase(b, fs == "xfs")
				var cached int64
				b.SetBytes(benchData)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dir := filepath.Join(base, "w"+strconv.Itoa(i))
					root := benchVolume(b, dir, mode.opts)
					b.StartTimer()
					writeFile(b, filepath.Join(root, "data"), benchData)
					b.StopTimer()
					cached += cachedBytes(b, filepath.Join(dir, imageName))
					b.StartTimer()
				}
				// What the written data costs the host a second time, in
				// the page cache of the image file.
				b.ReportMetric(float64(cached)/float64(b.N)/(1<<20), "image-cache-MiB")
			})
			b.Run(fs+"/"+mode.name+"/read", func(b *testing.B) {
				dir := filepath.Join(benchBase(b, fs == "xfs"), "r")
				root := benchVolume(b, dir, mode.opts)
				data := filepath.Join(root, "data")
				writeFile(b, data, benchData)
				buf := make([]byte, 1<<20)
				b.SetBytes(benchData)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dropCaches(b, data, filepath.Join(dir, imageName))
					f, err := os.Open(data)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := io.CopyBuffer(io.Discard, onlyReader{f}, buf); err != nil {
						b.Fatal(err)
					}
					f.Close()
				}
			})
		}
	}
}

// cachedBytes is how much of the file path is in the page cache.
func cachedBytes(b *testing.B, path string) int64 {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		b.Fatal(errno)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * int64(page)
}

// onlyReader hides WriterTo, so io.CopyBuffer reads with our buffer.
type onlyReader struct{ io.Reader }

// BenchmarkSnapshot1GiB snapshots a 10 GiB volume holding 1 GiB of data,
// reporting how long the sandbox was paused (frozen-ms), how long the
// filesystem was frozen (fsfrozen-ms) and the whole call (total-ms).
func BenchmarkSnapshot1GiB(b *testing.B) {
	for _, setup := range snapshotSetups {
		b.Run(setup.name, func(b *testing.B) {
			p, base := setup.make(b, 16<<30)
			v, err := p.Acquire(context.Background(), "bench", DefaultSize, 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			writeFile(b, filepath.Join(v.Path, "data"), benchData)
			pause := func() (func(), error) { return func() {}, nil }
			var frozen, fsFrozen, total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				snap := filepath.Join(base, "snap.img")
				c, err := p.Snapshot(context.Background(), "bench", snap, pause)
				if err != nil {
					b.Fatal(err)
				}
				frozen, fsFrozen, total = frozen+c.Frozen, fsFrozen+c.FSFrozen, total+c.Total
				b.StopTimer()
				if err := os.Remove(snap); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
			b.ReportMetric(ms(frozen), "frozen-ms")
			b.ReportMetric(ms(fsFrozen), "fsfrozen-ms")
			b.ReportMetric(ms(total), "total-ms")
		})
	}
}

// BenchmarkCloneImage clones a 10 GiB image file holding 1 GiB of data:
// FICLONE on the substrate, or a sparse copy.
func BenchmarkCloneImage(b *testing.B) {
	for _, setup := range snapshotSetups {
		b.Run(setup.name, func(b *testing.B) {
			base := benchBase(b, setup.substrate)
			src := filepath.Join(base, "src.img")
			writeFile(b, src, benchData)
			if err := os.Truncate(src, DefaultSize); err != nil {
				b.Fatal(err)
			}
			opts := cloneOptions{copyOnly: setup.forceCopy}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dst := filepath.Join(base, "dst.img")
				if _, err := cloneFile(context.Background(), src, dst, opts); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := os.Remove(dst); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// stepCost accumulates, per named step, the wall time and the CPU time
// the step cost: the calling thread's (it is locked to one) and its
// children's (mkfs). Kernel work that runs in other threads (loop
// workers, XFS and jbd2 workqueues) is not in it: BenchmarkDiskLife
// reports the whole machine's busy time beside it.
type stepCost struct {
	names []string
	wall  map[string]time.Duration
	cpu   map[string]time.Duration
	n     int
}

func newStepCost() *stepCost {
	return &stepCost{wall: map[string]time.Duration{}, cpu: map[string]time.Duration{}}
}

// step runs fn as the step name.
func (s *stepCost) step(tb testing.TB, name string, fn func() error) {
	tb.Helper()
	if _, ok := s.wall[name]; !ok {
		s.names = append(s.names, name)
	}
	c0, t0 := threadCPU(tb)+childrenCPU(tb), time.Now()
	if err := fn(); err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	s.wall[name] += time.Since(t0)
	s.cpu[name] += threadCPU(tb) + childrenCPU(tb) - c0
}

func (s *stepCost) report(b *testing.B) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(s.n) }
	for _, name := range s.names {
		b.ReportMetric(us(s.wall[name]), name+"-µs")
		b.ReportMetric(us(s.cpu[name]), name+"-cpu-µs")
	}
}

// BenchmarkDiskLife times each step of one default-size (10 GiB) disk's
// life on an XFS substrate, thin (the bench's --disk-overcommit 100), with
// eight other disks handed out: made (by each way the pool can make an
// image), attached, mounted, handed out, first written, removed. Each
// step's wall and CPU time is reported; machine-busy is what every CPU
// spent, other processes included.
func BenchmarkDiskLife(b *testing.B) {
	for _, way := range []string{"clone", "copy", "mkfs"} {
		b.Run(way, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p := substratePool(b, testSubstrate(b, SubstrateOptions{Size: 64 << 30}), Config{DefaultSize: DefaultSize, Overcommit: 100, Logger: slog.New(slog.DiscardHandler)})
			for i := range 8 {
				acquire(b, p, "held"+strconv.Itoa(i), 0)
			}
			mkfs, err := findMkfs("")
			if err != nil {
				b.Skip(err)
			}
			s := newStepCost()
			ctx := context.Background()
			busy0 := machineBusy(b)
			for b.Loop() {
				dir := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
				img := filepath.Join(dir, imageName)
				root := filepath.Join(dir, rootName)
				var f *os.File
				var fd int
				var dev string
				s.step(b, "dirs", func() (err error) {
					if err := os.Mkdir(dir, 0o711); err != nil {
						return err
					}
					if err := os.Mkdir(root, 0o755); err != nil {
						return err
					}
					f, err = os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
					return err
				})
				switch way {
				case "mkfs":
					s.step(b, "mkfs", func() error {
						if err := f.Truncate(DefaultSize); err != nil {
							return err
						}
						out, err := exec.Command(mkfs, append(mkfsArgs, img)...).CombinedOutput()
						if err != nil {
							return fmt.Errorf("%w: %s", err, out)
						}
						return nil
					})
				default:
					s.step(b, way, func() error {
						src, err := p.pristines.get(ctx, DefaultSize)
						if err != nil {
							return err
						}
						return cloneImage(ctx, f, src, cloneOptions{copyOnly: way == "copy"})
					})
					s.step(b, "uuid", func() error { return setFreshUUID(f) })
				}
				s.step(b, "reserve", func() error {
					_, err := p.reserve(f, func() error { return nil })
					return err
				})
				f.Close()
				s.step(b, "attach", func() (err error) {
					fd, dev, err = attachLoop(img, volumeLoop)
					return err
				})
				s.step(b, "mount", func() error {
					defer unix.Close(fd)
					if err := unix.Mount(dev, root, "ext4", mountFlags, mountData); err != nil {
						return err
					}
					noAllocPrefetch(dev) // as mountImage
					return nil
				})
				e := &entry{dir: dir, device: dev, size: DefaultSize}
				dst := filepath.Join(p.volDir, "bench")
				s.step(b, "handout", func() error { return p.handOut(e, dst, 1000, 1000, true) })
				// What a sandbox's start writes: a few directories, the
				// disk's first allocations.
				s.step(b, "first-writes", func() error {
					for _, d := range []string{"upper", "work", "upper/etc", "upper/tmp"} {
						if err := os.Mkdir(filepath.Join(dst, rootName, d), 0o755); err != nil {
							return err
						}
					}
					return nil
				})
				trash := filepath.Join(p.trashDir, strconv.FormatUint(p.seq.Add(1), 10))
				s.step(b, "remove", func() error { return os.Rename(dst, trash) })
				s.step(b, "teardown", func() error { return teardown(ctx, trash, p.log) })
				s.n++
			}
			s.report(b)
			b.ReportMetric(float64(machineBusy(b)-busy0)/float64(time.Microsecond)/float64(s.n), "machine-busy-µs")
		})
	}
}

// BenchmarkClonePristine clones the default size's pristine image, as
// every volume the pool makes starts: FICLONE's cost grows with the
// extents the image maps (about 20-30 µs each here), which mkfsArgs keep
// few. extents is how many the pristine maps.
func BenchmarkClonePristine(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := substratePool(b, testSubstrate(b, SubstrateOptions{Size: 16 << 30}), Config{DefaultSize: DefaultSize, Logger: slog.New(slog.DiscardHandler)})
	src, err := p.pristines.get(context.Background(), DefaultSize)
	if err != nil {
		b.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(p.poolDir, "bench.img")
	var wall, cpu time.Duration
	for b.Loop() {
		out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		c0, t0 := threadCPU(b), time.Now()
		err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		wall += time.Since(t0)
		cpu += threadCPU(b) - c0
		out.Close()
		if err != nil {
			b.Skipf("no reflink here: %v", err)
		}
		if err := os.Remove(dst); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(wall.Microseconds())/float64(b.N), "clone-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "clone-cpu-µs")
	b.ReportMetric(float64(mappedExtents(b, in)), "extents")
}

// mappedExtents counts the extents FIEMAP reports for f: what a reflink
// of f works through.
func mappedExtents(tb testing.TB, f *os.File) int {
	n := 0
	if err := extents(f, func(_, _ int64, _ uint32) error { n++; return nil }); err != nil {
		tb.Fatal(err)
	}
	return n
}
