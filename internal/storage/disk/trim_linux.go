package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// What a snapshot's copy need not keep. A snapshot captures a frozen
// filesystem: its journal is empty (FIFREEZE checkpoints every
// transaction and sets the journal superblock's s_start to 0), and its
// block bitmaps say which blocks hold nothing anyone reads. But the image
// keeps what was last written to the log and to every block ext4 has
// freed, and on the substrate those are many small extents: the loop
// device writes a block at a time, and a disk recycled through many
// sandboxes holds a block of each. Every clone of the snapshot (each
// sandbox of a template, each fork) pays FICLONE's 20-30 µs per extent,
// and as much again when it is deleted. So the capture punches both out
// of its copy (never out of the live disk, whose blocks may be backed):
// the churn bench's template went from 116 extents to 25. An empty
// journal is never read past its superblock, which stays (a mount starts
// a new log after it; recovery stops at the first block that is not the
// next transaction's), and ext4 never reads a free block.

// The fields read here, beside the superblock's (pristine_linux.go).
const (
	sbFirstDataBlock = 0x14
	sbBlocksPerGroup = 0x20
	sbFeatureCompat  = 0x5c
	sbJournalInum    = 0xe0
	sbJournalDev     = 0xe4
	sbDescSize       = 0xfe

	compatHasJournal = 0x4
	incompatMetaBG   = 0x10
	roCompatBigalloc = 0x200
	bgBlockUninit    = 0x2
	maxDescBytes     = 16 << 20

	gdBlockBitmapLo = 0x00
	gdFlags         = 0x12
	gdBlockBitmapHi = 0x20
	gdInodeTableLo  = 0x08
	gdInodeTableHi  = 0x28

	inodeFlags      = 0x20
	inodeBlock      = 0x28
	inodeExtentsFl  = 0x80000
	extentMagic     = 0xf30a
	extentHeader    = 12
	extentSize      = 12
	extentInitMax   = 32768
	inodeBlockBytes = 60

	// struct journal_superblock_s, big-endian.
	jbdMagic     = 0xc03b3998
	jbdSBv1      = 3
	jbdSBv2      = 4
	jbdBlockType = 0x04
	jbdStart     = 0x1c
)

// extent is a run of the journal's blocks: logical block, length and
// first physical block, in filesystem blocks.
type extent struct{ logical, length, physical uint64 }

// ext4Image is an ext4 image file, its superblock and the geometry read
// from it, checked to lie within the file.
type ext4Image struct {
	f        *os.File
	sb       []byte
	bsize    uint64 // bytes a block
	descSize uint64 // bytes a group descriptor
	first    uint64 // first data block
	blocks   uint64 // blocks in the filesystem
}

