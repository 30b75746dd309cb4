package disk

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/mountinfo"
)

// Substrate modes, as Substrate.Mode reports them.
const (
	// SubstrateHost: dir's own filesystem can reflink (XFS, btrfs).
	SubstrateHost = "host"
	// SubstrateXFSImage: an XFS filesystem in the sparse file dir.xfs,
	// attached to a direct I/O loop device, is mounted on dir.
	SubstrateXFSImage = "xfs-image"
	// SubstrateCopy: no reflink; a snapshot copies the image's data while
	// the sandbox is frozen, 0.5 to 1.5 s per GiB of data here.
	SubstrateCopy = "copy"
)

const (
	substrateSuffix = ".xfs"
	// minSubstrateSize is the smallest XFS mkfs.xfs makes.
	minSubstrateSize = 300 << 20
	// defaultMinSubstrate is the least a Size 0 substrate gets.
	defaultMinSubstrate = 1 << 30
	// maxSubstrateSize is the largest file ext4 with 4 KiB blocks holds,
	// rounded down to whole MiB.
	maxSubstrateSize = 16<<40 - sizeAlign

	// discard makes XFS punch the blocks it frees out of its image, so a
	// removed volume gives its space back to the host.
	substrateData = "discard"

	reflinkProbe = ".reflink-probe-*"
)

// mkfsXFSArgs: reflink is what the substrate is for; 4 KiB sectors let
// the loop devices above and below it do direct I/O with 4 KiB blocks
// (volumeLoop); -K skips discarding the file, which is a hole already.
var mkfsXFSArgs = []string{"-q", "-K", "-m", "reflink=1", "-s", "size=4096"}

// Substrate is the filesystem a disk directory lives on, prepared so that
// images in it can be cloned in milliseconds. Get one from
// PrepareSubstrate.
type Substrate struct {
	dir     string
	image   string
	mode    string
	reflink bool
	device  string
}

// Dir is the directory the substrate was prepared on, canonical.
func (s *Substrate) Dir() string { return s.dir }

// Mode is SubstrateHost, SubstrateXFSImage or SubstrateCopy.
func (s *Substrate) Mode() string { return s.mode }

// Reflink reports whether clones of images in Dir share extents. It is
// false in SubstrateCopy mode and when SubstrateOptions.ForceCopy is set.
func (s *Substrate) Reflink() bool { return s.reflink }

// Device is the loop device of an xfs-image substrate, or "".
func (s *Substrate) Device() string { return s.device }

// PrepareSubstrate makes dir a filesystem whose files can be cloned by
// reflink, so snapshots of running sandboxes freeze them for milliseconds.
// In order:
//
//   - if an XFS image dir.xfs exists, it is mounted on dir (if it is not
//     already): SubstrateXFSImage;
//   - if dir's own filesystem can reflink, it is used as it is:
//     SubstrateHost;
//   - if dir is missing or empty and mkfs.xfs is found, the sparse image
//     dir.xfs is made (as dir.xfs.tmp, then renamed) and mounted:
//     SubstrateXFSImage;
//   - otherwise nothing changes and snapshots will copy: SubstrateCopy,
//     with a warning.
//
// It is idempotent and safe to call again after a crash or a reboot. The
// substrate stays mounted when the process exits, as the sandboxes' disks
// on it do; Unmount takes it down. Call it before NewPool on the same
// directory (or a parent of it): a pool made first would fill dir, and a
// non-empty dir gets no image.
func PrepareSubstrate(dir string, opts SubstrateOptions, log *slog.Logger) (*Substrate, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Size != 0 {
		if opts.Size < minSubstrateSize || opts.Size > maxSubstrateSize {
			return nil, errdefs.Invalid("substrate size", "%d is outside %d MiB to %d TiB", opts.Size, minSubstrateSize>>20, maxSubstrateSize>>40)
		}
		opts.Size = (opts.Size + sizeAlign - 1) / sizeAlign * sizeAlign
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o711); err != nil {
		return nil, fmt.Errorf("making substrate dir: %w", err)
	}
	// Loop devices report canonical backing paths; compare against those.
	if dir, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, fmt.Errorf("resolving substrate dir: %w", err)
	}
	s := &Substrate{dir: dir, image: dir + substrateSuffix}
	log = log.With("dir", dir)
	use := func(mode, dev string, reflink bool) (*Substrate, error) {
		s.mode, s.device, s.reflink = mode, dev, reflink && !opts.ForceCopy
		return s, nil
	}

	state, dev, err := mountState(dir, s.image)
	if err != nil {
		return nil, err
	}
	if state == mountedOurs {
		return use(SubstrateXFSImage, dev, true)
	}
	if _, err := os.Lstat(s.image); err == nil {
		if state == mountedOther {
			return nil, errdefs.Conflict("%s has a substrate image %s but something else is mounted on it", dir, s.image)
		}
		if empty, err := isEmptyDir(dir); err != nil {
			return nil, err
		} else if !empty {
			// Mounting would hide those files; they were written while
			// the substrate was down, probably by a pool made too early.
			return nil, errdefs.Conflict("%s is not empty but its substrate image %s is not mounted: move its contents away", dir, s.image)
		}
		dev, err := mountSubstrate(s.image, dir)
		if err != nil {
			return nil, fmt.Errorf("mounting disk substrate %s: %w", s.image, err)
		}
		log.Info("mounted disk substrate", "image", s.image, "device", dev)
		return use(SubstrateXFSImage, dev, true)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("inspecting %s: %w", s.image, err)
	}

	ok, err := probeReflink(dir)
	if err != nil {
		return nil, err
	}
	if ok {
		log.Info("disk dir can reflink")
		return use(SubstrateHost, "", true)
	}

	var reason error
	mkfs, err := findMkfsXFS(opts.Mkfs)
	empty, eerr := isEmptyDir(dir)
	switch {
	case eerr != nil:
		return nil, eerr
	case state == mountedOther:
		reason = fmt.Errorf("another filesystem is mounted on %s", dir)
	case !empty:
		reason = fmt.Errorf("%s is not empty (a substrate is only made on an empty dir)", dir)
	case err != nil:
		reason = err
	default:
		size := opts.Size
		if size == 0 {
			if size, err = defaultSubstrateSize(filepath.Dir(dir)); err != nil {
				return nil, err
			}
		}
		dev, err := makeSubstrate(mkfs, s.image, dir, size)
		if err == nil {
			log.Info("made disk substrate", "image", s.image, "size", size, "device", dev)
			return use(SubstrateXFSImage, dev, true)
		}
		reason = err
	}
	log.Warn("disk dir cannot reflink: snapshots will copy whole disk images while sandboxes are frozen",
		"reason", reason)
	return use(SubstrateCopy, "", false)
}

