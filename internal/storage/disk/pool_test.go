package disk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/mountinfo"
)

const testSize = 64 << 20 // small default: fast to make, same code path

// requireRoot skips tests that mount and attach loop devices.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts filesystems and attaches loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs /dev/loop-control")
	}
	if _, err := findMkfs(""); err != nil {
		t.Skip(err)
	}
}

// testDir returns a temporary Dir whose mounts and loop devices are torn
// down at the end of the test, whatever happened. Registered before any
// pool's Close, so it runs after them.
func testDir(t testing.TB) string {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	t.Cleanup(func() { scrub(t, dir) })
	return dir
}

// scrub unmounts everything under dir, detaches every loop device backed by
// a file under dir, and fails the test if a loop device survives. It runs
// before t.TempDir's RemoveAll, which must never descend into a mount.
func scrub(t testing.TB, dir string) {
	t.Helper()
	mounts := mountsUnder(t, dir)
	sort.Sort(sort.Reverse(sort.StringSlice(mounts))) // deepest first
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmounting %s: %v", m, err)
		}
	}
	names, err := loopsBacking(func(path string) bool { return strings.HasPrefix(path, dir+"/") })
	if err != nil {
		t.Errorf("cleanup: %v", err)
	}
	for _, name := range names {
		fd, err := unix.Open("/dev/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		unix.Close(fd)
	}
	assertNoLoops(t, dir)
}

// mountsUnder lists the mountpoints at or below dir.
func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := mountinfo.Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	return mounts
}

// assertNoLoops fails if a loop device backed by a file under dir remains
// after a short grace period.
func assertNoLoops(t testing.TB, dir string) {
	t.Helper()
	var names []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		names, err = loopsBacking(func(path string) bool { return strings.HasPrefix(path, dir+"/") })
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(names) > 0 {
		t.Errorf("loop devices still backed by files under %s: %v", dir, names)
	}
}

func newTestPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = testDir(t)
	}
	if cfg.DefaultSize == 0 {
		cfg.DefaultSize = testSize
	}
	if cfg.Overcommit == 0 {
		// Thin, as these tests were written for (sparse images, copies
		// that fill the substrate); test/TestDiskSpaceBacked covers 1.
		cfg.Overcommit = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// waitReady waits until the pool has n ready volumes.
func waitReady(t testing.TB, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Ready() < n {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d ready volumes after 10s, want %d", p.Ready(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func acquire(t testing.TB, p *Pool, id string, size int64) *Volume {
	t.Helper()
	v, err := p.Acquire(context.Background(), id, size, 1000, 1000)
	if err != nil {
		t.Fatalf("Acquire(%q, %d): %v", id, size, err)
	}
	return v
}

func isMountpoint(t testing.TB, path string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false
	}
	if err := unix.Stat(filepath.Dir(path), &parent); err != nil {
		t.Fatal(err)
	}
	return st.Dev != parent.Dev
}

// abandon drops the pool as a crash would: the refill stops and the lock is
// released (as the kernel does for a dead process), but nothing is cleaned.
func (p *Pool) abandon() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.refillWG.Wait()
	// Removals not yet begun are lost, as in a crash.
	p.reaper.mu.Lock()
	p.reaper.queue = nil
	p.reaper.mu.Unlock()
	p.reaper.wait()
	p.lock.Unlock()
}

