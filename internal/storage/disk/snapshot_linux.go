package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// FIFREEZE and FITHAW: _IOWR('X', 119, int) and _IOWR('X', 120, int).
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// Snapshot writes a consistent image of the disk handed out to id, while
// its sandbox runs, to the new file dst (an ErrConflict if dst exists). It
// flushes the disk with syncfs while the sandbox still runs, calls pause
// (which should stop the sandbox, e.g. freeze its cgroup, and return how
// to resume it, or fail leaving it running; nil means no pause), freezes
// the filesystem, clones the image, and thaws and resumes. Thaw and
// resume run on every path. dst should be on the same filesystem as the
// pool (the substrate) for the clone to be a reflink; the fsync that makes
// dst durable runs after the thaw.
//
// On failure no dst is left and the disk is mounted and writable as
// before; a copy that does not fit fails with an error wrapping
// unix.ENOSPC. Two snapshots of one disk at once are an ErrConflict;
// Remove of a disk being captured waits for the capture.
func (p *Pool) Snapshot(ctx context.Context, id, dst string, pause func() (resume func(), err error)) (Capture, error) {
	start := time.Now()
	var c Capture
	if err := reqcheck.SandboxID("id", id); err != nil {
		return c, err
	}
	if p.isClosed() {
		return c, errClosed
	}
	if err := ctx.Err(); err != nil {
		return c, err
	}
	pin, err := p.pin(id)
	if err != nil {
		return c, err
	}
	defer pin.release()
	// What the sandbox wrote reaches the image first, to be counted.
	if err := unix.Syncfs(pin.root); err != nil {
		return c, fmt.Errorf("snapshotting disk of %q: flushing: %w", id, err)
	}
	if err := p.admitShare(pin.img); err != nil {
		return c, fmt.Errorf("snapshotting disk of %q: %w", id, err)
	}
	err = p.capture(ctx, pin, dst, pause, &c)
	forgetPromised() // the disk's blocks are shared now
	if err != nil {
		return c, fmt.Errorf("snapshotting disk of %q: %w", id, err)
	}
	c.Total = time.Since(start)
	return c, nil
}

// pinned is a handed-out volume held open for a snapshot.
type pinned struct {
	id   string
	root int      // fd on its mountpoint: syncfs, FIFREEZE, FITHAW
	img  *os.File // its image
	done chan struct{}
	p    *Pool
}

// pin opens id's mounted volume and marks it as being captured. It holds
// volMu while it looks, so the volume is not renamed into trash or
// mounted in between.
func (p *Pool) pin(id string) (*pinned, error) {
	p.volMu.Lock()
	defer p.volMu.Unlock()
	if p.snapping[id] != nil {
		return nil, errdefs.Conflict("disk of %q is already being snapshotted", id)
	}
	v, err := p.mounted(id)
	if errors.Is(err, errNotMounted) {
		return nil, errdefs.Conflict("disk of %q is not mounted", id)
	}
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(v.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", v.Path, err)
	}
	img, err := os.Open(filepath.Join(filepath.Dir(v.Path), imageName))
	if err != nil {
		unix.Close(root)
		return nil, fmt.Errorf("opening disk image of %q: %w", id, err)
	}
	pin := &pinned{id: id, root: root, img: img, done: make(chan struct{}), p: p}
	p.snapping[id] = pin.done
	return pin, nil
}

func (pin *pinned) release() {
	unix.Close(pin.root)
	pin.img.Close()
	pin.p.volMu.Lock()
	for id, ch := range pin.p.snapping { // under another id if renamed
		if ch == pin.done {
			delete(pin.p.snapping, id)
		}
	}
	pin.p.volMu.Unlock()
	close(pin.done)
}

// capture is Snapshot's work on a pinned volume; it fills in c.
func (p *Pool) capture(ctx context.Context, pin *pinned, dst string, pause func() (func(), error), c *Capture) error {
	t, err := createTarget(dst)
	if err != nil {
		return err
	}
	settled := false // committed, or aborted already
	defer func() {
		if !settled {
			t.abort()
		}
	}()
	// The bulk of the dirty data is written now, while the sandbox runs,
	// so FIFREEZE below has little left to flush.
	if err := unix.Syncfs(pin.root); err != nil {
		return fmt.Errorf("flushing: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	var resume func()
	var paused time.Time
	unpause := func() {
		if resume != nil {
			r := resume
			resume = nil
			r()
			c.Frozen = time.Since(paused)
		}
	}
	if pause != nil {
		paused = time.Now()
		r, err := pause()
		if err != nil {
			return fmt.Errorf("pausing sandbox: %w", err)
		}
		if resume = r; resume == nil {
			resume = func() {}
		}
		defer unpause()
	}

	// Writers block from the start of FIFREEZE, which flushes what was
	// written since the syncfs.
	frozen := time.Now()
	if err := unix.IoctlSetInt(pin.root, fiFreeze, 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return errdefs.Conflict("freezing: already frozen by someone else")
		}
		return fmt.Errorf("freezing: %w", err)
	}
	thawed := false
	thaw := func() error {
		if thawed {
			return nil
		}
		thawed = true
		err := unix.IoctlSetInt(pin.root, fiThaw, 0)
		c.FSFrozen = time.Since(frozen)
		if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: thawed already
			p.log.Error("thawing disk after snapshot", "sandbox", pin.id, "err", err)
			return fmt.Errorf("thawing: %w", err)
		}
		return nil
	}
	defer thaw()

	reflinked, ferr := t.fill(ctx, pin.img, p.copyOpts)
	if ferr != nil {
		// Before the thaw: a copy that filled the disk must be gone
		// before the sandbox writes again.
		t.abort()
		settled = true
		ferr = fmt.Errorf("cloning %s to %s: %w", pin.img.Name(), dst, ferr)
	}
	terr := thaw()
	unpause()
	if pause == nil {
		c.Frozen = c.FSFrozen
	}
	if ferr != nil || terr != nil {
		return errors.Join(ferr, terr)
	}
	// The copy's journal is empty (FIFREEZE) and its free blocks hold
	// nothing anyone reads: both go (trim_linux.go).
	if err := trimCopy(t.f); err != nil {
		p.log.Warn("trimming a snapshot", "sandbox", pin.id, "err", err)
	}
	settled = true // commit cleans up after itself
	if err := t.commit(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(pin.img.Fd()), &st); err == nil {
		c.Bytes = st.Blocks * 512
	}
	c.Reflink = reflinked
	return nil
}

