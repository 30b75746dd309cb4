package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// snapshotSetup is a pool and a directory for snapshots on the same
// filesystem: an XFS substrate (reflinking, or forced to copy) or the
// test's own directory on the host.
type snapshotSetup struct {
	name      string
	substrate bool
	forceCopy bool
}

var snapshotSetups = []snapshotSetup{
	{name: "xfs-reflink", substrate: true},
	{name: "xfs-copy", substrate: true, forceCopy: true},
	{name: "host"},
}

// make returns the pool and the base directory for snapshots and mounts;
// a substrate is of size bytes (0: testSubstrate's default).
func (s snapshotSetup) make(t testing.TB, size int64) (*Pool, string) {
	t.Helper()
	if !s.substrate {
		base := testDir(t)
		return newTestPool(t, Config{Dir: filepath.Join(base, "disks")}), base
	}
	sub := testSubstrate(t, SubstrateOptions{Size: size, ForceCopy: s.forceCopy})
	return substratePool(t, sub, Config{}), sub.Dir()
}

func (s snapshotSetup) wantReflink(t testing.TB, base string) bool {
	t.Helper()
	if s.forceCopy {
		return false
	}
	ok, err := probeReflink(base)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

const recordSize = 64

// record is the i-th record the writer appends: its number and a letter
// that changes with it, 64 bytes.
func record(i int) []byte {
	return fmt.Appendf(nil, "%010d %s\n", i, strings.Repeat(string(rune('a'+i%26)), recordSize-12))
}

// recordWriter appends records to a file, one write each, and fsyncs
// every 32, until stopped: a sandbox busy writing while it is captured.
type recordWriter struct {
	stop    atomic.Bool
	written atomic.Int64
	synced  atomic.Int64
	done    chan error
}

func startWriter(t testing.TB, path string) *recordWriter {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	w := &recordWriter{done: make(chan error, 1)}
	go func() {
		defer f.Close()
		for i := 0; !w.stop.Load(); i++ {
			if _, err := f.Write(record(i)); err != nil {
				w.done <- err
				return
			}
			w.written.Store(int64(i + 1))
			if (i+1)%32 == 0 {
				if err := f.Sync(); err != nil {
					w.done <- err
					return
				}
				w.synced.Store(int64(i + 1))
			}
		}
		w.done <- nil
	}()
	t.Cleanup(func() { w.finish(t) })
	return w
}

// waitSynced waits until at least n records are durable.
func (w *recordWriter) waitSynced(t testing.TB, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); w.synced.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("writer synced %d records in 10s, want %d", w.synced.Load(), n)
		}
	}
}

// finish stops the writer and returns how many records it wrote.
func (w *recordWriter) finish(t testing.TB) int64 {
	t.Helper()
	if w.stop.Swap(true) {
		return w.written.Load()
	}
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("writer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("writer stuck for 10s: is the disk still frozen?")
	}
	return w.written.Load()
}

// checkRecords reads the records in path and fails unless they are an
// unbroken prefix of what the writer writes: nothing torn, nothing missing.
func checkRecords(t testing.TB, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%recordSize != 0 {
		t.Errorf("%s: %d bytes, not whole records", path, len(b))
	}
	n := len(b) / recordSize
	for i := range n {
		if got := b[i*recordSize : (i+1)*recordSize]; !bytes.Equal(got, record(i)) {
			t.Fatalf("%s: record %d is %q, want %q", path, i, got, record(i))
		}
	}
	return int64(n)
}