// Unmount takes down the substrate mounted on dir by PrepareSubstrate, for
// tests and uninstalls. Everything inside must be let go first (the
// volumes unmounted, their loop devices freed); otherwise it fails with
// ErrConflict naming what still holds it. A dir with no substrate image
// mounted on it is left alone.
func Unmount(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", dir, err)
	}
	if dir, err = filepath.EvalSymlinks(abs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("resolving %s: %w", abs, err)
	}
	image := dir + substrateSuffix
	state, _, err := mountState(dir, image)
	if err != nil || state != mountedOurs {
		return err
	}
	mounts, err := mountpointsUnder(dir)
	if err != nil {
		return err
	}
	var loops []string
	// A volume's loop device frees itself as its unmount completes, which
	// can trail the unmount: by more than a second on a loaded host.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		loops, err = loopsBacking(func(path string) bool { return strings.HasPrefix(path, dir+"/") })
		if err != nil {
			return err
		}
		if len(loops) == 0 || len(mounts) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(mounts) > 0 || len(loops) > 0 {
		return errdefs.Conflict("substrate %s is still in use: mounts %v, loop devices %v; unmount those first", dir, mounts, loops)
	}
	// A process that was killed holds its files until its exit is done,
	// which trails the kill on a loaded host as the loop devices do.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmounting substrate %s: %w", dir, err)
		}
		if time.Now().After(deadline) {
			return errdefs.Conflict("substrate %s is busy: a process has files open in it", dir)
		}
	}
	return detachLoops(image)
}

type mountKind int

const (
	notMounted   mountKind = iota
	mountedOurs            // from a loop device backed by the image
	mountedOther           // something else
)

// mountState tells what is mounted on dir and, if it is image, on which
// loop device.
func mountState(dir, image string) (mountKind, string, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, "", fmt.Errorf("inspecting %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return 0, "", fmt.Errorf("inspecting %s: %w", filepath.Dir(dir), err)
	}
	if st.Dev == parent.Dev {
		return notMounted, "", nil
	}
	name, backing, err := loopOf(st.Dev)
	if err != nil || backing != image {
		return mountedOther, "", nil
	}
	return mountedOurs, "/dev/" + name, nil
}

// mountSubstrate mounts the XFS image on dir. As for volumes, a loop device
// still bound to the image is reused rather than a second one bound.
func mountSubstrate(image, dir string) (string, error) {
	sector, err := xfsSectorSize(image)
	if err != nil {
		return "", err
	}
	names, err := loopsBacking(func(path string) bool { return path == image })
	if err != nil {
		return "", err
	}
	if len(names) == 0 {
		return mountLoop(image, dir, "xfs", mountFlags, substrateData, loopOptions{blockSize: sector, directIO: true})
	}
	dev := "/dev/" + names[0]
	if err := unix.Mount(dev, dir, "xfs", mountFlags, substrateData); err != nil {
		return "", fmt.Errorf("mounting %s on %s: %w", dev, dir, err)
	}
	if err := markAutoclear(dev); err != nil {
		return "", err
	}
	return dev, nil
}

