package disk

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Space. A volume's image is a file on the storage filesystem (the host's,
// or the substrate's XFS image, itself a file on the host's). Made sparse,
// an image promises its sandbox space that nobody has set aside: when the
// filesystem below fills, the loop device's writes fail, the volume's
// ext4 logs "potential data loss", and the writer, whose write(2) and
// sync(1) had already succeeded, loses its data (issue 20.5). So with an
// overcommit of 1 (Config.Overcommit, the default) every image is
// allocated when it is handed out (fallocate, by the backer; on an XFS
// image substrate the blocks XFS gave it are allocated in the image on the
// host too: backing_linux.go): a sandbox that fills its disk gets ENOSPC
// from its own ext4, at its cap, and a disk that cannot be backed is
// refused when it is handed out, with ErrUnavailable naming the space.
// Ready disks in the pool hold no blocks and are promised to nobody; the
// pool keeps only as many as the space could admit (Pool.room). Above 1 images stay sparse and are
// admitted while the caps not yet written (Space.Promised) stay within the
// free space times the overcommit: thin, and reported by Space (the
// daemon's metrics and stats), with Space.Short set once the filesystem
// below cannot hold what was promised. A disk that shares blocks with a
// snapshot or its source (reflink) needs new blocks for what it rewrites:
// its shared bytes count as promised too, and with an overcommit of 1 a
// new disk is admitted only if the free space holds it and every
// promise. Space.Free keeps a margin (keepBack) for the filesystems' own
// metadata.

// Space is what the storage filesystem can still give disks.
type Space struct {
	// Size is the storage filesystem's size in bytes (the XFS image's,
	// on an xfs-image substrate).
	Size int64
	// Free is what a new disk may take now: the free space less a margin,
	// and on an xfs-image substrate no more than the host's filesystem
	// can back.
	Free int64
	// HostFree is the free space of the host filesystem below an XFS
	// image substrate; otherwise that of the storage filesystem.
	HostFree int64
	// Promised is the capacity of the disks handed out not backed by
	// blocks of their own: not allocated (thin) or shared with
	// a snapshot (reflink). What sandboxes may still need.
	Promised int64
	// Short is how much of Promised the free space cannot hold: writes
	// past it fail on the loop devices (I/O errors, lost data). Zero with
	// an overcommit of 1.
	Short int64
	// Overcommit is the configured ratio (1: every disk backed).
	Overcommit float64
}

// spaceSettle is how long a disk that does not fit waits for space being
// freed: a disk just removed gives its blocks back only once its loop
// device has let go of its image and XFS has processed the unlink.
const spaceSettle = 500 * time.Millisecond

// allocMu serialises the check of the free space with the allocation
// that relies on it, across the pools of this process (they share the
// substrate).
var allocMu sync.Mutex

// keepBack is the margin of a filesystem of size bytes that disks may not
// take: 2%, at least 32 MiB, at most 1 GiB.
func keepBack(size int64) int64 { return min(max(size/50, 32<<20), 1<<30) }

