package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// A removed sandbox's volume goes back to the pool when it held little:
// its files are deleted and the volume, still mounted, is handed to the
// next sandbox. Making a volume (a clone of the pristine image, its
// superblock, a loop device, a mount) and destroying one (the unmount's
// flush, the loop device, the image's blocks) cost the daemon and the
// kernel's loop and XFS workers more than any other part of a sandbox's
// churn (issue 21); deleting a few files costs a fraction of it.
//
// What the next sandbox can see of the last one is what a filesystem
// shows any user of the blocks another user freed: nothing. The volume's
// root is only ever reached through the sandbox's overlay (its upper and
// work directories, which are deleted) and no sandbox gets the block
// device. The blocks those files held stay in the image (unless written
// again), so a volume is recycled only while its image and filesystem
// hold little, which also bounds the time the deletion takes.
const (
	// recycleMaxUsed bounds the bytes a recycled volume's filesystem
	// uses and its image has allocated on the substrate.
	recycleMaxUsed = 64 << 20
	// recycleMaxInodes bounds the inodes it uses.
	recycleMaxInodes = 4096
	// recycleFactor times PoolSize is the most ready volumes the pool
	// keeps of those given back (see wants), before any surge.
	recycleFactor = 2
	// recycleHold is how long after the refill last made a volume the
	// pool may surge: a volume given back to a full pool is kept (up to
	// recycleFactor times PoolSize more) rather than torn down, as the
	// refill made one that recently.
	recycleHold = time.Minute
)

// keepOnWipe names what a fresh filesystem's root holds, which wiping
// keeps: mkfs's lost+found (only fsck writes into it).
const keepOnWipe = "lost+found"

// Recycle removes id's volume as Remove does, for a caller that knows
// nothing uses it any more (every process of its sandbox has ended). The
// volume is renamed into trash at once; behind the call it is wiped and
// put back among the ready volumes if it is of the default size, holds
// little and the pool is short of its size, and torn down otherwise.
func (p *Pool) Recycle(ctx context.Context, id string) error {
	dst, err := p.toTrash(ctx, id)
	if err != nil || dst == "" {
		return err
	}
	var st unix.Stat_t
	if p.cfg.PoolSize == 0 || unix.Stat(filepath.Join(dst, imageName), &st) != nil || st.Size != p.cfg.DefaultSize {
		p.reaper.remove(dst)
		return nil
	}
	p.mu.Lock()
	p.recycling++
	p.mu.Unlock()
	p.reaper.recycle(dst, p.takeBack)
	return nil
}

// takeBack wipes the volume in trash directory dir and moves it into the
// pool, if the pool wants it. It reports whether it did; if not, dir is
// the caller's to tear down.
func (p *Pool) takeBack(dir string) (kept bool) {
	defer func() {
		p.mu.Lock()
		p.recycling--
		p.mu.Unlock()
		if !kept {
			p.poke() // the refill counted on this volume
		}
	}()
	if !p.wantsOrSurges() {
		p.log.Debug("not recycling disk: the pool is full", "path", dir)
		return false
	}
	loop, err := wipe(dir)
	if err != nil {
		p.log.Debug("not recycling disk", "path", dir, "err", err)
		return false
	}
	dst := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.wantsLocked() {
		return false
	}
	// The rename is the commit, as handOut's: a pool entry is swept
	// after a crash, so is one in trash.
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		p.log.Warn("recycling disk", "path", dir, "err", err)
		return false
	}
	p.ready = append(p.ready, &entry{dir: dst, device: loop, size: p.cfg.DefaultSize})
	p.log.Debug("recycled disk", "path", dst)
	return true
}