// xfsSectorSize reads the sector size from an XFS image's superblock: the
// loop device's logical block size must not exceed it, and direct I/O
// needs it at least as large as the host's alignment.
func xfsSectorSize(image string) (uint32, error) {
	f, err := os.Open(image)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", image, err)
	}
	defer f.Close()
	sb := make([]byte, 104)
	if _, err := io.ReadFull(f, sb); err != nil {
		return 0, fmt.Errorf("reading superblock of %s: %w", image, err)
	}
	// struct xfs_dsb: sb_magicnum at 0, sb_sectsize (big-endian) at 102.
	if string(sb[:4]) != "XFSB" {
		return 0, fmt.Errorf("%s is not an XFS image", image)
	}
	sector := uint32(binary.BigEndian.Uint16(sb[102:]))
	if sector < 512 || sector&(sector-1) != 0 {
		return 0, fmt.Errorf("%s: bad XFS sector size %d", image, sector)
	}
	return sector, nil
}

// makeSubstrate makes the XFS image and mounts it on dir. The image
// appears by rename only once formatted, so a crash leaves at most a .tmp
// (removed by the next try), never an image that cannot mount. On failure
// it leaves neither.
func makeSubstrate(mkfs, image, dir string, size int64) (dev string, err error) {
	var dirSt unix.Stat_t
	if err := unix.Stat(dir, &dirSt); err != nil {
		return "", fmt.Errorf("inspecting %s: %w", dir, err)
	}
	tmp := image + tmpSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("removing stale %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	if err := createSparse(tmp, size); err != nil {
		return "", err
	}
	if out, err := exec.Command(mkfs, append(mkfsXFSArgs, tmp)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("formatting %s: %w: %s", tmp, err, bytes.TrimSpace(out))
	}
	if err := syncFile(tmp); err != nil {
		return "", err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, image, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("renaming %s: %w", tmp, err)
	}
	if err := durable.SyncDir(filepath.Dir(image)); err != nil {
		os.Remove(image)
		return "", err
	}
	if dev, err = mountSubstrate(image, dir); err != nil {
		os.Remove(image) // ours, just made, empty
		return "", err
	}
	// The new filesystem's root takes the place of dir: keep its mode.
	if err := os.Chmod(dir, os.FileMode(dirSt.Mode&0o7777)); err != nil {
		unix.Unmount(dir, 0)
		os.Remove(image)
		return "", fmt.Errorf("chmoding %s: %w", dir, err)
	}
	return dev, nil
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// defaultSubstrateSize is the size of the filesystem holding parent: the
// image is sparse, so it costs what is written, and can grow as far as the
// host's disk.
func defaultSubstrateSize(parent string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(parent, &st); err != nil {
		return 0, fmt.Errorf("sizing substrate: %w", err)
	}
	size := int64(st.Blocks) * st.Bsize / sizeAlign * sizeAlign
	return min(max(size, defaultMinSubstrate), maxSubstrateSize), nil
}

// probeReflink reports whether files in dir can share extents, by cloning
// a small file there. It leaves nothing behind.
func probeReflink(dir string) (bool, error) {
	a, err := os.CreateTemp(dir, reflinkProbe)
	if err != nil {
		return false, fmt.Errorf("probing reflink in %s: %w", dir, err)
	}
	defer os.Remove(a.Name())
	defer a.Close()
	if _, err := a.Write(make([]byte, 4096)); err != nil {
		return false, fmt.Errorf("probing reflink in %s: %w", dir, err)
	}
	b, err := os.CreateTemp(dir, reflinkProbe)
	if err != nil {
		return false, fmt.Errorf("probing reflink in %s: %w", dir, err)
	}
	defer os.Remove(b.Name())
	defer b.Close()
	err = unix.IoctlFileClone(int(b.Fd()), int(a.Fd()))
	switch {
	case err == nil:
		return true, nil
	case cannotReflink(err):
		return false, nil
	}
	return false, fmt.Errorf("probing reflink in %s: %w", dir, err)
}

func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", dir, err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil {
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		return false, fmt.Errorf("listing %s: %w", dir, err)
	}
	return false, nil
}

// findMkfsXFS returns the mkfs.xfs to run: configured, or from PATH, or
// from the sbin directories a daemon's PATH often lacks.
func findMkfsXFS(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if path, err := exec.LookPath("mkfs.xfs"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("%w: mkfs.xfs not found (install xfsprogs)", errdefs.ErrUnavailable)
}

// mountpointsUnder lists the mountpoints strictly below dir, as this
// process's mount namespace sees them.
func mountpointsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if mp := mountinfo.Unescape(fields[4]); strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	return mounts, nil
}