// AcquireFrom hands out a new mounted volume for sandbox id whose image is
// a clone of the image file src (a Snapshot): a fork of the sandbox that
// took it. The volume is as large as the image. On a reflink substrate it
// is made in milliseconds and shares src's blocks until either is written;
// an image of the default size used before and holding little (a
// template's, most often) is mirrored into a ready volume instead
// (seed_linux.go).
// Like Acquire, an id that has a disk is an ErrConflict, and the volume
// is built in a pool directory and renamed into place, so a crash leaves
// nothing but what the next NewPool sweeps.
func (p *Pool) AcquireFrom(ctx context.Context, id, src string, uid, gid int) (*Volume, error) {
	return p.acquireFrom(ctx, id, src, uid, gid, true)
}

// CloneFrom is AcquireFrom for a volume made ahead of time, which nobody
// waits for: it neither takes src's ready clone (clones_linux.go) nor
// counts as a use of src, so the ready clones stay for the starts that
// wait; like AcquireAhead's, its blocks are allocated when Rename gives it
// to its sandbox.
func (p *Pool) CloneFrom(ctx context.Context, id, src string, uid, gid int) (*Volume, error) {
	return p.acquireFrom(ctx, id, src, uid, gid, false)
}

func (p *Pool) acquireFrom(ctx context.Context, id, src string, uid, gid int, ready bool) (*Volume, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	if err := validateOwner(uid, gid); err != nil {
		return nil, err
	}
	if p.isClosed() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dst := filepath.Join(p.volDir, id)
	if _, err := os.Lstat(dst); err == nil {
		return nil, errdefs.Conflict("sandbox %q already has a disk", id)
	}
	fi, err := os.Stat(src)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("disk snapshot", src)
		}
		return nil, fmt.Errorf("opening disk snapshot: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errdefs.Invalid("disk snapshot", "%s is not a regular file", src)
	}
	if fi.Size() < MinSize || fi.Size() > MaxSize {
		return nil, errdefs.Invalid("disk snapshot", "%s has size %d, outside %d MiB to %d TiB", src, fi.Size(), MinSize>>20, MaxSize>>40)
	}

	id0 := sourceOf(fi)
	e, seeded := p.fromSeed(ctx, src, id0)
	if e == nil && ready && !seeded {
		e = p.takeClone(src, id0)
	}
	if e == nil {
		if e, err = p.cloneInto(ctx, src); err != nil {
			return nil, fmt.Errorf("making disk from snapshot: %w", err)
		}
	}
	if err := p.handOut(e, dst, uid, gid, ready); err != nil {
		p.destroy(e)
		return nil, err
	}
	if ready && !seeded {
		p.used(src, id0)
	}
	return &Volume{ID: id, Path: filepath.Join(dst, rootName), Size: e.size, Device: e.device}, nil
}

// ImagePath returns the backing file of the disk handed out to id: what
// Snapshot clones. Write to it only through the mounted volume.
func (p *Pool) ImagePath(id string) (string, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return "", err
	}
	img := filepath.Join(p.volDir, id, imageName)
	if _, err := os.Lstat(img); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errdefs.NotFound("disk", id)
		}
		return "", fmt.Errorf("finding disk image of %q: %w", id, err)
	}
	return img, nil
}

// thawStale thaws disks that a process which crashed mid-snapshot left
// frozen: a freeze outlives the process that made it, and would block its
// sandbox's writes for good. Only one process owns Dir, so no snapshot can
// be running now.
func (p *Pool) thawStale() {
	ids, err := p.List()
	if err != nil {
		p.log.Warn("looking for frozen disks", "err", err)
		return
	}
	for _, id := range ids {
		v, err := p.mounted(id)
		if err != nil {
			continue
		}
		fd, err := unix.Open(v.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := unix.IoctlSetInt(fd, fiThaw, 0); err == nil {
			p.log.Warn("thawed a disk left frozen by an earlier process", "sandbox", id)
		}
		unix.Close(fd)
	}
}
