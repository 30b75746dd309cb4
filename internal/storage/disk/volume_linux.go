package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

const (
	mountFlags = unix.MS_NODEV | unix.MS_NOSUID
	// noinit_itable keeps the kernel's lazy-init thread from zeroing the
	// inode tables mkfs left uninitialised, which would fill the sparse file
	// with zeros nobody needs: an unwritten sparse block already reads as
	// zero.
	mountData = "noinit_itable"

	// EXT4_IOC_SHUTDOWN (_IOR('X', 125, __u32)) with
	// EXT4_GOING_FLAGS_NOLOGFLUSH: stop the filesystem, dropping dirty data
	// and the unflushed journal.
	ext4IocShutdown          = 0x8004587d
	ext4GoingFlagsNoLogFlush = 0x2

	// Unmount retries EBUSY for about this long (a sandbox's last process
	// may still be exiting), then detaches lazily.
	unmountPatience = 200 * time.Millisecond
)

// mkfsArgs format a pristine image (pristine_linux.go) fast and keep it
// sparse: lazy inode table and journal init write neither (they read as
// zero anyway), nodiscard skips punching the already empty file, -m 0
// reserves nothing (the sandbox is root inside, and the cap must be the
// cap), 4 KiB blocks keep small volumes from getting 1 KiB ones, and
// metadata_csum_seed lets each clone take a UUID of its own by rewriting
// the superblock alone.
//
// The rest keep the image's data in few extents, since a reflink clone
// costs 20-30 µs per extent the source maps (BenchmarkClonePristine), and
// deleting a clone works through its extents too: one backup superblock
// instead of one in group 1 and every power of 3, 5 and 7 (sparse_super2
// with num_backup_sb=1), and the bitmaps and inode tables of up to 128
// block groups packed at the start (flex_bg 128, all of a 16 GiB disk's).
// A 10 GiB pristine maps 7 extents instead of 18, and a small template's
// snapshot 17 instead of 33. Nothing here resizes a mounted volume, which
// sparse_super2 would refuse. Change pristineVersion with them.
var mkfsArgs = []string{"-q", "-F", "-b", "4096", "-m", "0", "-O", "metadata_csum_seed,sparse_super2", "-G", "128",
	"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,num_backup_sb=1"}

// findMkfs returns the mkfs.ext4 to run: configured, or from PATH, or from
// the sbin directories a daemon's PATH often lacks.
func findMkfs(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if path, err := exec.LookPath("mkfs.ext4"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: mkfs.ext4 not found (install e2fsprogs)", errdefs.ErrUnavailable)
}

// buildVolume makes the new directory dir, has fill create its image, and
// mounts it. On failure it leaves nothing behind.
func buildVolume(dir string, log *slog.Logger, fill func(img string) error) (dev string, err error) {
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", fmt.Errorf("making volume directory: %w", err)
	}
	defer func() {
		if err != nil {
			if cerr := teardown(context.Background(), dir, log); cerr != nil {
				log.Warn("cleaning up half-made disk", "dir", dir, "err", cerr)
			}
		}
	}()
	root := filepath.Join(dir, rootName)
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", fmt.Errorf("making mountpoint: %w", err)
	}
	img := filepath.Join(dir, imageName)
	if err := fill(img); err != nil {
		return "", err
	}
	return mountImage(img, root)
}

func createSparse(img string, size int64) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating disk image: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("sizing disk image: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("creating disk image: %w", err)
	}
	return nil
}

// mountImage attaches img to a loop device and mounts it at root.
func mountImage(img, root string) (string, error) {
	dev, err := mountLoop(img, root, "ext4", mountFlags, mountData, volumeLoop)
	if err == nil {
		noAllocPrefetch(dev)
	}
	return dev, err
}

// noAllocPrefetch stops the block allocator of the ext4 filesystem on dev
// from reading ahead the bitmaps of the groups it has not looked at yet
// (mb_prefetch_limit 0; it still does when the filesystem is short of
// room), which it otherwise does for every group at the first allocation
// after a mount: 0.5 ms of CPU and 0.9 ms of waiting for the first file a
// sandbox writes on a disk just made, of which a sandbox uses a group or
// two. A kernel without the knob (before 5.9) keeps reading ahead; the
// read-ahead only costs time, so failing to turn it off fails nothing.
func noAllocPrefetch(dev string) {
	f, err := os.OpenFile(allocPrefetchKnob(dev), os.O_WRONLY, 0)
	if err != nil {
		return
	}
	f.WriteString("0")
	f.Close()
}

func allocPrefetchKnob(dev string) string {
	return "/sys/fs/ext4/" + filepath.Base(dev) + "/mb_prefetch_limit"
}

// mountLoop attaches img to a loop device with opts and mounts it at root.
func mountLoop(img, root, fstype string, flags uintptr, data string, opts loopOptions) (string, error) {
	fd, dev, err := attachLoop(img, opts)
	if err != nil {
		return "", fmt.Errorf("attaching loop device: %w", err)
	}
	// After a successful mount the mount holds the device; after a failed
	// one this close is the last and autoclear frees it.
	defer unix.Close(fd)
	if err := unix.Mount(dev, root, fstype, flags, data); err != nil {
		return "", fmt.Errorf("mounting %s on %s: %w", dev, root, err)
	}
	return dev, nil
}

// remountImage mounts img at root again (after a reboot or a manual
// unmount). If img is still bound to a loop device, that device is mounted
// rather than a second one: two loop devices over one file would be two
// ext4 instances writing the same blocks.
func remountImage(img, root string) (string, error) {
	names, err := loopsBacking(func(path string) bool { return path == img })
	if err != nil {
		return "", err
	}
	if len(names) == 0 {
		return mountImage(img, root)
	}
	dev := "/dev/" + names[0]
	if err := unix.Mount(dev, root, "ext4", mountFlags, mountData); err != nil {
		return "", fmt.Errorf("mounting %s: %w", dev, err)
	}
	noAllocPrefetch(dev)
	// Whoever bound it may not have set autoclear; make sure Remove's
	// unmount frees it.
	if err := markAutoclear(dev); err != nil {
		return "", err
	}
	return dev, nil
}