// checkImage runs e2fsck -fn on img (read-only: nothing is changed) and
// fails unless the filesystem is clean.
func checkImage(t testing.TB, img string) {
	t.Helper()
	fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		fsck = "/usr/sbin/e2fsck"
		if _, err := os.Stat(fsck); err != nil {
			t.Log("no e2fsck: image not checked")
			return
		}
	}
	if out, err := exec.Command(fsck, "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

// mountReadOnly mounts the ext4 image img read-only, without replaying its
// journal, at the new directory mnt until the end of the test.
func mountReadOnly(t testing.TB, img, mnt string) {
	t.Helper()
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, dev, err := attachLoop(img, loopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_RDONLY|mountFlags, "noload"); err != nil {
		t.Fatalf("mounting %s read-only: %v", img, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
}

// TestSnapshotWhileWriting captures a disk that a writer keeps appending
// to, without pausing it: the snapshot is a clean ext4 whose file is a
// prefix of whole records, holding at least every record synced before.
func TestSnapshotWhileWriting(t *testing.T) {
	ctx := context.Background()
	for _, setup := range snapshotSetups {
		t.Run(setup.name, func(t *testing.T) {
			p, base := setup.make(t, 0)
			v := acquire(t, p, "busy", 256<<20)
			w := startWriter(t, filepath.Join(v.Path, "log"))
			w.waitSynced(t, 2000)
			synced := w.synced.Load()

			snap := filepath.Join(base, "busy.img")
			var paused, resumed int
			c, err := p.Snapshot(ctx, "busy", snap, func() (func(), error) {
				paused++
				return func() { resumed++ }, nil
			})
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			t.Logf("%+v", c)
			// The writer goes on once the disk is thawed.
			w.waitSynced(t, w.synced.Load()+1000)
			written := w.finish(t)

			if paused != 1 || resumed != 1 {
				t.Errorf("pause called %d times, resume %d; want 1 and 1", paused, resumed)
			}
			if want := setup.wantReflink(t, base); c.Reflink != want {
				t.Errorf("Reflink = %v, want %v", c.Reflink, want)
			}
			for name, d := range map[string]time.Duration{"Frozen": c.Frozen, "FSFrozen": c.FSFrozen, "Total": c.Total} {
				if d <= 0 || d > 5*time.Second {
					t.Errorf("%s = %v, want between 0 and 5s", name, d)
				}
			}
			if c.FSFrozen > c.Frozen || c.Frozen > c.Total {
				t.Errorf("windows do not nest: FSFrozen %v, Frozen %v, Total %v", c.FSFrozen, c.Frozen, c.Total)
			}
			if c.Bytes <= 0 || c.Bytes > v.Size {
				t.Errorf("Bytes = %d", c.Bytes)
			}

			checkImage(t, snap)
			mnt := filepath.Join(base, "ro")
			mountReadOnly(t, snap, mnt)
			got := checkRecords(t, filepath.Join(mnt, "log"))
			t.Logf("snapshot holds %d records: %d were synced before it, %d written in all", got, synced, written)
			if got < synced || got > written {
				t.Errorf("snapshot holds %d records, want %d to %d", got, synced, written)
			}
			if live := checkRecords(t, filepath.Join(v.Path, "log")); live != written {
				t.Errorf("live disk holds %d records, writer wrote %d", live, written)
			}
		})
	}
}

// TestSnapshotDiskFull: a snapshot that must copy and cannot fit fails
// with ENOSPC, whether the free-space check refuses it or the substrate
// fills halfway, and leaves the disk thawed, mounted and writable.
func TestSnapshotDiskFull(t *testing.T) {
	s := testSubstrate(t, SubstrateOptions{Size: 400 << 20, ForceCopy: true})
	p := substratePool(t, s, Config{})
	v := acquire(t, p, "full", 300<<20)
	writeFile(t, filepath.Join(v.Path, "fill"), 200<<20)
	for _, tc := range []struct {
		name   string
		midway bool
	}{{"checked", false}, {"midway", true}} {
		t.Run(tc.name, func(t *testing.T) {
			p.copyOpts.noSpaceCheck = tc.midway
			dst := filepath.Join(s.Dir(), tc.name+".img")
			var paused, resumed int
			_, err := p.Snapshot(context.Background(), "full", dst, func() (func(), error) {
				paused++
				return func() { resumed++ }, nil
			})
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("Snapshot = %v, want ENOSPC", err)
			}
			t.Log(err)
			for _, p := range []string{dst, dst + tmpSuffix} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after a failed snapshot: %v", p, err)
				}
			}
			if paused != 1 || resumed != 1 {
				t.Errorf("pause called %d times, resume %d; want 1 and 1", paused, resumed)
			}
			if !isMountpoint(t, v.Path) {
				t.Fatal("disk not mounted after a failed snapshot")
			}
			fd, err := unix.Open(v.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			err = unix.IoctlSetInt(fd, fiThaw, 0)
			unix.Close(fd)
			if !errors.Is(err, unix.EINVAL) {
				t.Errorf("FITHAW after a failed snapshot = %v, want EINVAL (not frozen)", err)
			}
			writeWithin(t, filepath.Join(v.Path, "after-"+tc.name), 10*time.Second)
		})
	}
}

// writeWithin writes and syncs 1 MiB to path, failing if that takes longer
// than d (a frozen disk would block it).
func writeWithin(t testing.TB, path string, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(path, make([]byte, 1<<20), 0o644) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("writing %s: %v", path, err)
		}
	case <-time.After(d):
		t.Fatalf("writing %s blocked for %v: disk frozen?", path, d)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Errorf("syncing %s: %v", path, err)
	}
}

