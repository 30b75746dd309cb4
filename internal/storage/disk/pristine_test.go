package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// imageUUID reads the UUID in the primary superblock of the ext4 image at
// path.
func imageUUID(t testing.TB, path string) [16]byte {
	t.Helper()
	_, sb := openImage(t, path)
	return [16]byte(sb[sbUUID : sbUUID+16])
}

// openImage opens the ext4 image at path until the test ends and reads
// its superblock.
func openImage(t testing.TB, path string) (*os.File, []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	sb, err := readSuper(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, sb
}

// sharedBytes is how much of path's data is shared with other files.
func sharedBytes(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	if err := extents(f, func(_, length int64, flags uint32) error {
		if flags&fiemapExtentShared != 0 {
			n += length
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// fsck checks the unmounted ext4 image at path, forcing a full check and
// changing nothing.
func fsck(t testing.TB, path string) {
	t.Helper()
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		for _, p := range []string{"/usr/sbin/e2fsck", "/sbin/e2fsck"} {
			if _, err := os.Stat(p); err == nil {
				e2fsck = p
			}
		}
	}
	if e2fsck == "" {
		t.Log("no e2fsck: image not checked")
		return
	}
	if out, err := exec.Command(e2fsck, "-fn", path).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", path, err, out)
	}
}

// TestPristineClones: every volume of a size is a clone of one pristine
// image, sharing its blocks on a substrate that reflinks and copying them
// on one forced to copy; each has a UUID of its own, several mount at
// once, and each stays a valid filesystem of its own after writes.
func TestPristineClones(t *testing.T) {
	for _, forceCopy := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy=%v", forceCopy), func(t *testing.T) {
			s := testSubstrate(t, SubstrateOptions{ForceCopy: forceCopy})
			p := substratePool(t, s, Config{})
			vols := []*Volume{acquire(t, p, "a", 0), acquire(t, p, "b", 0), acquire(t, p, "c", 0)}
			pristine := filepath.Join(p.cfg.Dir, pristineDir, pristineName(testSize))
			fsck(t, pristine)
			ents, err := os.ReadDir(filepath.Join(p.cfg.Dir, pristineDir))
			if err != nil || len(ents) != 1 {
				t.Fatalf("pristine images: %v, %v; want the one of %d MiB", ents, err, testSize>>20)
			}
			uuids := map[[16]byte]string{imageUUID(t, pristine): "the pristine image"}
			for i, v := range vols {
				img := filepath.Join(filepath.Dir(v.Path), imageName)
				u := imageUUID(t, img)
				if other, ok := uuids[u]; ok {
					t.Errorf("%s has the UUID of %s", v.ID, other)
				}
				uuids[u] = v.ID
				if shared := sharedBytes(t, img); forceCopy == (shared > 0) {
					t.Errorf("%s shares %d bytes with the pristine image; copying is %v", v.ID, shared, forceCopy)
				}
				if err := os.WriteFile(filepath.Join(v.Path, "mine"), []byte(v.ID), 0o644); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					writeFile(t, filepath.Join(v.Path, "data"), 8<<20)
				}
			}
			for _, v := range vols {
				if b, err := os.ReadFile(filepath.Join(v.Path, "mine")); err != nil || string(b) != v.ID {
					t.Errorf("%s reads %q, %v", v.ID, b, err)
				}
			}
			// Unmounted (as a snapshot's clone would be read), each image
			// is a clean filesystem, and the pristine image is untouched.
			for _, v := range vols {
				if err := unix.Unmount(v.Path, 0); err != nil {
					t.Fatal(err)
				}
				fsck(t, filepath.Join(filepath.Dir(v.Path), imageName))
			}
			fsck(t, pristine)
		})
	}
}

