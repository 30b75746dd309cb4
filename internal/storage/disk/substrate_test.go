package disk

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// testSubstrate prepares a substrate on a new directory under testDir and
// skips the test unless it is an XFS image (no mkfs.xfs, no XFS in the
// kernel, or a host filesystem that reflinks by itself). Its mount and
// loop device are taken down at the end of the test, whatever happened.
func testSubstrate(t testing.TB, opts SubstrateOptions) *Substrate {
	t.Helper()
	dir := filepath.Join(testDir(t), "sub")
	if opts.Size == 0 {
		opts.Size = 1 << 30
	}
	s, err := PrepareSubstrate(dir, opts, testLogger(t))
	if err != nil {
		t.Fatalf("PrepareSubstrate: %v", err)
	}
	// Registered after testDir's scrub, so it runs first: the substrate
	// is taken down properly rather than lazily.
	t.Cleanup(func() { scrubSubstrate(t, s.Dir()) })
	if s.Mode() != SubstrateXFSImage {
		t.Skipf("substrate mode is %q here, not %q", s.Mode(), SubstrateXFSImage)
	}
	return s
}

// scrubSubstrate thaws and unmounts everything in the substrate on dir,
// then the substrate itself, and fails the test if its loop device
// survives.
func scrubSubstrate(t testing.TB, dir string) {
	t.Helper()
	mounts := mountsUnder(t, dir)
	sort.Sort(sort.Reverse(sort.StringSlice(mounts))) // deepest first
	for _, m := range mounts {
		// A filesystem left frozen cannot be unmounted for good.
		if fd, err := unix.Open(m, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			unix.IoctlSetInt(fd, fiThaw, 0)
			unix.Close(fd)
		}
		if m == dir {
			continue
		}
		if err := unix.Unmount(m, 0); err != nil {
			t.Errorf("cleanup: unmounting %s: %v", m, err)
			unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	// Inner loop devices free themselves asynchronously after the unmount.
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := Unmount(dir)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: %v", err)
			unix.Unmount(dir, unix.MNT_DETACH)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	assertNoLoops(t, filepath.Dir(dir))
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

// substratePool makes a pool in dir "disks" on s.
func substratePool(t testing.TB, s *Substrate, cfg Config) *Pool {
	t.Helper()
	cfg.Dir = filepath.Join(s.Dir(), "disks")
	cfg.Substrate = s
	return newTestPool(t, cfg)
}

func TestPrepareSubstrate(t *testing.T) {
	dir := filepath.Join(testDir(t), "sub")
	image := dir + substrateSuffix
	// What a crash in the middle of making the image leaves.
	if err := os.WriteFile(image+tmpSuffix, []byte("half made"), 0o600); err != nil {
		t.Fatal(err)
	}
	prepare := func() *Substrate {
		t.Helper()
		s, err := PrepareSubstrate(dir, SubstrateOptions{Size: 1 << 30}, testLogger(t))
		if err != nil {
			t.Fatalf("PrepareSubstrate: %v", err)
		}
		return s
	}
	t.Cleanup(func() { scrubSubstrate(t, dir) })
	start := time.Now()
	s := prepare()
	if s.Mode() != SubstrateXFSImage {
		t.Skipf("substrate mode is %q here", s.Mode())
	}
	t.Logf("made a 1 GiB substrate in %v", time.Since(start))
	if !s.Reflink() || s.Dir() != dir || !isMountpoint(t, dir) {
		t.Fatalf("substrate %+v: reflink %v, mounted %v", s, s.Reflink(), isMountpoint(t, dir))
	}
	if !loopDirectIO(s.Device()) {
		t.Errorf("substrate loop device %s does not do direct I/O", s.Device())
	}
	if _, err := os.Stat(image + tmpSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale %s%s not removed: %v", image, tmpSuffix, err)
	}
	if fi, err := os.Stat(image); err != nil || fi.Size() != 1<<30 {
		t.Errorf("image: %v, %v", fi, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o7777 != 0o711 {
		t.Errorf("substrate root mode %o, %v; want the dir's 711", st.Mode&0o7777, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kept"), []byte("yes"), 0o600); err != nil {
		t.Fatal(err)
	}

	again := prepare()
	if *again != *s {
		t.Errorf("second PrepareSubstrate = %+v, want %+v", again, s)
	}
	if n := len(mountsUnder(t, dir)); n != 1 {
		t.Errorf("%d mounts on %s after two prepares, want 1", n, dir)
	}

	// Unmount refuses while a volume is mounted inside, and names it.
	p := substratePool(t, s, Config{})
	v := acquire(t, p, "inside", 0)
	if err := Unmount(dir); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), v.Path) {
		t.Errorf("Unmount with a volume inside = %v, want ErrConflict naming %s", err, v.Path)
	}
	if err := p.Remove(context.Background(), "inside"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// A reboot: the substrate is unmounted, its loop device gone.
	if err := Unmount(dir); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	if isMountpoint(t, dir) {
		t.Fatal("still mounted after Unmount")
	}
	assertNoLoops(t, filepath.Dir(dir))
	if err := Unmount(dir); err != nil {
		t.Errorf("second Unmount = %v, want nil", err)
	}
	s = prepare()
	if s.Mode() != SubstrateXFSImage || !isMountpoint(t, dir) {
		t.Fatalf("after remount: mode %q, mounted %v", s.Mode(), isMountpoint(t, dir))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kept")); err != nil || string(b) != "yes" {
		t.Errorf("file after remount: %q, %v", b, err)
	}

	// Unmounted with something written into the bare dir: mounting over
	// it would hide that, so it is refused.
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(dir, "stray")
	if err := os.WriteFile(stray, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := PrepareSubstrate(dir, SubstrateOptions{}, testLogger(t)); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("PrepareSubstrate over a non-empty dir = %v, want ErrConflict", err)
	}
	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}
	prepare()
}

// TestSubstrateFallbacks: a non-empty dir without an image is left alone
// (mode copy); ForceCopy keeps the image but turns reflink off.
func TestSubstrateFallbacks(t *testing.T) {
	root := testDir(t)
	busy := filepath.Join(root, "busy")
	if err := os.MkdirAll(filepath.Join(busy, "vol"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := PrepareSubstrate(busy, SubstrateOptions{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := probeReflink(root); ok {
		if s.Mode() != SubstrateHost || !s.Reflink() {
			t.Errorf("on a reflink host: mode %q reflink %v", s.Mode(), s.Reflink())
		}
	} else if s.Mode() != SubstrateCopy || s.Reflink() || isMountpoint(t, busy) {
		t.Errorf("non-empty dir: mode %q reflink %v mounted %v; want copy, false, false", s.Mode(), s.Reflink(), isMountpoint(t, busy))
	}
	if _, err := os.Stat(busy + substrateSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image made next to a non-empty dir: %v", err)
	}

	if _, err := PrepareSubstrate(filepath.Join(root, "tiny"), SubstrateOptions{Size: 100 << 20}, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("100 MiB substrate = %v, want ErrInvalid", err)
	}

	forced := testSubstrate(t, SubstrateOptions{Size: 512 << 20, ForceCopy: true})
	if forced.Reflink() {
		t.Error("ForceCopy substrate reports reflink")
	}
	if _, err := NewPool(Config{Dir: filepath.Join(root, "elsewhere"), Substrate: forced}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("NewPool off its substrate = %v, want ErrInvalid", err)
	}
}

// writeFile writes size bytes that differ in every MiB to path and syncs.
func writeFile(t testing.TB, path string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	for off := int64(0); off < size; off += int64(len(buf)) {
		copy(buf, path)
		buf[len(path)] = byte(off >> 20)
		buf[len(path)+1] = byte(off >> 28)
		if _, err := f.Write(buf[:min(int64(len(buf)), size-off)]); err != nil {
			t.Fatalf("writing %s: %v", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// sameContent reports whether the files a and b hold the same bytes.
func sameContent(t testing.TB, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil || eb != nil {
			return errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF)
		}
	}
}

func freeBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bfree) * st.Bsize
}

func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestCloneSharesExtents: on the substrate a clone of 256 MiB costs almost
// no space, and deleting data gives the space back to the host.
func TestCloneSharesExtents(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{})
	src, dst := filepath.Join(s.Dir(), "src"), filepath.Join(s.Dir(), "dst")
	const size = 256 << 20
	writeFile(t, src, size)
	before := freeBytes(t, s.Dir())
	start := time.Now()
	if err := Clone(src, dst); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	used := before - freeBytes(t, s.Dir())
	t.Logf("cloned %d MiB in %v; free space dropped by %d KiB", size>>20, took, used>>10)
	if used > 8<<20 {
		t.Errorf("clone of %d MiB used %d bytes of the substrate, want < 8 MiB", size, used)
	}
	if !sameContent(t, src, dst) {
		t.Error("clone differs from its source")
	}
	if _, err := os.Stat(dst + tmpSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s%s left: %v", dst, tmpSuffix, err)
	}
	if err := Clone(src, dst); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Clone onto an existing file = %v, want ErrConflict", err)
	}

	// discard: removing both gives the blocks back to the host file.
	image := s.Dir() + substrateSuffix
	held := allocated(t, image)
	for _, p := range []string{src, dst} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	unix.Sync()
	if !givenBack(t, image, held-size/2) {
		// Online discard waits for a log checkpoint, which sync does not
		// always force: XFS's log worker (every 30 s) then frees them, 29 s
		// in one run here. FITRIM discards every free extent now; either
		// way the blocks must leave the host file.
		t.Logf("online discard has not given the blocks back yet; trimming %s", s.Dir())
		trim(t, s.Dir())
		if !givenBack(t, image, held-size/2) {
			now := allocated(t, image)
			t.Errorf("substrate image holds %d MiB after deleting %d MiB of %d MiB and a trim, want it given back", now>>20, size>>20, held>>20)
		}
	}
}

// givenBack waits up to 5 s for image to hold at most want bytes.
func givenBack(t *testing.T, image string, want int64) bool {
	deadline := time.Now().Add(5 * time.Second)
	for allocated(t, image) > want {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// trim is fstrim(8) on dir: FITRIM, _IOWR('X', 121, struct fstrim_range).
func trim(t *testing.T, dir string) {
	const fitrim = 0xc0185879
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := struct{ start, len, minlen uint64 }{len: ^uint64(0)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&r))); errno != 0 {
		t.Fatalf("FITRIM %s: %v", dir, errno)
	}
}

// TestCloneCopiesSparse: where reflink is refused (ext4 here, or copying
// forced) a clone copies data and keeps holes.
func TestCloneCopiesSparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 100 << 20, 200 << 20} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off >> 20)}, 3<<20), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, tc := range []struct {
		name string
		opts cloneOptions
	}{{"auto", cloneOptions{}}, {"copy-only", cloneOptions{copyOnly: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(dir, tc.name)
			if _, err := cloneFile(context.Background(), src, dst, tc.opts); err != nil {
				t.Fatal(err)
			}
			if !sameContent(t, src, dst) {
				t.Error("copy differs from its source")
			}
			if a, b := allocated(t, src), allocated(t, dst); b > a+1<<20 {
				t.Errorf("copy allocates %d bytes, source %d: holes not kept", b, a)
			}
		})
	}
}

// TestCloneENOSPC: a copy that does not fit fails with ENOSPC, whether
// the free-space check catches it or the disk fills halfway, and leaves
// nothing behind.
func TestCloneENOSPC(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{Size: 320 << 20})
	src := filepath.Join(s.Dir(), "src")
	writeFile(t, src, 180<<20)
	free := freeBytes(t, s.Dir())
	for _, tc := range []struct {
		name string
		opts cloneOptions
	}{{"checked", cloneOptions{copyOnly: true}}, {"midway", cloneOptions{copyOnly: true, noSpaceCheck: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(s.Dir(), tc.name)
			_, err := cloneFile(context.Background(), src, dst, tc.opts)
			if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), dst) {
				t.Fatalf("clone = %v, want ENOSPC naming %s", err, dst)
			}
			t.Log(err)
			for _, p := range []string{dst, dst + tmpSuffix} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after a failed clone: %v", p, err)
				}
			}
			// XFS frees an unlinked file's blocks in the background.
			deadline := time.Now().Add(5 * time.Second)
			for freeBytes(t, s.Dir()) < free-4<<20 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if now := freeBytes(t, s.Dir()); now < free-4<<20 {
				t.Errorf("free space %d MiB after the failed clone, was %d MiB", now>>20, free>>20)
			}
		})
	}
}

func TestSubstrateHelpers(t *testing.T) {
	dir := t.TempDir()
	size, err := defaultSubstrateSize(dir)
	if err != nil || size < defaultMinSubstrate || size > maxSubstrateSize || size%sizeAlign != 0 {
		t.Errorf("defaultSubstrateSize = %d, %v", size, err)
	}
	notXFS := filepath.Join(dir, "zeros")
	if err := os.WriteFile(notXFS, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := xfsSectorSize(notXFS); err == nil {
		t.Error("xfsSectorSize of zeros succeeded")
	}
	if ok, err := probeReflink(dir); err != nil {
		t.Errorf("probeReflink: %v", err)
	} else if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("probeReflink (%v) left %v", ok, ents)
	}
}