// TestAcquireFrom forks a disk from a snapshot: the fork sees the
// snapshot's files, and the two disks then go their own ways.
func TestAcquireFrom(t *testing.T) {
	ctx := context.Background()
	for _, setup := range []snapshotSetup{snapshotSetups[0], snapshotSetups[2]} {
		t.Run(setup.name, func(t *testing.T) {
			p, base := setup.make(t, 0)
			parent := acquire(t, p, "parent", 64<<20)
			write := func(dir, name, data string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			read := func(dir, name string) string {
				t.Helper()
				b, err := os.ReadFile(filepath.Join(dir, name))
				if errors.Is(err, os.ErrNotExist) {
					return "<none>"
				} else if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			write(parent.Path, "a", "from parent")

			img, err := p.ImagePath("parent")
			if err != nil || img != filepath.Join(filepath.Dir(parent.Path), imageName) {
				t.Errorf("ImagePath = %q, %v", img, err)
			}
			snap := filepath.Join(base, "parent.img")
			c, err := p.Snapshot(ctx, "parent", snap, nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.Frozen != c.FSFrozen {
				t.Errorf("without a pause hook Frozen = %v, want FSFrozen %v", c.Frozen, c.FSFrozen)
			}

			start := time.Now()
			child, err := p.AcquireFrom(ctx, "child", snap, 1000, 1000)
			if err != nil {
				t.Fatalf("AcquireFrom: %v", err)
			}
			t.Logf("forked in %v: %+v", time.Since(start), child)
			if child.Size != parent.Size || child.Path != filepath.Join(p.volDir, "child", rootName) || !isMountpoint(t, child.Path) {
				t.Errorf("fork = %+v, parent %+v", child, parent)
			}
			if got, err := p.Open("child"); err != nil || *got != *child {
				t.Errorf("Open(child) = %+v, %v", got, err)
			}
			if got := read(child.Path, "a"); got != "from parent" {
				t.Errorf("fork reads %q", got)
			}
			write(child.Path, "b", "child only")
			write(parent.Path, "c", "parent only")
			write(parent.Path, "a", "changed in parent")
			if got := read(parent.Path, "b"); got != "<none>" {
				t.Errorf("parent sees the fork's file: %q", got)
			}
			if got := read(child.Path, "c"); got != "<none>" {
				t.Errorf("fork sees the parent's new file: %q", got)
			}
			if got := read(child.Path, "a"); got != "from parent" {
				t.Errorf("fork sees the parent's change: %q", got)
			}

			for _, tc := range []struct {
				id, src string
				want    error
			}{
				{"child", snap, errdefs.ErrConflict},
				{"Bad!", snap, errdefs.ErrInvalid},
				{"x", filepath.Join(base, "missing.img"), errdefs.ErrNotFound},
				{"x", base, errdefs.ErrInvalid},
			} {
				if _, err := p.AcquireFrom(ctx, tc.id, tc.src, 0, 0); !errors.Is(err, tc.want) {
					t.Errorf("AcquireFrom(%q, %s) = %v, want %v", tc.id, tc.src, err, tc.want)
				}
			}
			if _, err := p.ImagePath("nobody"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("ImagePath(nobody) = %v, want ErrNotFound", err)
			}
			called := false
			pause := func() (func(), error) { called = true; return nil, nil }
			if _, err := p.Snapshot(ctx, "parent", snap, pause); !errors.Is(err, errdefs.ErrConflict) || called {
				t.Errorf("Snapshot onto an existing file = %v (paused: %v), want ErrConflict without a pause", err, called)
			}
			if _, err := p.Snapshot(ctx, "nobody", filepath.Join(base, "n.img"), nil); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Snapshot(nobody) = %v, want ErrNotFound", err)
			}
			if _, err := p.Snapshot(ctx, "../x", filepath.Join(base, "n.img"), nil); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Snapshot(../x) = %v, want ErrInvalid", err)
			}

			for _, id := range []string{"parent", "child"} {
				if err := p.Remove(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if ents, _ := os.ReadDir(p.poolDir); len(ents) != 0 {
				t.Errorf("pool dir holds %v", ents)
			}
			assertNoLoops(t, p.cfg.Dir)
		})
	}
}

// TestSnapshotExclusive: while a disk is being captured a second snapshot
// of it is refused and Remove waits, even under a new id.
func TestSnapshotExclusive(t *testing.T) {
	ctx := context.Background()
	base := testDir(t)
	p := newTestPool(t, Config{Dir: filepath.Join(base, "disks")})
	acquire(t, p, "x", 0)
	removed := make(chan error, 1)
	_, err := p.Snapshot(ctx, "x", filepath.Join(base, "x.img"), func() (func(), error) {
		if err := p.Rename("x", "y"); err != nil {
			t.Errorf("Rename during the snapshot: %v", err)
		}
		go func() { removed <- p.Remove(ctx, "y") }()
		second := filepath.Join(base, "second.img")
		if _, err := p.Snapshot(ctx, "y", second, nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("concurrent Snapshot = %v, want ErrConflict", err)
		}
		if _, err := os.Stat(second); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused snapshot left %s: %v", second, err)
		}
		select {
		case err := <-removed:
			t.Errorf("Remove returned during the snapshot: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-removed:
		if err != nil {
			t.Errorf("Remove after the snapshot: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Remove still waiting 10s after the snapshot")
	}
	if ids, _ := p.List(); len(ids) != 0 {
		t.Errorf("List = %v after Remove", ids)
	}
	checkImage(t, filepath.Join(base, "x.img"))
}

// TestThawStale: a disk left frozen by a process that died mid-snapshot is
// thawed by the next NewPool.
func TestThawStale(t *testing.T) {
	dir := testDir(t)
	a, err := NewPool(Config{Dir: dir, DefaultSize: testSize})
	if err != nil {
		t.Fatal(err)
	}
	v := acquire(t, a, "frozen", 0)
	fd, err := unix.Open(v.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.IoctlSetInt(fd, fiThaw, 0) // whatever happened, let scrub unmount it
		unix.Close(fd)
	})
	if err := unix.IoctlSetInt(fd, fiFreeze, 0); err != nil {
		t.Fatal(err)
	}
	a.abandon()
	b := newTestPool(t, Config{Dir: dir})
	if err := unix.IoctlSetInt(fd, fiThaw, 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("FITHAW after NewPool = %v, want EINVAL (thawed already)", err)
	}
	writeWithin(t, filepath.Join(v.Path, "f"), 10*time.Second)
	if err := b.Remove(context.Background(), "frozen"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumesUseDirectIO: volumes' loop devices do direct I/O with 4 KiB
// blocks wherever the backing filesystem takes O_DIRECT.
func TestVolumesUseDirectIO(t *testing.T) {
	for _, setup := range []snapshotSetup{snapshotSetups[0], snapshotSetups[2]} {
		t.Run(setup.name, func(t *testing.T) {
			p, _ := setup.make(t, 0)
			v := acquire(t, p, "dio", 0)
			img := filepath.Join(filepath.Dir(v.Path), imageName)
			fd, err := unix.Open(img, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Skipf("backing filesystem refuses O_DIRECT: %v", err)
			}
			unix.Close(fd)
			if !loopDirectIO(v.Device) {
				t.Errorf("%s does not do direct I/O", v.Device)
			}
			b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(v.Device), "queue", "logical_block_size"))
			if err != nil || strings.TrimSpace(string(b)) != "4096" {
				t.Errorf("logical block size of %s = %q, %v; want 4096", v.Device, b, err)
			}
		})
	}
}

// TestAcquireFromReadyClone: a snapshot used twice gets a clone made
// ahead of time, which the third AcquireFrom takes (same contents, no
// clone left); a snapshot replaced under the same path does not hand out
// the old one's clone, and a removed one's clone is dropped.
func TestAcquireFromReadyClone(t *testing.T) {
	ctx := context.Background()
	setup := snapshotSetups[0]
	p, base := setup.make(t, 0)
	parent := acquire(t, p, "parent", 64<<20)
	if err := os.WriteFile(filepath.Join(parent.Path, "a"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(base, "parent.img")
	if _, err := p.Snapshot(ctx, "parent", snap, nil); err != nil {
		t.Fatal(err)
	}
	readyFor := func(path string) *readyClone {
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.mu.Lock()
			rc, busy := p.clones[path], p.cloning[path]
			p.mu.Unlock()
			if rc != nil || !busy && time.Now().After(deadline) {
				return rc
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	read := func(v *Volume) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(v.Path, "a"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i, id := range []string{"c1", "c2"} {
		v, err := p.AcquireFrom(ctx, id, snap, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if read(v) != "one" {
			t.Fatalf("clone %d reads %q", i, read(v))
		}
	}
	rc := readyFor(snap)
	if rc == nil {
		t.Fatal("no ready clone after a source's second use")
	}
	// A volume made ahead of time leaves the ready clone alone.
	w, err := p.CloneFrom(ctx, "w1", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if read(w) != "one" || w.Device == rc.e.device {
		t.Fatalf("CloneFrom = %+v, took the ready clone on %s", w, rc.e.device)
	}
	v, err := p.AcquireFrom(ctx, "c3", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if read(v) != "one" || v.Device != rc.e.device || !isMountpoint(t, v.Path) {
		t.Fatalf("third AcquireFrom = %+v, want the ready clone on %s", v, rc.e.device)
	}
	// Replace the snapshot: the clone made from the old file must not be
	// handed out.
	if err := os.WriteFile(filepath.Join(parent.Path, "a"), []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rc = readyFor(snap); rc == nil {
		t.Fatal("no ready clone after the third use")
	}
	if err := os.Remove(snap); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(ctx, "parent", snap, nil); err != nil {
		t.Fatal(err)
	}
	v, err = p.AcquireFrom(ctx, "c4", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(v); got != "two" {
		t.Fatalf("after the snapshot was replaced a clone reads %q", got)
	}
	// Removed: its clone goes at the next use of any source.
	readyFor(snap)
	os.Remove(snap)
	other := filepath.Join(base, "other.img")
	if _, err := p.Snapshot(ctx, "parent", other, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AcquireFrom(ctx, "c5", other, 0, 0); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	left := p.clones[snap]
	p.mu.Unlock()
	if left != nil {
		t.Fatal("the clone of a removed snapshot was kept")
	}
	// Forgotten (a snapshot removed through the store): its clone goes,
	// with its mount and loop device, in the background.
	if _, err := p.AcquireFrom(ctx, "c6", other, 0, 0); err != nil {
		t.Fatal(err)
	}
	rc = readyFor(other)
	if rc == nil {
		t.Fatal("no ready clone after a source's second use")
	}
	if !isMountpoint(t, filepath.Join(rc.e.dir, rootName)) {
		t.Fatalf("ready clone not mounted in %s", rc.e.dir)
	}
	p.Forget(other)
	p.reaper.wait()
	p.mu.Lock()
	left = p.clones[other]
	p.mu.Unlock()
	if left != nil {
		t.Fatal("Forget kept the ready clone")
	}
	if isMountpoint(t, filepath.Join(rc.e.dir, rootName)) {
		t.Fatalf("Forget left the clone mounted in %s", rc.e.dir)
	}
	for _, id := range []string{"c1", "c2", "c3", "c4", "c5", "c6", "w1"} {
		if err := p.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSnapshotDropsEmptyJournal: a disk that committed many transactions
// has a log of many one-block extents; its snapshot has none of them (the
// journal is empty once frozen), stays a clean filesystem, and a disk made
// from it mounts, journals and syncs as any other.
func TestSnapshotDropsEmptyJournal(t *testing.T) {
	ctx := context.Background()
	p, base := snapshotSetups[0].make(t, 0)
	v := acquire(t, p, "busy", 0)
	for i := range 200 {
		f, err := os.Create(filepath.Join(v.Path, fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("x")
		if err := f.Sync(); err != nil { // a journal commit each
			t.Fatal(err)
		}
		f.Close()
	}
	// Blocks written and freed, as a recycled disk's: the odd files go.
	for i := 1; i < 200; i += 2 {
		if err := os.Remove(filepath.Join(v.Path, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	img, err := p.ImagePath("busy")
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(base, "busy.img")
	if _, err := p.Snapshot(ctx, "busy", snap, nil); err != nil {
		t.Fatal(err)
	}
	before, after := extentsOf(t, img), extentsOf(t, snap)
	t.Logf("extents: disk %d, snapshot %d", before, after)
	if after >= before {
		t.Errorf("snapshot maps %d extents, the disk %d: want fewer", after, before)
	}
	// The files left read back; the freed blocks hold no data.
	if n := freeBlocksWithData(t, snap); n != 0 {
		t.Errorf("%d blocks the snapshot's bitmaps mark free hold data", n)
	}
	// The log holds data on the disk, none in the snapshot but its
	// superblock.
	for path, want := range map[string]bool{img: true, snap: false} {
		if got := logHoldsData(t, path); got != want {
			t.Errorf("log of %s holds data: %v, want %v", path, got, want)
		}
	}
	checkImage(t, snap)
	mnt := filepath.Join(base, "ro")
	mountReadOnly(t, snap, mnt)
	for i := 0; i < 200; i += 2 {
		if b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("f%d", i))); err != nil || string(b) != "x" {
			t.Errorf("f%d in the snapshot: %q, %v", i, b, err)
		}
	}

	child, err := p.AcquireFrom(ctx, "child", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := os.WriteFile(filepath.Join(child.Path, fmt.Sprintf("g%d", i)), []byte("y"), 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(child.Path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Syncfs(fd)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
	}
	again := filepath.Join(base, "child.img")
	if _, err := p.Snapshot(ctx, "child", again, nil); err != nil {
		t.Fatal(err)
	}
	checkImage(t, again)
}

func extentsOf(t testing.TB, path string) int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return mappedExtents(t, f)
}

// logHoldsData reports whether the ext4 image at path has data in its
// journal past the journal's superblock.
func logHoldsData(t testing.TB, path string) bool {
	t.Helper()
	f, _ := openImage(t, path)
	im, err := readImage(f)
	if err != nil {
		t.Fatal(err)
	}
	bsize := int64(im.bsize)
	exts, err := im.journalExtents()
	if err != nil || len(exts) == 0 {
		t.Fatalf("journal extents of %s: %v, %v", path, exts, err)
	}
	for _, e := range exts {
		start, end := int64(e.physical)*bsize, int64(e.physical+e.length)*bsize
		if e.logical == 0 {
			start += bsize
		}
		data, err := unix.Seek(int(f.Fd()), start, unix.SEEK_DATA)
		if err == nil && data < end {
			return true
		}
	}
	return false
}

// freeBlocksWithData counts the blocks of the ext4 image at path that its
// block bitmaps mark free and that hold data (not holes), through
// dropFreeBlocks's own reading of the bitmaps, on a copy.
func freeBlocksWithData(t testing.TB, path string) int64 {
	t.Helper()
	cp := path + ".probe"
	if err := Clone(path, cp); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(cp)
	f, err := os.OpenFile(cp, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var before, after unix.Stat_t
	unix.Fstat(int(f.Fd()), &before)
	t0 := time.Now()
	im, err := readImage(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := im.dropFreeBlocks(); err != nil {
		t.Fatal(err)
	}
	t.Logf("scanning the free blocks of %s took %v", path, time.Since(t0))
	unix.Fstat(int(f.Fd()), &after)
	return (before.Blocks - after.Blocks) * 512 / 4096
}
