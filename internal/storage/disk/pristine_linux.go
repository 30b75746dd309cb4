package disk

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
)

// Pristine images. mkfs.ext4 costs 18 ms and 11 ms of CPU per disk here
// (BenchmarkDiskLife), more than the rest of a disk's life together, and
// every fresh filesystem of one size and format is the same bytes but for
// its UUID. So each size is formatted once, into a pristine image in
// Dir/pristine that is never mounted, and a new volume's image is a
// reflink clone of it (FICLONE: tens of microseconds, sharing the 4 MiB
// mkfs wrote) with a UUID of its own written into its superblock. Where
// the storage cannot reflink, the image is a sparse copy of the pristine
// (its few MiB of data), still cheaper than mkfs.
//
// A pristine appears by rename once formatted and synced, so one that
// exists is whole; a later process reuses it. Its name carries
// pristineVersion, bumped whenever mkfsArgs change, so an image of an old
// format is removed at NewPool rather than cloned. At most maxPristines
// sizes are kept; the one used least lately goes first (clones of it are
// unaffected: they own their extents' references).

const (
	pristineDir     = "pristine"
	pristineVersion = "v2"
	maxPristines    = 4
)

// pristines makes and finds a pool's pristine images.
type pristines struct {
	dir  string
	mkfs string

	mu   sync.Mutex
	tick uint64
	imgs map[int64]*pristine // by size
}

// pristine is one size's image: being made until done is closed.
type pristine struct {
	path string
	done chan struct{}
	err  error  // set before done is closed
	used uint64 // pristines.tick when last asked for
}

func pristineName(size int64) string {
	return pristineVersion + "-ext4-" + strconv.FormatInt(size>>20, 10) + "M.img"
}

// openPristines takes over dir: it keeps the images of this version that
// are whole and removes everything else (half-made ones, old formats).
func openPristines(dir, mkfs string) (*pristines, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("making pristine image dir: %w", err)
	}
	ps := &pristines{dir: dir, mkfs: mkfs, imgs: map[int64]*pristine{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing pristine images: %w", err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if size, ok := parsePristineName(e.Name()); ok && len(ps.imgs) < maxPristines && checkPristine(path, size) == nil {
			done := make(chan struct{})
			close(done)
			ps.imgs[size] = &pristine{path: path, done: done}
			continue
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale pristine image: %w", err)
		}
	}
	return ps, nil
}

func parsePristineName(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, pristineVersion+"-ext4-")
	if !ok {
		return 0, false
	}
	mib, ok := strings.CutSuffix(rest, "M.img")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(mib, 10, 64)
	if err != nil || n<<20 < MinSize || n<<20 > MaxSize || pristineName(n<<20) != name {
		return 0, false
	}
	return n << 20, true
}

