package disk

import (
	"context"
	"io"
	"os"
	"path/filepath"
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
	if _, err := makeVolume(context.Background(), mkfs, dir, DefaultSize, createSparse, log); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := teardown(context.Background(), dir, log); err != nil {
			b.Error(err)
		}
	})
	root := filepath.Join(dir, rootName)
	if opts == volumeLoop {
		return root
	}
	if err := unix.Unmount(root, 0); err != nil {
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
