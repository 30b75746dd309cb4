package disk

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fillTree writes into dir every kind of thing a sandbox's disk holds
// that a mirror must keep, and links that point out of it.
func fillTree(t *testing.T, dir, outside string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"upper/opt/app", "upper/tmp", "upper/srv", "work/work"} {
		must(os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	u := filepath.Join(dir, "upper")
	must(os.WriteFile(filepath.Join(u, "opt/app/run.txt"), []byte("built\n"), 0o644))
	must(unix.Chmod(filepath.Join(u, "tmp"), 0o1777))
	must(unix.Chmod(filepath.Join(u, "srv"), 0o2750))
	must(os.Chown(filepath.Join(u, "srv"), 1000, 1001))
	// A setuid program owned by root, a hole in the middle of a file.
	tool := filepath.Join(u, "opt/app/tool")
	f, err := os.OpenFile(tool, os.O_CREATE|os.O_WRONLY, 0o755)
	must(err)
	_, err = f.WriteAt([]byte("head"), 0)
	must(err)
	_, err = f.WriteAt([]byte("tail"), 1<<20)
	must(err)
	must(f.Close())
	must(unix.Chmod(tool, 0o4755))
	must(unix.Setxattr(tool, "user.origin", []byte("template"), 0))
	must(unix.Setxattr(filepath.Join(u, "opt"), "trusted.overlay.opaque", []byte("y"), 0))
	// Hard links, one of them across directories.
	must(os.Link(filepath.Join(u, "opt/app/run.txt"), filepath.Join(u, "srv/run-link")))
	must(os.Link(filepath.Join(u, "opt/app/run.txt"), filepath.Join(u, "opt/run-link")))
	// A whiteout, a FIFO, links out of the volume and a dangling one.
	must(unix.Mknod(filepath.Join(u, "opt/deleted"), unix.S_IFCHR, 0))
	must(unix.Mkfifo(filepath.Join(u, "srv/pipe"), 0o640))
	must(os.Symlink(outside, filepath.Join(u, "srv/out")))
	must(os.Symlink("/", filepath.Join(u, "root-link")))
	must(os.Symlink("../../../../../etc/passwd", filepath.Join(u, "opt/app/up")))
	must(unix.Lsetxattr(filepath.Join(u, "root-link"), "trusted.note", []byte("a link's"), 0))
	must(os.Lchown(filepath.Join(u, "root-link"), 1000, 1000))
	// A flag its owner set (chattr +A).
	nf, err := os.Open(filepath.Join(u, "opt/app/run.txt"))
	must(err)
	flags, err := unix.IoctlGetInt(int(nf.Fd()), unix.FS_IOC_GETFLAGS)
	must(err)
	must(unix.IoctlSetPointerInt(int(nf.Fd()), unix.FS_IOC_SETFLAGS, flags|flNoatime))
	nf.Close()
	// Old times, set last and deepest first.
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	paths := []string{}
	must(filepath.Walk(u, func(path string, _ os.FileInfo, err error) error {
		paths = append(paths, path)
		return err
	}))
	slices.Reverse(paths)
	for _, p := range paths {
		ts := []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.Add(time.Hour).UnixNano())}
		must(unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// describe lists everything a sandbox can see of the tree under dir (but
// inode numbers and change times), one line per file, and its hard link
// groups.
func describe(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	inodes := map[uint64][]string{}
	err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel == "." || rel == keepOnWipe || strings.HasPrefix(rel, keepOnWipe+"/") {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d rdev=%d mtime=%d", rel, st.Mode, st.Uid, st.Gid, st.Rdev, st.Mtim.Nano())
		// A directory's access time moves as the walk reads it.
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			line += fmt.Sprintf(" atime=%d", st.Atim.Nano())
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" size=%d sha=%x blocks=%d", st.Size, sha256.Sum256(b), st.Blocks)
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			flags, _ := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
			f.Close()
			line += fmt.Sprintf(" flags=%#x", flags&flagsKept)
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			line += " -> " + target
		}
		n, _ := unix.Llistxattr(path, nil)
		if n > 0 {
			buf := make([]byte, n)
			n, _ = unix.Llistxattr(path, buf)
			names := splitNul(buf[:n])
			slices.Sort(names)
			for _, name := range names {
				v := make([]byte, 256)
				k, err := unix.Lgetxattr(path, name, v)
				if err != nil {
					return err
				}
				line += fmt.Sprintf(" %s=%q", name, v[:k])
			}
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range inodes {
		slices.Sort(names)
		out = append(out, "linked "+strings.Join(names, " "))
	}
	slices.Sort(out)
	return out
}

// TestAcquireFromSeed: the second volume made from a small snapshot image
// of the default size is a ready volume with the image's files mirrored
// into it, the same as a clone in all a sandbox sees; links are copied,
// not followed. An image that holds too much is cloned; Forget unmounts
// the seed.
func TestAcquireFromSeed(t *testing.T) {
	ctx := context.Background()
	sub := testSubstrate(t, SubstrateOptions{})
	p := substratePool(t, sub, Config{PoolSize: 2})
	base := sub.Dir()
	outside := filepath.Join(base, "outside")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent := acquire(t, p, "parent", 0)
	fillTree(t, parent.Path, outside)
	snap := filepath.Join(base, "parent.img")
	if _, err := p.Snapshot(ctx, "parent", snap, nil); err != nil {
		t.Fatal(err)
	}
	// markReady tags the root of every ready volume with a new mark,
	// and fromReady says whether a volume's root has the last one. Not
	// devices: a clone made after a failed mirror may get the loop device
	// the mirror's destroyed volume had.
	const markName = "user.paddock-test-ready"
	mark := 0
	markReady := func() {
		waitReady(t, p, 2)
		mark++
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.ready {
			if err := unix.Setxattr(filepath.Join(e.dir, rootName), markName, []byte(fmt.Sprint(mark)), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	fromReady := func(v *Volume) bool {
		buf := make([]byte, 32)
		n, err := unix.Getxattr(v.Path, markName, buf)
		return err == nil && string(buf[:n]) == fmt.Sprint(mark)
	}

	clone, err := p.AcquireFrom(ctx, "clone", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	markReady()
	mirrored, err := p.AcquireFrom(ctx, "mirrored", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !fromReady(mirrored) {
		t.Fatal("the second volume from a small image is not one of the ready volumes")
	}
	if mirrored.Size != clone.Size {
		t.Errorf("mirrored volume of %d bytes, the clone %d", mirrored.Size, clone.Size)
	}
	want, got := describe(t, clone.Path), describe(t, mirrored.Path)
	if !slices.Equal(want, got) {
		t.Errorf("the mirrored volume differs from the clone:\nclone:\n%s\nmirrored:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
	if len(want) < 15 {
		t.Errorf("the clone shows %d files, want the tree fillTree made:\n%s", len(want), strings.Join(want, "\n"))
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host" {
		t.Errorf("the file a link pointed at: %q, %v", b, err)
	}
	// Made ahead of time too (a template's warm pool).
	markReady()
	ahead, err := p.CloneFrom(ctx, "ahead", snap, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !fromReady(ahead) || !slices.Equal(describe(t, ahead.Path), want) {
		t.Errorf("CloneFrom of a seeded image: from a ready volume %v, the same as the clone %v", fromReady(ahead), slices.Equal(describe(t, ahead.Path), want))
	}

	// An image past a seed's bounds is cloned each time.
	big := acquire(t, p, "big", 0)
	for i := range seedMaxInodes + 1 {
		if err := os.WriteFile(filepath.Join(big.Path, fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bigSnap := filepath.Join(base, "big.img")
	if _, err := p.Snapshot(ctx, "big", bigSnap, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"big1", "big2"} {
		markReady()
		v, err := p.AcquireFrom(ctx, id, bigSnap, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fromReady(v) {
			t.Errorf("%s: a volume from an image of %d files took a ready volume", id, seedMaxInodes+1)
		}
	}

	// So is one whose few files have more names than a mirror copies.
	links := acquire(t, p, "links", 0)
	if err := os.WriteFile(filepath.Join(links.Path, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range seedMaxInodes {
		if err := os.Link(filepath.Join(links.Path, "f"), filepath.Join(links.Path, fmt.Sprint("l", i))); err != nil {
			t.Fatal(err)
		}
	}
	linksSnap := filepath.Join(base, "links.img")
	if _, err := p.Snapshot(ctx, "links", linksSnap, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"links1", "links2"} {
		markReady()
		v, err := p.AcquireFrom(ctx, id, linksSnap, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		ents, err := os.ReadDir(v.Path)
		if err != nil {
			t.Fatal(err)
		}
		if fromReady(v) || len(ents) != seedMaxInodes+2 {
			t.Errorf("%s: from an image of one file with %d names: took a ready volume %v, %d names in its root", id, seedMaxInodes+1, fromReady(v), len(ents))
		}
	}

	seedOf := func(path string) string {
		t.Helper()
		p.mu.Lock()
		s := p.seeds[path]
		p.mu.Unlock()
		if s == nil || s.dir == "" || !isMountpoint(t, filepath.Join(s.dir, rootName)) {
			t.Fatalf("no seed mounted for %s: %+v", path, s)
		}
		return filepath.Join(s.dir, rootName)
	}
	// Forgotten (its snapshot removed): the seed is unmounted.
	seedRoot := seedOf(snap)
	p.Forget(snap)
	if isMountpoint(t, seedRoot) {
		t.Errorf("Forget left the seed mounted at %s", seedRoot)
	}
	// Gone without Forget: its seed goes at the next use of any image.
	again := filepath.Join(base, "again.img")
	if _, err := p.Snapshot(ctx, "parent", again, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"again1", "again2"} {
		if _, err := p.AcquireFrom(ctx, id, again, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	seedRoot = seedOf(again)
	if err := os.Remove(again); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AcquireFrom(ctx, "big3", bigSnap, 0, 0); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	left := p.seeds[again]
	p.mu.Unlock()
	if left != nil || isMountpoint(t, seedRoot) {
		t.Errorf("the seed of a removed image is kept (%+v) or still mounted at %s", left, seedRoot)
	}
	for _, id := range []string{"parent", "clone", "mirrored", "ahead", "big", "big1", "big2", "links", "links1", "links2", "again1", "again2", "big3"} {
		if err := p.Remove(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