// wantsOrSurges reports whether the pool takes a recycled volume: while
// it holds fewer than twice its size, plus its surge. The refill makes
// volumes as soon as a take leaves the pool short, before the deletes that
// follow creates (in a churn of them) give theirs back: volumes given back
// beyond the size keep the pool above it, so that the refill makes none
// while deletes keep up with creates. Where takes come in bursts larger
// than the size (8 clients against a pool of 4), the pool still runs dry
// between the bursts, the refill makes volumes, and the deletes then give
// back more than twice the size: tearing those down while the refill
// makes others cost a make and a teardown for every third sandbox of such
// a churn. So a volume given back to a full pool within recycleHold of the
// refill's last make raises the surge by one and is kept instead, up to
// recycleFactor times PoolSize; the surge ends once the refill has made
// none for recycleHold.
func (p *Pool) wantsOrSurges() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wantsLocked() {
		return true
	}
	if p.closed || p.lastMade.IsZero() || time.Since(p.lastMade) >= recycleHold || p.surge >= recycleFactor*p.cfg.PoolSize {
		return false
	}
	p.surge++
	return true
}

// wantsLocked reports whether the pool has room for a recycled volume:
// fewer than twice its size and its surge (wantsOrSurges).
func (p *Pool) wantsLocked() bool {
	if p.closed {
		return false
	}
	if p.surge > 0 && time.Since(p.lastMade) >= recycleHold {
		p.surge = 0
	}
	return len(p.ready) < recycleFactor*p.cfg.PoolSize+p.surge
}

// wipe empties the volume in dir for its next sandbox: its filesystem
// must be mounted from its own image and hold little (recycleMaxUsed,
// recycleMaxInodes), and everything in its root but lost+found is
// deleted. It returns the volume's loop device; an error leaves the
// volume to be torn down.
func wipe(dir string) (loop string, _ error) {
	root, img := filepath.Join(dir, rootName), filepath.Join(dir, imageName)
	fd, loop, err := mountedImage(root, img)
	if err != nil {
		return "", err
	}
	if fd < 0 {
		return "", errors.New("not mounted from its image")
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return "", err
	}
	// Delayed allocation counts dirty data the disk has not written yet
	// as used, so the filesystem's count covers what the image's does not.
	used := int64(sfs.Blocks-sfs.Bfree) * sfs.Bsize
	if used > recycleMaxUsed || sfs.Files-sfs.Ffree > recycleMaxInodes {
		return "", fmt.Errorf("holds %d bytes in %d inodes", used, sfs.Files-sfs.Ffree)
	}
	var ist unix.Stat_t
	if err := unix.Stat(img, &ist); err != nil {
		return "", err
	}
	if ist.Blocks*512 > recycleMaxUsed {
		return "", fmt.Errorf("image has %d bytes allocated", ist.Blocks*512)
	}
	if sfs.Flags&unix.ST_RDONLY != 0 {
		return "", fmt.Errorf("%s is read-only (errors?)", loop)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() == keepOnWipe && e.IsDir() {
			continue
		}
		// RemoveAll follows no symbolic link and stays on this
		// filesystem's tree (nothing is mounted in it on the host).
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return "", err
		}
	}
	return "/dev/" + loop, nil
}

// toTrash renames id's volume into trash (waiting for a snapshot of it
// under way) and returns its trash directory, or "" if id has none.
func (p *Pool) toTrash(ctx context.Context, id string) (string, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return "", err
	}
	if p.isClosed() {
		return "", errClosed
	}
	src := filepath.Join(p.volDir, id)
	dst := filepath.Join(p.trashDir, strconv.FormatUint(p.seq.Add(1), 10))
	// Only the rename races with Open's re-mount; once in trash the volume
	// is this call's alone. A snapshot in progress is waited for: tearing
	// down a frozen filesystem would leave it frozen for good.
	p.volMu.Lock()
	for ch := p.snapping[id]; ch != nil; ch = p.snapping[id] {
		p.volMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", fmt.Errorf("removing disk of %q: waiting for its snapshot: %w", id, ctx.Err())
		}
		p.volMu.Lock()
	}
	err := os.Rename(src, dst)
	p.volMu.Unlock()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("removing disk of %q: %w", id, err)
	}
	return dst, nil
}