func TestAcquireWriteRemove(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir, PoolSize: 1})
	waitReady(t, p, 1)

	v := acquire(t, p, "sb-1", 0)
	if v.Size != testSize {
		t.Errorf("Size = %d, want %d", v.Size, testSize)
	}
	if want := filepath.Join(dir, "vol", "sb-1", "root"); v.Path != want {
		t.Errorf("Path = %s, want %s", v.Path, want)
	}
	if !isMountpoint(t, v.Path) {
		t.Fatalf("%s is not a mountpoint", v.Path)
	}
	if !strings.HasPrefix(v.Device, "/dev/loop") {
		t.Errorf("Device = %q", v.Device)
	}
	var st unix.Stat_t
	if err := unix.Stat(v.Path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o755 {
		t.Errorf("root is %d:%d %o, want 1000:1000 755", st.Uid, st.Gid, st.Mode&0o7777)
	}
	for _, opt := range []string{"nodev", "nosuid"} {
		if !mountHasOption(t, v.Path, opt) {
			t.Errorf("%s is not mounted %s", v.Path, opt)
		}
	}
	// The allocator does not read ahead every group's bitmap (on kernels
	// that have the knob).
	if b, err := os.ReadFile(allocPrefetchKnob(v.Device)); err == nil && strings.TrimSpace(string(b)) != "0" {
		t.Errorf("%s = %s, want 0", allocPrefetchKnob(v.Device), b)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
	if err := os.WriteFile(filepath.Join(v.Path, "hello"), bytes.Repeat([]byte("x"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	used, size, err := v.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if used < 1<<20 || size <= 0 || size > testSize {
		t.Errorf("Usage = %d, %d", used, size)
	}

	if err := p.Remove(context.Background(), "sb-1"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(v.Path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume dir still there after Remove: %v", err)
	}
	if _, err := p.Open("sb-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open after Remove = %v, want ErrNotFound", err)
	}
	if err := p.Remove(context.Background(), "sb-1"); err != nil {
		t.Errorf("second Remove = %v, want nil", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
	if m := mountsUnder(t, dir); len(m) > 0 {
		t.Errorf("mounts left after Remove and Close: %v", m)
	}
}

func mountHasOption(t testing.TB, path, opt string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && mountinfo.Unescape(f[4]) == path {
			for _, o := range strings.Split(f[5], ",") {
				if o == opt {
					return true
				}
			}
		}
	}
	return false
}

func TestCapEnforced(t *testing.T) {
	p := newTestPool(t, Config{})
	const capSize = 32 << 20
	full := acquire(t, p, "full", capSize)
	other := acquire(t, p, "other", capSize)

	f, err := os.Create(filepath.Join(full.Path, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	var written int64
	for written <= 2*capSize {
		n, werr := f.Write(chunk)
		written += int64(n)
		if werr != nil {
			err = werr
			break
		}
	}
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling a %d MiB disk: wrote %d bytes, err %v; want ENOSPC", capSize>>20, written, err)
	}
	t.Logf("a %d MiB disk took %.1f MiB before ENOSPC", capSize>>20, float64(written)/(1<<20))
	if written < capSize*3/4 || written > capSize {
		t.Errorf("wrote %d bytes before ENOSPC, want between 3/4 of and the cap %d", written, capSize)
	}

	data := bytes.Repeat([]byte("y"), 4<<20)
	if err := os.WriteFile(filepath.Join(other.Path, "fine"), data, 0o644); err != nil {
		t.Fatalf("writing to the neighbour of a full disk: %v", err)
	}
	if used, _, err := other.Usage(); err != nil || used > 8<<20 {
		t.Errorf("neighbour Usage = %d, %v", used, err)
	}
	for _, id := range []string{"full", "other"} {
		if err := p.Remove(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoLoops(t, p.cfg.Dir)
}

func TestAcquireNonDefaultSize(t *testing.T) {
	p := newTestPool(t, Config{PoolSize: 1})
	waitReady(t, p, 1)
	const size = 48 << 20
	v := acquire(t, p, "odd", size)
	if v.Size != size {
		t.Errorf("Size = %d, want %d", v.Size, size)
	}
	_, fsSize, err := v.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if fsSize < size*3/4 || fsSize > size {
		t.Errorf("filesystem size %d for a %d disk", fsSize, size)
	}
	if p.Ready() != 1 {
		t.Errorf("a non-default Acquire took from the pool: Ready = %d", p.Ready())
	}
	// Sizes are rounded up to whole MiB.
	v2 := acquire(t, p, "rounded", 20<<20+1)
	if v2.Size != 21<<20 {
		t.Errorf("Size = %d, want %d", v2.Size, 21<<20)
	}
}

func TestRestart(t *testing.T) {
	dir := testDir(t)
	a, err := NewPool(Config{Dir: dir, DefaultSize: testSize, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, a, 2)
	v := acquire(t, a, "x", 0)
	if err := os.WriteFile(filepath.Join(v.Path, "kept"), []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a, 2)
	// A second owner is refused while A lives.
	if _, err := NewPool(Config{Dir: dir, DefaultSize: testSize}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("second NewPool on a live Dir = %v, want ErrUnavailable", err)
	}
	a.abandon()
	// What a crash mid-make leaves: an image, never mounted.
	half := filepath.Join(dir, "pool", "999")
	if err := os.MkdirAll(filepath.Join(half, rootName), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := createSparse(filepath.Join(half, imageName), testSize); err != nil {
		t.Fatal(err)
	}
	if n := len(mountsUnder(t, filepath.Join(dir, "pool"))); n != 2 {
		t.Fatalf("%d pool mounts left by A, want 2", n)
	}

	b := newTestPool(t, Config{Dir: dir})
	ents, err := os.ReadDir(filepath.Join(dir, "pool"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Errorf("stale pool entries not swept: %v", ents)
	}
	if m := mountsUnder(t, filepath.Join(dir, "pool")); len(m) != 0 {
		t.Errorf("stale pool mounts not swept: %v", m)
	}
	names, err := loopsBacking(func(path string) bool { return strings.HasPrefix(path, filepath.Join(dir, "pool")+"/") })
	if err != nil || len(names) != 0 {
		t.Errorf("stale pool loop devices: %v, %v", names, err)
	}

	got, err := b.Open("x")
	if err != nil {
		t.Fatalf("Open after restart: %v", err)
	}
	if got.Path != v.Path || got.Device != v.Device || got.Size != v.Size {
		t.Errorf("Open = %+v, want %+v", got, v)
	}
	if data, err := os.ReadFile(filepath.Join(got.Path, "kept")); err != nil || string(data) != "still here" {
		t.Errorf("file after restart: %q, %v", data, err)
	}
	ids, err := b.List()
	if err != nil || len(ids) != 1 || ids[0] != "x" {
		t.Errorf("List = %v, %v; want [x]", ids, err)
	}
	// New entries must not collide with the swept one's name.
	if _, err := b.Acquire(context.Background(), "y", 0, 0, 0); err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	for _, id := range []string{"x", "y"} {
		if err := b.Remove(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	assertNoLoops(t, dir)
}

func TestOpenAfterUnmount(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir})
	v := acquire(t, p, "rebooted", 0)
	if err := os.WriteFile(filepath.Join(v.Path, "kept"), []byte("yes"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A reboot: the mount and the loop device are gone, the files stay.
	if err := unix.Unmount(v.Path, 0); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
	if _, _, err := v.Usage(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Usage of an unmounted volume = %v, want ErrNotFound", err)
	}

	got, err := p.Open("rebooted")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !isMountpoint(t, got.Path) || got.Path != v.Path || got.Size != v.Size {
		t.Fatalf("Open = %+v", got)
	}
	if data, err := os.ReadFile(filepath.Join(got.Path, "kept")); err != nil || string(data) != "yes" {
		t.Errorf("file after re-mount: %q, %v", data, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(got.Path, &st); err != nil || st.Uid != 1000 {
		t.Errorf("owner after re-mount: %d, %v", st.Uid, err)
	}
	again, err := p.Open("rebooted")
	if err != nil || *again != *got {
		t.Errorf("second Open = %+v, %v; want %+v", again, err, got)
	}
	if n := len(mountsUnder(t, filepath.Join(dir, "vol"))); n != 1 {
		t.Errorf("%d mounts after two Opens, want 1", n)
	}

	if _, err := p.Open("never"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open of a missing id = %v, want ErrNotFound", err)
	}
	if err := p.Remove(context.Background(), "rebooted"); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
}

// TestOpenReusesBoundDevice: if the image is still bound to a loop device
// (here one attached without autoclear), Open mounts that device rather
// than binding a second one to the same file.
func TestOpenReusesBoundDevice(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir})
	v := acquire(t, p, "bound", 0)
	if err := unix.Unmount(v.Path, 0); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
	img := filepath.Join(filepath.Dir(v.Path), imageName)
	dev := attachWithoutAutoclear(t, img)

	got, err := p.Open("bound")
	if err != nil {
		t.Fatal(err)
	}
	if got.Device != dev {
		t.Errorf("Open mounted %s, want the bound %s", got.Device, dev)
	}
	if err := p.Remove(context.Background(), "bound"); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
}

func attachWithoutAutoclear(t *testing.T, img string) string {
	t.Helper()
	backing, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(backing)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
	if err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlLoopConfigure(fd, &unix.LoopConfig{Fd: uint32(backing)}); err != nil {
		t.Fatal(err)
	}
	return dev
}

func TestRemoveBusy(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir})
	v := acquire(t, p, "busy", 0)
	f, err := os.Create(filepath.Join(v.Path, "held"))
	if err != nil {
		t.Fatal(err)
	}
	// An open file keeps the mount busy: Remove detaches lazily, and the
	// loop device goes when the file is closed.
	if err := p.Remove(context.Background(), "busy"); err != nil {
		t.Fatalf("Remove of a busy volume: %v", err)
	}
	if ids, _ := p.List(); len(ids) != 0 {
		t.Errorf("List after Remove = %v", ids)
	}
	p.reaper.wait()
	// The holder cannot keep filling a deleted disk.
	if _, err := f.Write(make([]byte, 4096)); !errors.Is(err, syscall.EIO) {
		t.Errorf("write to a removed disk = %v, want EIO", err)
	}
	f.Close()
	assertNoLoops(t, dir)
}

// TestShutdownGuard: shutdown stops only the filesystem in the image it is
// given, never another one mounted at the path (nor the host's).
func TestShutdownGuard(t *testing.T) {
	p := newTestPool(t, Config{})
	a := acquire(t, p, "a", 0)
	b := acquire(t, p, "b", 0)
	bImg := filepath.Join(filepath.Dir(b.Path), imageName)
	for _, root := range []string{a.Path, filepath.Dir(a.Path), t.TempDir()} {
		if err := shutdown(root, bImg); err != nil {
			t.Errorf("shutdown(%s, b's image): %v", root, err)
		}
	}
	if err := os.WriteFile(filepath.Join(a.Path, "alive"), []byte("yes"), 0o644); err != nil {
		t.Fatalf("a after shutdown with b's image: %v", err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "alive"), []byte("yes"), 0o644); err != nil {
		t.Fatalf("host after shutdown: %v", err)
	}
}

func TestInvalid(t *testing.T) {
	p := newTestPool(t, Config{})
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a/b", "..", ".", "A", "x y", "x\x00", strings.Repeat("a", 65), strings.Repeat("a", 100)} {
		t.Run(fmt.Sprintf("id=%q", id), func(t *testing.T) {
			if _, err := p.Acquire(ctx, id, 0, 0, 0); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Acquire = %v, want ErrInvalid", err)
			}
			if _, err := p.Open(id); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Open = %v, want ErrInvalid", err)
			}
			if err := p.Remove(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Remove = %v, want ErrInvalid", err)
			}
		})
	}
	for _, size := range []int64{-1, 1, 1 << 20, MinSize - 1, MaxSize + 1, 1 << 62} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			_, err := p.Acquire(ctx, "ok", size, 0, 0)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "disk") {
				t.Errorf("Acquire = %v, want ErrInvalid naming disk", err)
			}
		})
	}
	for _, owner := range [][2]int{{-1, 0}, {0, -1}, {1 << 32, 0}} {
		if _, err := p.Acquire(ctx, "ok", 0, owner[0], owner[1]); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Acquire with owner %v = %v, want ErrInvalid", owner, err)
		}
	}
	if ids, _ := p.List(); len(ids) != 0 {
		t.Errorf("invalid calls left volumes: %v", ids)
	}
	if _, err := NewPool(Config{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("NewPool without Dir = %v, want ErrInvalid", err)
	}
}

func TestConflict(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir, PoolSize: 1})
	waitReady(t, p, 1)
	acquire(t, p, "same", 0)
	if _, err := p.Acquire(context.Background(), "same", 0, 0, 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Acquire = %v, want ErrConflict", err)
	}
	// Racing Acquires of one id: exactly one wins, and the loser's volume
	// is torn down.
	var wg sync.WaitGroup
	var won, lost atomic.Int32
	for range 3 {
		wg.Go(func() {
			_, err := p.Acquire(context.Background(), "race", 0, 0, 0)
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, errdefs.ErrConflict):
				lost.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 || lost.Load() != 2 {
		t.Errorf("won %d, lost %d; want 1 and 2", won.Load(), lost.Load())
	}
	for _, id := range []string{"same", "race"} {
		if err := p.Remove(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
}

func TestRefill(t *testing.T) {
	p := newTestPool(t, Config{PoolSize: 2})
	waitReady(t, p, 2)
	acquire(t, p, "a", 0)
	acquire(t, p, "b", 0)
	acquire(t, p, "c", 0) // pool empty: made on demand
	start := time.Now()
	waitReady(t, p, 2)
	t.Logf("refilled 2 volumes in %v", time.Since(start))
	time.Sleep(100 * time.Millisecond)
	if n := p.Ready(); n != 2 {
		t.Errorf("Ready = %d after refill, want exactly 2", n)
	}
}

// TestRefillBacksOff: a refill that keeps failing logs and waits, rather
// than spinning, and Acquire still answers (with the error) instead of
// blocking.
func TestRefillBacksOff(t *testing.T) {
	dir := testDir(t)
	var failures atomic.Int32
	h := &countingHandler{level: slog.LevelWarn, n: &failures}
	p := newTestPool(t, Config{Dir: dir, PoolSize: 2, Mkfs: "/bin/false", Logger: slog.New(h)})
	time.Sleep(time.Second)
	// 250ms, 500ms, 1s: at most 3 attempts fit in a second.
	if n := failures.Load(); n < 1 || n > 4 {
		t.Errorf("%d refill failures logged in 1s, want 1 to 4", n)
	}
	if _, err := p.Acquire(context.Background(), "z", 0, 0, 0); err == nil {
		t.Error("Acquire with a broken mkfs succeeded")
	}
	// Stop the refiller first: an attempt in flight has its directory.
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "pool")); len(ents) != 0 {
		t.Errorf("failed makes left %v", ents)
	}
}

type countingHandler struct {
	level slog.Level
	n     *atomic.Int32
}

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestConcurrentAcquireRemove(t *testing.T) {
	dir := testDir(t)
	p := newTestPool(t, Config{Dir: dir, PoolSize: 2})
	waitReady(t, p, 2)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			id := fmt.Sprintf("c-%d", i)
			v, err := p.Acquire(context.Background(), id, 0, i, i)
			if err != nil {
				t.Error(err)
				return
			}
			if err := os.WriteFile(filepath.Join(v.Path, "f"), []byte(id), 0o644); err != nil {
				t.Error(err)
			}
			if _, err := p.Open(id); err != nil {
				t.Error(err)
			}
			if err := p.Remove(context.Background(), id); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ids, _ := p.List(); len(ids) != 0 {
		t.Errorf("List = %v after removing all", ids)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoLoops(t, dir)
}

// TestFreshVolumeIsSparse: a fresh default (10 GiB) volume costs a few MiB
// of real disk, and stays that way once mounted.
func TestFreshVolumeIsSparse(t *testing.T) {
	p := newTestPool(t, Config{DefaultSize: DefaultSize})
	start := time.Now()
	v := acquire(t, p, "big", 0)
	made := time.Since(start)
	time.Sleep(500 * time.Millisecond) // give a lazy-init thread time to betray itself
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(filepath.Dir(v.Path), imageName), &st); err != nil {
		t.Fatal(err)
	}
	real := st.Blocks * 512
	t.Logf("fresh %d GiB volume: made in %v, %.1f MiB on disk", v.Size>>30, made, float64(real)/(1<<20))
	if real > 32<<20 {
		t.Errorf("fresh volume uses %d bytes of real disk, want < 32 MiB", real)
	}
	if err := p.Remove(context.Background(), "big"); err != nil {
		t.Fatal(err)
	}
}

// giveBack returns a handed-out volume to the ready pool, so the benchmark
// measures the hand-out alone without waiting for refills.
func (p *Pool) giveBack(tb testing.TB, v *Volume) {
	dir := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
	if err := os.Rename(filepath.Dir(v.Path), dir); err != nil {
		tb.Fatal(err)
	}
	p.mu.Lock()
	p.ready = append(p.ready, &entry{dir: dir, device: v.Device, size: v.Size})
	p.mu.Unlock()
}

func BenchmarkAcquireFromPool(b *testing.B) {
	dir := testDir(b)
	// PoolSize 0 keeps the refill out of the measurement; the benchmark
	// seeds one entry and recycles it.
	p := newTestPool(b, Config{Dir: dir, DefaultSize: DefaultSize, Logger: slog.New(slog.DiscardHandler)})
	e, err := p.make(context.Background(), DefaultSize)
	if err != nil {
		b.Fatal(err)
	}
	p.mu.Lock()
	p.ready = append(p.ready, e)
	p.mu.Unlock()
	ctx := context.Background()
	var v *Volume
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if v, err = p.Acquire(ctx, "bench", 0, 1000, 1000); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		p.giveBack(b, v)
		b.StartTimer()
	}
}

func BenchmarkAcquireFresh(b *testing.B) {
	dir := testDir(b)
	p := newTestPool(b, Config{Dir: dir, DefaultSize: DefaultSize, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Acquire(ctx, "bench", 0, 1000, 1000); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Remove(ctx, "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkRemove(b *testing.B) {
	dir := testDir(b)
	p := newTestPool(b, Config{Dir: dir, DefaultSize: DefaultSize, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := p.Acquire(ctx, "bench", 0, 1000, 1000); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := p.Remove(ctx, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestRename(t *testing.T) {
	requireRoot(t)
	p := newTestPool(t, Config{})
	ctx := context.Background()
	v, err := p.Acquire(ctx, "warm-1", 32<<20, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.Path, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Rename("warm-1", "sb1"); err != nil {
		t.Fatal(err)
	}
	got, err := p.Open("sb1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Path, "f")); err != nil || string(b) != "x" {
		t.Fatalf("file after rename = %q, %v", b, err)
	}
	if _, err := p.Open("warm-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Open(old) = %v, want ErrNotFound", err)
	}
	if err := p.Rename("warm-1", "sb2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Rename(missing) = %v, want ErrNotFound", err)
	}
	if _, err := p.Acquire(ctx, "other", 32<<20, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := p.Rename("other", "sb1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Rename onto a taken id = %v, want ErrConflict", err)
	}
	if err := p.Rename("../x", "sb3"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Rename(hostile) = %v, want ErrInvalid", err)
	}
	for _, id := range []string{"sb1", "other"} {
		if err := p.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecycle: a volume that held little goes back to the pool wiped
// (every file gone, lost+found kept, nothing followed out of it through a
// link) and the next Acquire takes it, on the same device; one that holds
// more than recycleMaxUsed is torn down instead.
func TestRecycle(t *testing.T) {
	dir := testDir(t)
	// Room for more than recycleMaxUsed.
	p := newTestPool(t, Config{Dir: dir, PoolSize: 1, DefaultSize: 2 * recycleMaxUsed})
	ctx := context.Background()
	waitReady(t, p, 1)
	v := acquire(t, p, "small", 0)
	outside := filepath.Join(dir, "outside")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"upper/etc", "work/work"} {
		if err := os.MkdirAll(filepath.Join(v.Path, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(v.Path, "upper/etc/secret"), []byte("the last sandbox's"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"upper/out": outside, "upper/dir-out": dir} {
		if err := os.Symlink(target, filepath.Join(v.Path, name)); err != nil {
			t.Fatal(err)
		}
	}
	waitReady(t, p, 1) // the refill's, for the one taken
	if err := p.Recycle(ctx, "small"); err != nil {
		t.Fatalf("Recycle: %v", err)
	}
	p.reaper.wait()
	if got := p.Ready(); got != 2 {
		t.Fatalf("ready volumes after a recycle = %d, want 2 (the refill's and the recycled)", got)
	}
	if ids, _ := p.List(); len(ids) != 0 {
		t.Errorf("List after Recycle = %v", ids)
	}
	reused := false
	for _, id := range []string{"next1", "next2"} {
		w := acquire(t, p, id, 0)
		ents, err := os.ReadDir(w.Path)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != keepOnWipe {
				t.Errorf("%s's fresh volume holds %s", id, e.Name())
			}
		}
		if w.Device == v.Device {
			reused = true
		}
	}
	if !reused {
		t.Errorf("no Acquire got the recycled volume (device %s)", v.Device)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host" {
		t.Errorf("a file a link pointed at: %q, %v", b, err)
	}

	big := acquire(t, p, "big", 0)
	f, err := os.Create(filepath.Join(big.Path, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, recycleMaxUsed+(1<<20))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	waitReady(t, p, 1)
	ready := p.Ready()
	if err := p.Recycle(ctx, "big"); err != nil {
		t.Fatalf("Recycle: %v", err)
	}
	p.reaper.wait()
	if got := p.Ready(); got != ready {
		t.Errorf("ready volumes after recycling a full one = %d, want %d", got, ready)
	}
	// Only this pool's: other tests and daemons on the host have trash too.
	if names, _ := loopsBacking(func(path string) bool { return strings.HasPrefix(path, p.trashDir+"/") }); len(names) != 0 {
		t.Errorf("a full volume's loop device is left: %v", names)
	}
}