func statSpace(path string) (size, avail int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("reading free space of %s: %w", path, err)
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// space measures the storage filesystem that holds dir; promise sums
// what the disks under the storage's root are promised (promised, or
// what reserve remembers of it).
func space(dir string, sub *Substrate, overcommit float64, promise func(root string) (int64, error)) (Space, error) {
	size, avail, err := statSpace(dir)
	if err != nil {
		return Space{}, err
	}
	sp := Space{Size: size, Free: avail - keepBack(size), HostFree: avail, Overcommit: overcommit}
	root := dir
	if sub != nil {
		root = sub.dir
	}
	if sp.Promised, err = promise(root); err != nil {
		return Space{}, err
	}
	if sub != nil && sub.mode == SubstrateXFSImage {
		hostSize, hostAvail, err := statSpace(filepath.Dir(sub.image))
		if err != nil {
			return Space{}, err
		}
		var st unix.Stat_t
		if err := unix.Stat(sub.image, &st); err != nil {
			return Space{}, fmt.Errorf("inspecting %s: %w", sub.image, err)
		}
		// What XFS holds (its files, fallocated or written) beyond what
		// the host has allocated under it (a disk made sparse by an
		// earlier version): the host owes it. XFS punches what it frees
		// out of the image (substrateData), so what the host allocated
		// is about what XFS holds once every disk is backed.
		owed := max(0, size-avail-st.Blocks*512)
		sp.HostFree = hostAvail
		sp.Free = min(sp.Free, hostAvail-keepBack(hostSize)-owed)
		sp.Short = max(0, owed-hostAvail)
	}
	sp.Free = max(sp.Free, 0)
	sp.Short = max(sp.Short, sp.Promised-max(avail, 0))
	return sp, nil
}

// promised sums, over the volume images handed out under root (vol/ of
// each pool there), the capacity not backed by blocks of their own. The
// ready disks in pool/ are promised to nobody: a disk is admitted (and
// with an overcommit of 1 allocated) when it is handed out (reserve).
func promised(root string) (int64, error) {
	var sum int64
	for _, pattern := range []string{"*/*/" + imageName, "*/*/*/" + imageName} {
		imgs, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return 0, err
		}
		for _, img := range imgs {
			if filepath.Base(filepath.Dir(filepath.Dir(img))) != "vol" {
				continue
			}
			n, _, err := unbacked(img)
			if err != nil {
				continue // removed while we looked
			}
			sum += n
		}
	}
	return sum, nil
}

// unbacked is what the image img lacks of blocks of its own: the part
// not allocated and the part shared with other files; shareable is what
// a reflink would share now (its written blocks that are its own alone).
func unbacked(img string) (n, shareable int64, err error) {
	f, err := os.Open(img)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return unbackedFile(f)
}

// unbackedFile is unbacked of an open image.
func unbackedFile(f *os.File) (n, shareable int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, err
	}
	n = max(0, st.Size-st.Blocks*512)
	err = extents(f, func(_, length int64, flags uint32) error {
		switch {
		case flags&fiemapExtentShared != 0:
			n += length
		case flags&fiemapExtentUnwritten == 0:
			shareable += length
		}
		return nil
	})
	return n, shareable, err
}

// Space reports the storage filesystem's space as the pool sees it.
func (p *Pool) Space() (Space, error) {
	return space(p.cfg.Dir, p.cfg.Substrate, p.cfg.Overcommit, promised)
}

// promisedTTL is how long reserve trusts a walk of every image (promised,
// a FIEMAP each: a millisecond for ten disks here, tens for hundreds),
// adding to it the images it admits since; an older walk is still used,
// while a new one is made behind the hand-out (a create does not wait for
// a walk of a thousand disks). What it forgets only makes it stricter (a
// disk removed, blocks a thin disk allocated since), but for blocks a
// snapshot shares, so Snapshot forgets the walk; and a disk refused on a
// remembered walk is tried again on a fresh one.
const promisedTTL = time.Second

// promisedWalk is a remembered walk of promised, plus the images
// admitted since.
type promisedWalk struct {
	at  time.Time
	sum int64
	// walking: a new walk is under way; since sums the images admitted
	// since it began, which it may not have seen.
	walking bool
	since   int64
}

// admitted adds an image that lacks own bytes to the walk.
func (w *promisedWalk) admitted(own int64) {
	w.sum += own
	if w.walking {
		w.since += own
	}
}

// rewalk makes a new walk of root behind the caller, to replace w if w is
// still the one remembered then. allocMu must be held.
func (w *promisedWalk) rewalk(root string) {
	if w.walking {
		return
	}
	w.walking, w.since = true, 0
	go func() {
		sum, err := promised(root)
		allocMu.Lock()
		defer allocMu.Unlock()
		w.walking = false
		if err != nil || promisedWalks[root] != w {
			return // forgotten meanwhile: the next reserve walks
		}
		w.at, w.sum = time.Now(), sum+w.since
	}()
}

// promisedWalks are the walks by storage root; allocMu guards them.
var promisedWalks = map[string]*promisedWalk{}