// get returns the path of the pristine image of size bytes, formatting it
// first if there is none: the first caller formats, the others wait.
func (ps *pristines) get(ctx context.Context, size int64) (string, error) {
	ps.mu.Lock()
	ps.tick++
	pr := ps.imgs[size]
	if pr != nil {
		select {
		case <-pr.done:
			if pr.err != nil {
				pr = nil // failed: try again
			}
		default:
		}
	}
	if pr != nil {
		pr.used = ps.tick
		ps.mu.Unlock()
		select {
		case <-pr.done:
			return pr.path, pr.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	pr = &pristine{path: filepath.Join(ps.dir, pristineName(size)), done: make(chan struct{}), used: ps.tick}
	ps.imgs[size] = pr
	evict := ps.evictLocked()
	ps.mu.Unlock()
	for _, path := range evict {
		os.Remove(path)
	}
	// Shared by every caller of this size, so not bound to this one's
	// context; mkfs does not hang.
	pr.err = formatPristine(ps.mkfs, pr.path, size)
	close(pr.done)
	return pr.path, pr.err
}

// forget drops the pristine image at path, found broken or missing, so
// that the next get makes it again.
func (ps *pristines) forget(size int64, path string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if pr := ps.imgs[size]; pr != nil && pr.path == path {
		select {
		case <-pr.done:
			delete(ps.imgs, size)
			os.Remove(path)
		default:
		}
	}
}

// evictLocked drops the images used least lately beyond maxPristines,
// and returns their paths to remove. One being made is never dropped.
func (ps *pristines) evictLocked() []string {
	var paths []string
	for len(ps.imgs) > maxPristines {
		var oldest int64 = -1
		for size, pr := range ps.imgs {
			select {
			case <-pr.done:
			default:
				continue
			}
			if oldest < 0 || pr.used < ps.imgs[oldest].used {
				oldest = size
			}
		}
		if oldest < 0 {
			break
		}
		paths = append(paths, ps.imgs[oldest].path)
		delete(ps.imgs, oldest)
	}
	return paths
}

// formatPristine makes the pristine image path of size bytes: formatted
// as path.tmp, synced, renamed. It leaves nothing on failure.
func formatPristine(mkfs, path string, size int64) error {
	tmp := path + tmpSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	if err := createSparse(tmp, size); err != nil {
		return err
	}
	if out, err := exec.Command(mkfs, append(mkfsArgs, tmp)...).CombinedOutput(); err != nil {
		return fmt.Errorf("formatting disk: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := checkPristine(tmp, size); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming pristine image: %w", err)
	}
	return durable.SyncDir(filepath.Dir(path))
}

// The ext4 superblock fields the pool reads and writes: struct
// ext4_super_block, at byte 1024 of the filesystem, little-endian.
const (
	sbOffset          = 1024
	sbSize            = 1024
	sbBlocksCountLo   = 0x04
	sbLogBlockSize    = 0x18
	sbInodesPerGroup  = 0x28
	sbInodeSize       = 0x58
	sbMagic           = 0x38
	sbFeatureIncompat = 0x60
	sbFeatureROCompat = 0x64
	sbUUID            = 0x68
	sbBlocksCountHi   = 0x150
	sbChecksum        = 0x3fc

	ext4Magic            = 0xef53
	incompat64Bit        = 0x80
	incompatCsumSeed     = 0x2000
	roCompatMetadataCsum = 0x400
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readSuper reads f's ext4 superblock and checks its magic.
func readSuper(f *os.File) ([]byte, error) {
	sb := make([]byte, sbSize)
	if _, err := f.ReadAt(sb, sbOffset); err != nil {
		return nil, fmt.Errorf("reading superblock of %s: %w", f.Name(), err)
	}
	if binary.LittleEndian.Uint16(sb[sbMagic:]) != ext4Magic {
		return nil, fmt.Errorf("%s is not an ext4 image", f.Name())
	}
	return sb, nil
}

// checkPristine checks that path holds an ext4 filesystem of size bytes
// whose UUID can change without rewriting every checksum (mkfsArgs'
// metadata_csum_seed).
func checkPristine(path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening pristine image: %w", err)
	}
	defer f.Close()
	im, err := readImage(f)
	if err != nil {
		return err
	}
	sb, blocks, bsize := im.sb, im.blocks, im.bsize
	// mkfs leaves out a last block group too small for its own inode
	// table and bitmaps (a 10241 MiB disk holds 10240 MiB of filesystem),
	// so the filesystem may fall short of size by less than that much.
	table := uint64(binary.LittleEndian.Uint32(sb[sbInodesPerGroup:])) * uint64(binary.LittleEndian.Uint16(sb[sbInodeSize:]))
	if fs := blocks * bsize; fs > uint64(size) || uint64(size)-fs > table+64*bsize {
		return fmt.Errorf("pristine image %s holds %d bytes of filesystem, want %d", path, fs, size)
	}
	if !hasCsumSeed(sb) {
		return fmt.Errorf("pristine image %s lacks metadata_csum_seed", path)
	}
	return nil
}

func hasCsumSeed(sb []byte) bool {
	return binary.LittleEndian.Uint32(sb[sbFeatureIncompat:])&incompatCsumSeed != 0
}

// setFreshUUID gives the ext4 image f a random UUID, so that no two disks
// share one (blkid, fsck and anyone mounting by UUID would be confused).
// Writing the field and the superblock's checksum is enough when the
// checksums are seeded from s_checksum_seed (metadata_csum_seed), as every
// image this package formats is; an image without it keeps its UUID. The
// backup superblocks keep the old one, as the kernel's own UUID change
// leaves them; e2fsck reads the primary. The journal keeps its own.
func setFreshUUID(f *os.File) error {
	sb, err := readSuper(f)
	if err != nil {
		return err
	}
	if !hasCsumSeed(sb) {
		return nil
	}
	uuid := sb[sbUUID : sbUUID+16]
	if _, err := rand.Read(uuid); err != nil {
		return fmt.Errorf("making a UUID: %w", err)
	}
	uuid[6] = uuid[6]&0x0f | 0x40 // version 4
	uuid[8] = uuid[8]&0x3f | 0x80 // RFC 4122 variant
	if binary.LittleEndian.Uint32(sb[sbFeatureROCompat:])&roCompatMetadataCsum != 0 {
		// The kernel's crc32c(~0, sb) without the final inversion.
		binary.LittleEndian.PutUint32(sb[sbChecksum:], ^crc32.Checksum(sb[:sbChecksum], castagnoli))
	}
	if _, err := f.WriteAt(sb, sbOffset); err != nil {
		return fmt.Errorf("writing superblock of %s: %w", f.Name(), err)
	}
	return nil
}

// cloneImage makes the new, empty file img a copy of the image src (a
// pristine image, or a snapshot's): FICLONE where the storage can share
// extents (and the substrate is not forced to copy), otherwise a sparse
// copy of its data. Nothing is synced: img is a volume's image in a pool
// entry, which a crash sweeps away, and once handed out the filesystem in
// it syncs it (each journal commit flushes the loop device, which syncs
// the image).
func cloneImage(ctx context.Context, img *os.File, src string, opts cloneOptions) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("opening source image: %w", err)
	}
	defer in.Close()
	if !opts.copyOnly {
		err := unix.IoctlFileClone(int(img.Fd()), int(in.Fd()))
		if err == nil {
			return nil
		}
		if !cannotReflink(err) {
			return fmt.Errorf("cloning %s: %w", src, err)
		}
	}
	if err := copySparse(ctx, img, in, opts); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}
