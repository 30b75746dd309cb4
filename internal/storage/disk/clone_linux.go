package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

const (
	tmpSuffix = ".tmp"

	// copyReserve is the free space a copy must leave on its filesystem.
	// Images are sparse, so every running volume on the same filesystem
	// needs room to grow; a copy that took the last of it would turn their
	// next writes into I/O errors, which is worse than a failed snapshot.
	copyReserve = 64 << 20

	cfrChunk = 64 << 20 // per copy_file_range call; ctx is checked between
	rwChunk  = 1 << 20  // buffer when copying through user space
)

// Clone makes the new file dst a copy of src. Where the filesystem can
// share extents (XFS with reflink, btrfs) it is a FICLONE, which takes
// milliseconds whatever the size and costs no space until either file is
// written; elsewhere it copies, keeping holes. dst is written as dst.tmp,
// synced and renamed, so it appears whole or not at all; a dst that exists
// is an ErrConflict. On failure nothing is left at dst or dst.tmp and the
// error wraps the cause (errors.Is(err, unix.ENOSPC) for a full disk).
func Clone(src, dst string) error {
	_, err := cloneFile(context.Background(), src, dst, cloneOptions{})
	return err
}

// cloneOptions tune cloneFile. The zero value is what Clone does.
type cloneOptions struct {
	// copyOnly skips FICLONE and copies: for a substrate forced to copy.
	copyOnly bool
	// noSpaceCheck skips the free-space check before a copy, so a test can
	// reach the ENOSPC of a copy that runs out halfway.
	noSpaceCheck bool
}

// cloneFile is Clone with options; it reports whether it shared extents.
func cloneFile(ctx context.Context, src, dst string, opts cloneOptions) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("cloning %s: %w", src, err)
	}
	defer in.Close()
	t, err := createTarget(dst)
	if err != nil {
		return false, fmt.Errorf("cloning %s: %w", src, err)
	}
	if reflinked, err = t.fill(ctx, in, opts); err != nil {
		t.abort()
		return false, fmt.Errorf("cloning %s to %s: %w", src, dst, err)
	}
	if err := t.commit(); err != nil {
		return false, fmt.Errorf("cloning %s to %s: %w", src, dst, err)
	}
	return reflinked, nil
}

// cloneTarget is a clone being written: created before a snapshot freezes
// anything (so a bad dst fails early), filled while frozen, committed after
// the thaw (so its fsync is not in the frozen window).
type cloneTarget struct {
	f        *os.File
	tmp, dst string
}

func createTarget(dst string) (*cloneTarget, error) {
	if _, err := os.Lstat(dst); err == nil {
		return nil, errdefs.Conflict("%s already exists", dst)
	}
	tmp := dst + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Left by a crash or a failed clone. A concurrent clone to the
		// same dst would lose the race at the rename anyway.
		if err := os.Remove(tmp); err != nil {
			return nil, fmt.Errorf("removing stale %s: %w", tmp, err)
		}
		f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", tmp, err)
	}
	return &cloneTarget{f: f, tmp: tmp, dst: dst}, nil
}

// fill makes the target's contents those of src: FICLONE if it can,
// otherwise a sparse copy.
func (t *cloneTarget) fill(ctx context.Context, src *os.File, opts cloneOptions) (reflinked bool, err error) {
	if !opts.copyOnly {
		err := unix.IoctlFileClone(int(t.f.Fd()), int(src.Fd()))
		if err == nil {
			return true, nil
		}
		if !cannotReflink(err) {
			return false, fmt.Errorf("reflinking: %w", err)
		}
	}
	return false, copySparse(ctx, t.f, src, opts)
}

// commit makes the filled target durable and renames it into place.
func (t *cloneTarget) commit() error {
	if err := t.f.Sync(); err != nil {
		t.abort()
		return fmt.Errorf("syncing %s: %w", t.tmp, err)
	}
	if err := t.f.Close(); err != nil {
		os.Remove(t.tmp)
		return fmt.Errorf("closing %s: %w", t.tmp, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, t.tmp, unix.AT_FDCWD, t.dst, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(t.tmp)
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Conflict("%s already exists", t.dst)
		}
		return fmt.Errorf("renaming %s: %w", t.tmp, err)
	}
	if err := durable.SyncDir(filepath.Dir(t.dst)); err != nil {
		// Whole but maybe not durable: a failed clone leaves nothing.
		os.Remove(t.dst)
		return err
	}
	return nil
}