// forgetPromised drops the remembered walks, for a change reserve does
// not see (blocks newly shared).
func forgetPromised() {
	allocMu.Lock()
	clear(promisedWalks)
	allocMu.Unlock()
}

// noSpace is the error of a disk the storage cannot back.
func noSpace(size int64, sp Space) error {
	if sp.Overcommit > 1 || sp.Promised > 0 {
		return fmt.Errorf("%w: disk: %s requested, %s free on the storage filesystem × %.1f overcommit, %s promised to disks",
			errdefs.ErrUnavailable, mib(size), mib(sp.Free), sp.Overcommit, mib(sp.Promised))
	}
	return fmt.Errorf("%w: disk: %s requested, %s free on the storage filesystem", errdefs.ErrUnavailable, mib(size), mib(sp.Free))
}

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// reserve admits the image f of a disk being handed out, or refuses it
// with ErrUnavailable when the storage cannot back it next to the disks
// promised already; commit, run once the disk is admitted, moves it out
// of the pool, so that the next walk counts it as promised. It returns
// what f lacks of its blocks (own), which with an overcommit of 1 the
// caller has the backer allocate (backing_linux.go).
func (p *Pool) reserve(f *os.File, commit func() error) (own int64, _ error) {
	allocMu.Lock()
	defer allocMu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("inspecting disk image: %w", err)
	}
	// f is in a pool directory, which walks skip: all it lacks is
	// promised from now on. A thin disk (an overcommit above 1) is
	// promised its whole size until the next walk measures it: a fresh
	// clone shares every block it has with the pristine image, and a
	// recycled one holds few of its own (recycleMaxUsed at most), while
	// mapping its extents to count them cost a create 0.1-0.2 ms of CPU
	// under churn. With an overcommit of 1 the backer allocates what the
	// image lacks, so that is measured.
	own = st.Size
	if p.cfg.Overcommit <= 1 {
		var err error
		if own, _, err = unbackedFile(f); err != nil {
			return 0, fmt.Errorf("mapping disk image: %w", err)
		}
	}
	var walk *promisedWalk
	sp, err := p.spaceFor(own, &walk)
	if err != nil {
		return 0, err
	}
	if !fits(sp) {
		return 0, noSpace(st.Size, sp)
	}
	if err := commit(); err != nil {
		return 0, err
	}
	walk.admitted(own)
	return own, nil
}

func fits(sp Space) bool { return float64(sp.Promised) <= float64(sp.Free)*sp.Overcommit }

// spaceFor measures the space with a disk lacking own bytes added to the
// promises, on a remembered walk (returned in walk) while it is fresh;
// while the disk does not fit it walks again, for up to spaceSettle.
// allocMu must be held.
func (p *Pool) spaceFor(own int64, walk **promisedWalk) (Space, error) {
	remembered := rememberedPromises(own, walk)
	for deadline := time.Now().Add(spaceSettle); ; time.Sleep(20 * time.Millisecond) {
		sp, err := space(p.cfg.Dir, p.cfg.Substrate, p.cfg.Overcommit, remembered)
		if err != nil || fits(sp) || time.Now().After(deadline) {
			return sp, err
		}
		clear(promisedWalks) // walk again
	}
}

// room is how many bytes of disks the storage could admit now, beyond
// the promises: what bounds the pool's ready disks, which hold no
// blocks until they are handed out. It trusts a remembered walk.
func (p *Pool) room() (int64, error) {
	allocMu.Lock()
	defer allocMu.Unlock()
	var walk *promisedWalk
	sp, err := space(p.cfg.Dir, p.cfg.Substrate, p.cfg.Overcommit, rememberedPromises(0, &walk))
	if err != nil {
		return 0, err
	}
	return int64(float64(sp.Free)*sp.Overcommit) - sp.Promised, nil
}