// TestPristineKept: a later pool clones the pristine image an earlier one
// made; one of another format, or one not whole, is replaced; and at most
// maxPristines sizes are kept.
func TestPristineKept(t *testing.T) {
	dir := testDir(t)
	a := newTestPool(t, Config{Dir: dir})
	acquire(t, a, "a", 0)
	pristine := filepath.Join(dir, pristineDir, pristineName(testSize))
	var st unix.Stat_t
	if err := unix.Stat(pristine, &st); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	stale := []string{"v0-ext4-64M.img", pristineName(32<<20) + tmpSuffix, pristineName(48 << 20), "junk"}
	for _, name := range stale {
		if err := os.WriteFile(filepath.Join(dir, pristineDir, name), []byte("not a filesystem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	b := newTestPool(t, Config{Dir: dir})
	for _, name := range stale {
		if _, err := os.Stat(filepath.Join(dir, pristineDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale %s kept: %v", name, err)
		}
	}
	acquire(t, b, "b", 0)
	var again unix.Stat_t
	if err := unix.Stat(pristine, &again); err != nil || again.Ino != st.Ino {
		t.Errorf("the pristine image was made again (inode %d, was %d): %v", again.Ino, st.Ino, err)
	}
	acquire(t, b, "c", 48<<20) // its stale image replaced by a good one
	for i := range maxPristines + 1 {
		acquire(t, b, fmt.Sprintf("s%d", i), int64(17+i)<<20)
	}
	ents, err := os.ReadDir(filepath.Join(dir, pristineDir))
	if err != nil || len(ents) != maxPristines {
		t.Errorf("pristine images kept: %d, %v; want %d", len(ents), err, maxPristines)
	}
	if _, err := os.Stat(pristine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the image used least lately is still there: %v", err)
	}
	acquire(t, b, "d", 0) // made again
}

// TestRemoveInBackground: Remove frees the id at once; the unmount and
// deletion follow. A crash before they are done leaves trash, which the
// next pool sweeps, leaving no mount nor loop device behind.
func TestRemoveInBackground(t *testing.T) {
	dir := testDir(t)
	a, err := NewPool(Config{Dir: dir, DefaultSize: testSize, Overcommit: 100})
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, a, "x", 0)
	v := acquire(t, a, "y", 0)
	// Unwritten data: a removal shuts the disk down rather than write it.
	f, err := os.Create(filepath.Join(v.Path, "dirty"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if n := delayedBlocks(strings.TrimPrefix(v.Device, "/dev/")); n <= dropDirtyBlocks {
		t.Errorf("%s holds %d blocks of delayed allocation after an unsynced 4 MiB write, want > %d", v.Device, n, dropDirtyBlocks)
	}
	if err := a.Remove(context.Background(), "y"); err != nil {
		t.Fatal(err)
	}
	acquire(t, a, "y", 0) // the id is free at once
	if err := a.Remove(context.Background(), "y"); err != nil {
		t.Fatal(err)
	}
	a.reaper.wait()
	if ents, _ := os.ReadDir(filepath.Join(dir, "trash")); len(ents) != 0 {
		t.Errorf("trash after the removals: %v", ents)
	}

	// A crash with a removal not yet done: the disk sits in trash, still
	// mounted, until the next pool sweeps it.
	a.reaper.mu.Lock()
	a.reaper.closed = true // removals now run in Remove: keep this one
	a.reaper.mu.Unlock()
	trash := filepath.Join(dir, "trash", "left")
	if err := os.Rename(filepath.Join(dir, "vol", "x"), trash); err != nil {
		t.Fatal(err)
	}
	a.abandon()
	if !isMountpoint(t, filepath.Join(trash, rootName)) {
		t.Fatal("the disk left in trash is not mounted")
	}
	newTestPool(t, Config{Dir: dir})
	if ents, _ := os.ReadDir(filepath.Join(dir, "trash")); len(ents) != 0 {
		t.Errorf("trash after a restart: %v", ents)
	}
	if m := mountsUnder(t, dir); len(m) != 0 {
		t.Errorf("mounts after a restart: %v", m)
	}
	assertNoLoops(t, dir)
}

// TestConcurrentMakes: volumes made at once (a pool's workers and creates
// that found it empty) each get a loop device, none failing because the
// others took the one loop-control named.
func TestConcurrentMakes(t *testing.T) {
	p := newTestPool(t, Config{PoolSize: 4})
	acquire(t, p, "first", 24<<20) // the pristine image: the others only clone
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id := fmt.Sprintf("m%d", i)
			if _, err := p.Acquire(context.Background(), id, 24<<20, 0, 0); err != nil {
				t.Errorf("Acquire %s: %v", id, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	waitReady(t, p, 4)
}

// TestFreshUUID: the UUID changes and the superblock's checksum with it;
// an image without metadata_csum_seed keeps its UUID.
func TestFreshUUID(t *testing.T) {
	requireRoot(t)
	mkfs, err := findMkfs("")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	if err := formatPristine(mkfs, img, 32<<20); err != nil {
		t.Fatal(err)
	}
	before := imageUUID(t, img)
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := setFreshUUID(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if after := imageUUID(t, img); after == before {
		t.Error("UUID unchanged")
	} else if after[6]>>4 != 4 || after[8]>>6 != 2 {
		t.Errorf("UUID %x is not a random (version 4) one", after)
	}
	fsck(t, img)

	plain := filepath.Join(dir, "plain.img")
	if err := createSparse(plain, 32<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-O", "^metadata_csum_seed", plain).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	before = imageUUID(t, plain)
	f, err = os.OpenFile(plain, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := setFreshUUID(f); err != nil {
		t.Fatal(err)
	}
	if imageUUID(t, plain) != before {
		t.Error("the UUID of an image without metadata_csum_seed changed")
	}
	if err := checkPristine(plain, 32<<20); err == nil {
		t.Error("checkPristine accepted an image without metadata_csum_seed")
	}
	if err := checkPristine(img, 64<<20); err == nil {
		t.Error("checkPristine accepted an image of another size")
	}
	// 10241 MiB: mkfs leaves out the last block group (1 MiB).
	odd := filepath.Join(dir, "odd.img")
	if err := formatPristine(mkfs, odd, 10241<<20); err != nil {
		t.Fatalf("a 10241 MiB disk: %v", err)
	}
	if err := checkPristine(odd, 10249<<20); err == nil {
		t.Error("checkPristine accepted an image 8 MiB short")
	}
}