// abort removes a target that will not be committed.
func (t *cloneTarget) abort() {
	t.f.Close()
	os.Remove(t.tmp)
}

// cannotReflink reports whether FICLONE failed because the files cannot
// share extents (filesystem without reflink, two filesystems, unaligned
// size), rather than for a reason a copy would also hit.
func cannotReflink(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)
}

// copySparse copies src's data into dst, which must be empty, leaving
// src's holes as holes: a 10 GiB image holding 1 GiB copies 1 GiB.
func copySparse(ctx context.Context, dst, src *os.File, opts cloneOptions) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return fmt.Errorf("inspecting source: %w", err)
	}
	if !opts.noSpaceCheck {
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(int(dst.Fd()), &sfs); err != nil {
			return fmt.Errorf("inspecting destination filesystem: %w", err)
		}
		need, free := st.Blocks*512, int64(sfs.Bavail)*sfs.Bsize
		if free < need+copyReserve {
			return fmt.Errorf("copying %d MiB with %d MiB kept free for running disks, %d MiB available: %w",
				need>>20, copyReserve>>20, free>>20, unix.ENOSPC)
		}
	}
	if err := dst.Truncate(st.Size); err != nil {
		return fmt.Errorf("sizing copy: %w", err)
	}
	c := copier{ctx: ctx, dst: int(dst.Fd()), src: int(src.Fd()), cfr: !opts.copyOnly}
	return c.extents(st.Size)
}

// extents copies the data of the source's first size bytes into the
// destination, which is at least that long, leaving holes as holes; a
// filesystem without SEEK_DATA is copied whole. With before set, each
// data extent's length is told to it first, which may refuse it.
func (c *copier) extents(size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(c.src, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		hole := size
		switch {
		case errors.Is(err, unix.EINVAL) && off == 0:
			data = 0 // no SEEK_DATA here: copy it all
		case err != nil:
			return fmt.Errorf("finding data in source: %w", err)
		default:
			if hole, err = unix.Seek(c.src, data, unix.SEEK_HOLE); err != nil {
				return fmt.Errorf("finding holes in source: %w", err)
			}
		}
		n := min(hole, size) - data
		if c.before != nil {
			if err := c.before(n); err != nil {
				return err
			}
		}
		if err := c.copy(data, n); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copier copies ranges between two fds: with copy_file_range (in the
// kernel, no user-space copy) unless that is off or refused, otherwise
// with pread and pwrite. copy_file_range is off when copying was forced:
// on a filesystem with reflink it would share extents instead.
type copier struct {
	ctx      context.Context
	dst, src int
	cfr      bool
	buf      []byte // made of rwChunk bytes when nil
	before   func(n int64) error
}

func (c *copier) copy(off, n int64) error {
	for n > 0 {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if c.cfr {
			roff, woff := off, off
			w, err := unix.CopyFileRange(c.src, &roff, c.dst, &woff, int(min(n, cfrChunk)), 0)
			switch {
			case err == nil && w > 0:
				off, n = off+int64(w), n-int64(w)
			case err == nil:
				return fmt.Errorf("copying at %d: source shrank: %w", off, io.ErrUnexpectedEOF)
			case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP),
				errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
				c.cfr = false
			default:
				return fmt.Errorf("copying at %d: %w", off, err)
			}
			continue
		}
		if c.buf == nil {
			c.buf = make([]byte, rwChunk)
		}
		r, err := unix.Pread(c.src, c.buf[:min(n, int64(len(c.buf)))], off)
		if err != nil {
			return fmt.Errorf("reading at %d: %w", off, err)
		}
		if r == 0 {
			return fmt.Errorf("reading at %d: source shrank: %w", off, io.ErrUnexpectedEOF)
		}
		for done := 0; done < r; {
			w, err := unix.Pwrite(c.dst, c.buf[done:r], off+int64(done))
			if err != nil {
				return fmt.Errorf("writing at %d: %w", off+int64(done), err)
			}
			done += w
		}
		off, n = off+int64(r), n-int64(r)
	}
	return nil
}