// rememberedPromises is space's promise function on the remembered walk
// of a storage root, plus own; a walk older than promisedTTL is walked
// again behind the caller. walk is set to the walk it used. allocMu must
// be held.
func rememberedPromises(own int64, walk **promisedWalk) func(root string) (int64, error) {
	return func(root string) (int64, error) {
		if *walk = promisedWalks[root]; *walk == nil {
			sum, err := promised(root)
			if err != nil {
				return 0, err
			}
			*walk = &promisedWalk{at: time.Now(), sum: sum}
			promisedWalks[root] = *walk
		} else if time.Since((*walk).at) > promisedTTL {
			(*walk).rewalk(root)
		}
		return (*walk).sum + own, nil
	}
}

// admitShare refuses, with an overcommit of 1, a snapshot by reflink of
// the image f that would make more of its blocks shared than the free
// space could give back: each is one the disk needs anew when it
// rewrites it. (A copy takes its space now and checks it: copyReserve.)
func (p *Pool) admitShare(f *os.File) error {
	if p.cfg.Overcommit > 1 || p.copyOpts.copyOnly {
		return nil
	}
	allocMu.Lock()
	defer allocMu.Unlock()
	_, own, err := unbacked(f.Name())
	if err != nil {
		return fmt.Errorf("mapping disk image: %w", err)
	}
	sp, err := p.Space()
	if err != nil {
		return err
	}
	if own+sp.Promised > sp.Free {
		return fmt.Errorf("%w: disk: a snapshot would share %s its disk may need again; %s free on the storage filesystem, %s promised to disks",
			errdefs.ErrUnavailable, mib(own), mib(sp.Free), mib(sp.Promised))
	}
	return nil
}

// back allocates, in the XFS image on the host, the blocks XFS gave f: an
// unwritten extent in XFS is still a hole in the image until written, and
// writing it would need host space nobody set aside.
func (s *Substrate) back(f *os.File) error {
	img, err := os.OpenFile(s.image, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", s.image, err)
	}
	defer img.Close()
	return extents(f, func(physical, length int64, _ uint32) error {
		if err := unix.Fallocate(int(img.Fd()), unix.FALLOC_FL_KEEP_SIZE, physical, length); err != nil {
			return fmt.Errorf("backing disk image in %s: %w", s.image, err)
		}
		return nil
	})
}

// fiemap and fiemapExtent are struct fiemap and struct fiemap_extent of
// linux/fiemap.h.
type fiemap struct {
	start, length                  uint64
	flags, mapped, count, reserved uint32
}

type fiemapExtent struct {
	logical, physical, length uint64
	reserved64                [2]uint64
	flags                     uint32
	reserved                  [3]uint32
}

const (
	fsIocFiemap           = 0xc020660b // _IOWR('f', 11, struct fiemap)
	fiemapExtentLast      = 0x1
	fiemapExtentShared    = 0x2000
	fiemapExtentUnwritten = 0x800
	fiemapBatch           = 128
	fiemapExtentsSize     = fiemapBatch * int(unsafe.Sizeof(fiemapExtent{}))
)

// extents calls fn with the physical offset and length, in bytes on the
// filesystem's device, and the FIEMAP_EXTENT_* flags of every extent of f.
func extents(f *os.File, fn func(physical, length int64, flags uint32) error) error {
	buf := make([]byte, int(unsafe.Sizeof(fiemap{}))+fiemapExtentsSize)
	hdr := (*fiemap)(unsafe.Pointer(&buf[0]))
	exts := unsafe.Slice((*fiemapExtent)(unsafe.Pointer(&buf[unsafe.Sizeof(fiemap{})])), fiemapBatch)
	next := uint64(0)
	for {
		*hdr = fiemap{start: next, length: ^uint64(0) - next, count: fiemapBatch}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return fmt.Errorf("mapping %s: %w", f.Name(), errno)
		}
		if hdr.mapped == 0 {
			return nil
		}
		for _, e := range exts[:hdr.mapped] {
			if err := fn(int64(e.physical), int64(e.length), e.flags); err != nil {
				return err
			}
			next = e.logical + e.length
			if e.flags&fiemapExtentLast != 0 {
				return nil
			}
		}
	}
}