// readImage reads f's superblock and geometry.
func readImage(f *os.File) (*ext4Image, error) {
	sb, err := readSuper(f)
	if err != nil {
		return nil, err
	}
	logBlock := binary.LittleEndian.Uint32(sb[sbLogBlockSize:])
	if logBlock > 6 {
		return nil, fmt.Errorf("%s: block size 1 KiB << %d", f.Name(), logBlock)
	}
	im := &ext4Image{f: f, sb: sb, bsize: uint64(1024) << logBlock, descSize: 32,
		first:  uint64(binary.LittleEndian.Uint32(sb[sbFirstDataBlock:])),
		blocks: uint64(binary.LittleEndian.Uint32(sb[sbBlocksCountLo:]))}
	if binary.LittleEndian.Uint32(sb[sbFeatureIncompat:])&incompat64Bit != 0 {
		im.blocks |= uint64(binary.LittleEndian.Uint32(sb[sbBlocksCountHi:])) << 32
		im.descSize = uint64(binary.LittleEndian.Uint16(sb[sbDescSize:]))
		if im.descSize < 64 || im.descSize > im.bsize {
			return nil, fmt.Errorf("%s: group descriptors of %d bytes", f.Name(), im.descSize)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if im.blocks <= im.first || im.blocks > uint64(st.Size)/im.bsize {
		return nil, fmt.Errorf("%s: %d blocks of %d bytes in %d bytes", f.Name(), im.blocks, im.bsize, st.Size)
	}
	return im, nil
}

// punch makes blocks [from, from+n) of the image a hole.
func (im *ext4Image) punch(from, n uint64) error {
	if err := unix.Fallocate(int(im.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(from*im.bsize), int64(n*im.bsize)); err != nil {
		return fmt.Errorf("punching %s: %w", im.f.Name(), err)
	}
	return nil
}

// trimCopy punches out of the ext4 image f, a snapshot's copy, its empty
// journal's log and its free blocks.
func trimCopy(f *os.File) error {
	im, err := readImage(f)
	if err != nil {
		return err
	}
	_, jerr := im.dropEmptyJournal()
	_, ferr := im.dropFreeBlocks()
	return errors.Join(jerr, ferr)
}

// dropEmptyJournal punches the log blocks of the image's journal out of
// it if the journal is empty. It reports how many blocks it punched; an
// image whose journal is not empty, external or not as this package
// formats it (extents in the inode itself) is left as it is, with 0.
func (im *ext4Image) dropEmptyJournal() (int64, error) {
	if binary.LittleEndian.Uint32(im.sb[sbFeatureCompat:])&compatHasJournal == 0 ||
		binary.LittleEndian.Uint32(im.sb[sbJournalDev:]) != 0 {
		return 0, nil
	}
	exts, err := im.journalExtents()
	if err != nil || exts == nil {
		return 0, err
	}
	var sbBlock uint64
	found := false
	for _, e := range exts {
		if e.physical > im.blocks || e.physical+e.length > im.blocks {
			return 0, fmt.Errorf("%s: journal extent past the filesystem's end", im.f.Name())
		}
		if e.logical == 0 {
			sbBlock, found = e.physical, true
		}
	}
	if !found {
		return 0, nil
	}
	jsb := make([]byte, 1024)
	if _, err := im.f.ReadAt(jsb, int64(sbBlock*im.bsize)); err != nil {
		return 0, fmt.Errorf("reading journal superblock of %s: %w", im.f.Name(), err)
	}
	if t := binary.BigEndian.Uint32(jsb[jbdBlockType:]); binary.BigEndian.Uint32(jsb) != jbdMagic || (t != jbdSBv1 && t != jbdSBv2) {
		return 0, fmt.Errorf("%s: no journal superblock at block %d", im.f.Name(), sbBlock)
	}
	if binary.BigEndian.Uint32(jsb[jbdStart:]) != 0 {
		return 0, nil // transactions to replay
	}
	var punched int64
	for _, e := range exts {
		start, n := e.physical, e.length
		if e.logical == 0 {
			start, n = start+1, n-1
		}
		if n == 0 {
			continue
		}
		if err := im.punch(start, n); err != nil {
			return punched, err
		}
		punched += int64(n)
	}
	return punched, nil
}

// journalExtents reads the journal inode's extents from the image, nil if
// they are not held in the inode (a tree deeper than one level, which
// mkfs does not make for a journal of this size).
func (im *ext4Image) journalExtents() ([]extent, error) {
	f, sb, bsize, descSize := im.f, im.sb, im.bsize, im.descSize
	ino := uint64(binary.LittleEndian.Uint32(sb[sbJournalInum:]))
	ipg := uint64(binary.LittleEndian.Uint32(sb[sbInodesPerGroup:]))
	isize := uint64(binary.LittleEndian.Uint16(sb[sbInodeSize:]))
	if ino == 0 || ipg == 0 || isize < 128 || isize > bsize {
		return nil, fmt.Errorf("%s: bad journal inode %d (%d per group, %d bytes)", f.Name(), ino, ipg, isize)
	}
	group, index := (ino-1)/ipg, (ino-1)%ipg
	gd := make([]byte, descSize)
	if _, err := f.ReadAt(gd, int64((im.first+1)*bsize+group*descSize)); err != nil {
		return nil, fmt.Errorf("reading group descriptor of %s: %w", f.Name(), err)
	}
	table := uint64(binary.LittleEndian.Uint32(gd[gdInodeTableLo:]))
	if descSize >= 64 {
		table |= uint64(binary.LittleEndian.Uint32(gd[gdInodeTableHi:])) << 32
	}
	inode := make([]byte, isize)
	if _, err := f.ReadAt(inode, int64(table*bsize+index*isize)); err != nil {
		return nil, fmt.Errorf("reading journal inode of %s: %w", f.Name(), err)
	}
	if binary.LittleEndian.Uint32(inode[inodeFlags:])&inodeExtentsFl == 0 {
		return nil, nil
	}
	b := inode[inodeBlock : inodeBlock+inodeBlockBytes]
	entries := int(binary.LittleEndian.Uint16(b[2:]))
	if binary.LittleEndian.Uint16(b) != extentMagic || binary.LittleEndian.Uint16(b[6:]) != 0 {
		return nil, nil // not a leaf in the inode
	}
	if extentHeader+entries*extentSize > inodeBlockBytes {
		return nil, errors.New("journal inode: too many extents for the inode")
	}
	exts := make([]extent, 0, entries)
	for i := range entries {
		e := b[extentHeader+i*extentSize:]
		n := uint64(binary.LittleEndian.Uint16(e[4:]))
		if n == 0 || n > extentInitMax {
			return nil, nil // uninitialised: not a journal mkfs made
		}
		phys := uint64(binary.LittleEndian.Uint16(e[6:]))<<32 | uint64(binary.LittleEndian.Uint32(e[8:]))
		exts = append(exts, extent{logical: uint64(binary.LittleEndian.Uint32(e)), length: n, physical: phys})
	}
	return exts, nil
}

// dropFreeBlocks punches the blocks the image's block bitmaps mark free
// out of it (what FITRIM would discard, done on the copy): blocks a
// file held once and ext4 freed keep their last contents in the image,
// each an extent on the substrate, which clones of a snapshot would carry
// (a disk recycled through a thousand sandboxes holds a block of each).
// Groups whose bitmap was never written (BLOCK_UNINIT) are skipped: their
// blocks never were either. It reports the blocks punched; an image of a
// layout this package does not format (meta_bg, bigalloc) is left alone.
func (im *ext4Image) dropFreeBlocks() (int64, error) {
	f, sb, bsize, descSize, first, blocks := im.f, im.sb, im.bsize, im.descSize, im.first, im.blocks
	if binary.LittleEndian.Uint32(sb[sbFeatureIncompat:])&incompatMetaBG != 0 ||
		binary.LittleEndian.Uint32(sb[sbFeatureROCompat:])&roCompatBigalloc != 0 {
		return 0, nil
	}
	perGroup := uint64(binary.LittleEndian.Uint32(sb[sbBlocksPerGroup:]))
	if perGroup == 0 || perGroup > 8*bsize {
		return 0, fmt.Errorf("%s: %d blocks a group", f.Name(), perGroup)
	}
	groups := (blocks - first + perGroup - 1) / perGroup
	if groups*descSize > maxDescBytes {
		return 0, nil // 16 TiB of 4 KiB blocks needs 8 MiB
	}
	gdt := make([]byte, groups*descSize)
	if _, err := f.ReadAt(gdt, int64((first+1)*bsize)); err != nil {
		return 0, fmt.Errorf("reading group descriptors of %s: %w", f.Name(), err)
	}
	bitmap := make([]byte, bsize)
	var punched int64
	punch := func(from, to uint64) error { // blocks [from, to)
		if to <= from {
			return nil
		}
		punched += int64(to - from)
		return im.punch(from, to-from)
	}
	for g := range groups {
		gd := gdt[g*descSize:]
		if binary.LittleEndian.Uint16(gd[gdFlags:])&bgBlockUninit != 0 {
			continue
		}
		at := uint64(binary.LittleEndian.Uint32(gd[gdBlockBitmapLo:]))
		if descSize >= 64 {
			at |= uint64(binary.LittleEndian.Uint32(gd[gdBlockBitmapHi:])) << 32
		}
		if at >= blocks {
			return punched, fmt.Errorf("%s: group %d's bitmap at block %d, past the end", f.Name(), g, at)
		}
		if _, err := f.ReadAt(bitmap, int64(at*bsize)); err != nil {
			return punched, fmt.Errorf("reading block bitmap of %s: %w", f.Name(), err)
		}
		base := first + g*perGroup
		n := min(perGroup, blocks-base)
		run := uint64(0) // start of the free run, if inFree
		inFree := false
		for i := uint64(0); i < n; i++ {
			// Whole bytes of one kind within a run, or outside one, at once.
			if i%8 == 0 && i+8 <= n {
				if b := bitmap[i/8]; (b == 0 && inFree) || (b == 0xff && !inFree) {
					i += 7
					continue
				}
			}
			free := bitmap[i/8]&(1<<(i%8)) == 0
			switch {
			case free && !inFree:
				run, inFree = base+i, true
			case !free && inFree:
				if err := punch(run, base+i); err != nil {
					return punched, err
				}
				inFree = false
			}
		}
		if inFree {
			if err := punch(run, base+n); err != nil {
				return punched, err
			}
		}
	}
	return punched, nil
}