// unmount unmounts everything mounted at root. EBUSY is retried for
// unmountPatience (or until ctx ends); then busy is called and the mount
// is detached lazily, and the loop device frees itself when its last user
// lets go.
func unmount(ctx context.Context, root string, busy func(), log *slog.Logger) error {
	deadline := time.Now().Add(unmountPatience)
	delay := 5 * time.Millisecond
	for stacked := 0; stacked < 8; {
		err := unix.Unmount(root, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			stacked++ // something may be mounted beneath
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mountpoint
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) && ctx.Err() == nil:
			select {
			case <-time.After(delay):
			case <-ctx.Done():
			}
			delay *= 2
		case errors.Is(err, unix.EBUSY):
			log.Warn("disk busy, detaching lazily", "path", root)
			busy()
			if err := unix.Unmount(root, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
				return fmt.Errorf("detaching %s: %w", root, err)
			}
			stacked++
		default:
			return fmt.Errorf("unmounting %s: %w", root, err)
		}
	}
	return fmt.Errorf("unmounting %s: still mounted after 8 unmounts", root)
}

// mountedImage opens root if, and only if, the filesystem mounted there is
// the one in img, and names its loop device (loopN); fd is -1 otherwise.
// The check is on the open fd, so it cannot race.
func mountedImage(root, img string) (fd int, loop string, err error) {
	fd, err = unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, "", nil
		}
		return -1, "", fmt.Errorf("opening %s: %w", root, err)
	}
	var st, parent unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("inspecting %s: %w", root, err)
	}
	if err := unix.Stat(filepath.Dir(root), &parent); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("inspecting %s: %w", filepath.Dir(root), err)
	}
	if st.Dev == parent.Dev {
		unix.Close(fd)
		return -1, "", nil // not mounted
	}
	if loop, backing, err := loopOf(st.Dev); err == nil && backing == img {
		return fd, loop, nil
	}
	unix.Close(fd)
	return -1, "", nil // not ours
}

// shutdown stops the filesystem mounted at root if, and only if, it is the
// one in img: its dirty data and unflushed journal are dropped, and a
// process still holding files in it gets EIO instead of filling the host's
// disk through a lazily detached mount. Aimed at the wrong directory this
// ioctl would stop the host's own filesystem: mountedImage guards it.
func shutdown(root, img string) error {
	fd, _, err := mountedImage(root, img)
	if fd < 0 {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetPointerInt(fd, ext4IocShutdown, ext4GoingFlagsNoLogFlush); err != nil {
		return fmt.Errorf("shutting down %s: %w", root, err)
	}
	return nil
}

// dropDirtyBlocks is how much data a volume being deleted may hold that
// is written but not yet on its disk (ext4's delayed allocation, in 4 KiB
// blocks) before it is shut down rather than just unmounted. An unmount
// writes that data back into an image about to be deleted (1.3 s for 400
// MB here, 18 ms with shutdown); a shutdown costs 1.8 ms of CPU whatever
// the volume holds, most of it printing two kernel messages to the
// console, where a plain unmount of an idle volume costs 0.5
// (BenchmarkDiskLife).
const dropDirtyBlocks = 256

// delayedBlocks is how many blocks of dirty data the ext4 filesystem on
// the loop device loop holds unallocated; 0 if it cannot tell.
func delayedBlocks(loop string) int64 {
	b, err := os.ReadFile("/sys/fs/ext4/" + loop + "/delayed_allocation_blocks")
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// teardown removes the volume directory dir: unmounts its filesystem
// (shut down first if it holds much dirty data, or if it stays busy),
// makes sure no loop device holds its image, deletes the image and the
// directories. It never recurses, so a mount it failed to remove is never
// emptied. Everything in dir is being destroyed; never call it on a volume
// that is still handed out.
func teardown(ctx context.Context, dir string, log *slog.Logger) error {
	root := filepath.Join(dir, rootName)
	img := filepath.Join(dir, imageName)
	var ist unix.Stat_t
	haveImg := unix.Stat(img, &ist) == nil
	fd, loop, err := mountedImage(root, img)
	if err != nil {
		log.Warn("inspecting disk before removal", "path", root, "err", err)
	}
	if fd >= 0 {
		if delayedBlocks(loop) > dropDirtyBlocks {
			if err := unix.IoctlSetPointerInt(fd, ext4IocShutdown, ext4GoingFlagsNoLogFlush); err != nil {
				log.Warn("stopping disk before removal", "path", root, "err", err)
			}
		}
		unix.Close(fd) // an open fd would keep the mount busy
	}
	busy := func() {
		if err := shutdown(root, img); err != nil {
			log.Warn("stopping busy disk", "path", root, "err", err)
		}
	}
	if err := unmount(ctx, root, busy, log); err != nil {
		return err
	}
	// The loop device the volume was mounted from frees itself as the
	// unmount completes (autoclear). Only an image found unmounted (a
	// sweep after a crash) can be bound to a device nobody knows: look
	// through them all.
	switch {
	case !haveImg:
	case loop != "":
		err = detachLoop(loop, ist.Ino)
	default:
		err = detachLoops(img)
	}
	if err != nil {
		return err
	}
	// img.tmp is what a crash in the middle of AcquireFrom's clone leaves.
	for _, path := range []string{img + tmpSuffix, img, root, dir} {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("deleting disk: %w", err)
		}
	}
	return nil
}
