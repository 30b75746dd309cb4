package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// A checkpoint packed: runsc's files in one squashfs image (zstd, in
// sqfsBlock blocks), packName, that a resume mounts read-only and
// restores from as it is. The kernel expands a block when runsc reads
// it, so runsc restore starts at once and its pages load in the
// background (--background) while the processes run: nothing is
// expanded before the restore. After the image comes a trailer with a
// CRC-32C of each sumChunk of it (squashfs sums nothing, and damage
// found while pages load in the background would kill a sandbox that
// had already resumed), checked before the restore:
//
//	image (padded to 4 KiB) | CRC-32C of each sumChunk (uint32) |
//	image size (uint64) | sumChunk (uint32) | count (uint32) | packMagic
//
// little-endian. The kernel reads the image alone (it stops at its
// superblock's bytes_used).
const (
	packName     = "checkpoint.sqfs"
	sqfsBlockLog = 18
	sqfsBlock    = 1 << sqfsBlockLog
	sumChunk     = 4 << 20
	packMagic    = 0x32584b50 // "PKX2"
	// maxPackSums bounds what a trailer may claim (4 TiB at 4 MiB).
	maxPackSums = 1 << 20
)

// squashfs 4.0, as the kernel reads it (fs/squashfs/squashfs_fs.h).
const (
	sqfsMagic       = 0x73717368
	sqfsZstd        = 6
	sqfsNoXattrs    = 0x0200
	sqfsNoFragments = 0x0010
	sqfsInvalid     = ^uint64(0)
	sqfsNoFrag      = ^uint32(0)
	sqfsMetaSize    = 8192
	sqfsMetaRaw     = 0x8000  // a metadata block stored as it is
	sqfsDataRaw     = 1 << 24 // a data block stored as it is
	sqfsDirType     = 1
	sqfsFileType    = 2
	sqfsLFileType   = 9
	sqfsSuperSize   = 96
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// packEncoder is the squeeze's encoder (coders) without a checksum in
// each frame: the kernel's squashfs fails a block (EIO) whose frame
// ends with checksum bytes alone in a page after the block's output
// is whole (its zstd wrapper asks for another output page before
// reading on); 3 blocks of 2045 in a checkpoint of 512 MiB of hex did.
// The trailer's sums stand for them.
var packEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithAllLitEntropyCompression(true),
		zstd.WithEncoderCRC(false), zstd.WithEncoderConcurrency(goruntime.NumCPU()))
})

// metaStream is squashfs metadata (inodes, directories, ids) written
// in uncompressed blocks of sqfsMetaSize, each behind its 2-byte
// header.
type metaStream struct{ b []byte }

// at is where the next byte goes: its block's offset from the table's
// start, and its offset in the block.
func (m *metaStream) at() (block uint32, offset uint16) {
	n := len(m.b)
	return uint32(n / sqfsMetaSize * (sqfsMetaSize + 2)), uint16(n % sqfsMetaSize)
}

func (m *metaStream) put(v ...any) {
	for _, x := range v {
		m.b, _ = binary.Append(m.b, binary.LittleEndian, x)
	}
}

func (m *metaStream) table() []byte {
	var out []byte
	for rest := m.b; len(rest) > 0; {
		n := min(len(rest), sqfsMetaSize)
		out = binary.LittleEndian.AppendUint16(out, uint16(n)|sqfsMetaRaw)
		out = append(out, rest[:n]...)
		rest = rest[n:]
	}
	return out
}

// packDir packs the files names of dir into dst, a new file (synced),
// compressing their blocks on every core; it stops when ctx ends.
func packDir(ctx context.Context, dir string, names []string, dst string) (retErr error) {
	enc, err := packEncoder()
	if err != nil {
		return err
	}
	out, err := createNew(dst)
	if err != nil {
		return err
	}
	defer closeNew(out, &retErr)
	names = slices.Sorted(slices.Values(names))
	type packed struct {
		start, size, sparse int64
		sizes               []uint32
	}
	files := make([]packed, len(names))
	pos := int64(sqfsSuperSize)
	for i, name := range names {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		p := packed{start: pos}
		err = compressBlocks(ctx, f, sqfsBlock, enc.EncodeAll, func(b []byte, raw int) error {
			switch {
			case b == nil:
				p.sizes = append(p.sizes, 0) // a hole: all zeros
				p.sparse += int64(raw)
				return nil
			}
			p.sizes = append(p.sizes, uint32(len(b)))
			_, err := out.WriteAt(b, pos)
			pos += int64(len(b))
			return err
		}, func(b []byte) error {
			p.sizes = append(p.sizes, uint32(len(b))|sqfsDataRaw)
			_, err := out.WriteAt(b, pos)
			pos += int64(len(b))
			return err
		})
		if err == nil {
			var fi os.FileInfo
			if fi, err = f.Stat(); err == nil {
				p.size = fi.Size()
			}
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("packing %s: %w", name, err)
		}
		files[i] = p
	}

	// Inodes: the files' (1..n, extended: 64-bit sizes), then the
	// root directory's (n+1).
	var inodes, dirs metaStream
	type ref struct {
		block  uint32
		offset uint16
	}
	refs := make([]ref, len(files))
	for i, p := range files {
		b, o := inodes.at()
		refs[i] = ref{b, o}
		inodes.put(uint16(sqfsLFileType), uint16(0o600), uint16(0), uint16(0), uint32(0), uint32(i+1),
			uint64(p.start), uint64(p.size), uint64(p.sparse), uint32(1), sqfsNoFrag, uint32(0), sqfsNoFrag)
		inodes.put(p.sizes)
	}
	for i, name := range names {
		// One header an entry: each may start in another inode block.
		dirs.put(uint32(0), refs[i].block, uint32(i+1), refs[i].offset, int16(0), uint16(sqfsFileType), uint16(len(name)-1))
		dirs.b = append(dirs.b, name...)
	}
	if len(dirs.b)+3 > 0xffff {
		return errors.New("too many files for one directory block")
	}
	rootBlock, rootOffset := inodes.at()
	n := uint32(len(files))
	inodes.put(uint16(sqfsDirType), uint16(0o700), uint16(0), uint16(0), uint32(0), n+1,
		uint32(0), uint32(2), uint16(len(dirs.b)+3), uint16(0), n+2)

	inodeStart := pos
	tail := inodes.table()
	dirStart := inodeStart + int64(len(tail))
	tail = append(tail, dirs.table()...)
	idBlock := inodeStart + int64(len(tail))
	ids := metaStream{}
	ids.put(uint32(0))
	tail = append(tail, ids.table()...)
	idStart := inodeStart + int64(len(tail))
	tail = binary.LittleEndian.AppendUint64(tail, uint64(idBlock))
	used := inodeStart + int64(len(tail))
	if _, err := out.WriteAt(tail, inodeStart); err != nil {
		return err
	}

	var sb metaStream
	sb.put(uint32(sqfsMagic), n+1, uint32(0), uint32(sqfsBlock), uint32(0), uint16(sqfsZstd), uint16(sqfsBlockLog),
		uint16(sqfsNoXattrs|sqfsNoFragments), uint16(1), uint16(4), uint16(0),
		uint64(rootBlock)<<16|uint64(rootOffset), uint64(used), uint64(idStart), sqfsInvalid,
		uint64(inodeStart), uint64(dirStart), sqfsInvalid, sqfsInvalid)
	if _, err := out.WriteAt(sb.b, 0); err != nil {
		return err
	}
	size := (used + 4095) &^ 4095
	if err := out.Truncate(size); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	trailer, err := sumImage(ctx, out, size)
	if err != nil {
		return err
	}
	if _, err := out.WriteAt(trailer, size); err != nil {
		return err
	}
	return out.Sync()
}

// compressBlocks reads f in blocks of block bytes, compresses them on every
// core, and hands them over in order: to put (nil for a block of zeros,
// else compressed) or to putRaw (the block as it is, when compressing
// does not shrink it).
func compressBlocks(ctx context.Context, f *os.File, block int64, encode func(src, dst []byte) []byte,
	put func(b []byte, raw int) error, putRaw func(b []byte) error) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	blocks := int((size + block - 1) / block)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		b, raw []byte
		zero   bool
		err    error
	}
	workers := goruntime.NumCPU()
	slots := make([]chan result, blocks)
	for i := range slots {
		slots[i] = make(chan result, 1)
	}
	// At most 4 blocks per worker are read and not yet written.
	room := make(chan struct{}, 4*workers)
	jobs := make(chan int)
	go func() {
		defer close(jobs)
		for i := 0; i < blocks; i++ {
			select {
			case room <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for w := 0; w < workers; w++ {
		go func() {
			for i := range jobs {
				off := int64(i) * block
				buf := make([]byte, min(block, size-off))
				var r result
				if _, err := f.ReadAt(buf, off); err != nil {
					r.err = err
				} else if allZero(buf) {
					r.zero, r.raw = true, buf
				} else if b := encode(buf, make([]byte, 0, len(buf)/2)); len(b) < len(buf) {
					r.b, r.raw = b, buf
				} else {
					r.raw = buf
				}
				slots[i] <- r
			}
		}()
	}
	for i := 0; i < blocks; i++ {
		var r result
		select {
		case r = <-slots[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		switch {
		case r.err != nil:
			err = r.err
		case r.zero:
			err = put(nil, len(r.raw))
		case r.b != nil:
			err = put(r.b, len(r.raw))
		default:
			err = putRaw(r.raw)
		}
		if err != nil {
			return err
		}
		<-room
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// sumImage is the trailer of the first size bytes of f.
func sumImage(ctx context.Context, f *os.File, size int64) ([]byte, error) {
	sums, err := chunkSums(ctx, f, size)
	if err != nil {
		return nil, err
	}
	var t []byte
	for _, s := range sums {
		t = binary.LittleEndian.AppendUint32(t, s)
	}
	t = binary.LittleEndian.AppendUint64(t, uint64(size))
	t = binary.LittleEndian.AppendUint32(t, sumChunk)
	t = binary.LittleEndian.AppendUint32(t, uint32(len(sums)))
	return binary.LittleEndian.AppendUint32(t, packMagic), nil
}

// chunkSums is the CRC-32C of each sumChunk of the first size bytes of
// f, read on every core.
func chunkSums(ctx context.Context, f *os.File, size int64) ([]uint32, error) {
	n := int((size + sumChunk - 1) / sumChunk)
	sums := make([]uint32, n)
	err := eachOnCores(ctx, n, func() func(i int) error {
		buf := make([]byte, sumChunk)
		return func(i int) error {
			off := int64(i) * sumChunk
			b := buf[:min(sumChunk, size-off)]
			if _, err := f.ReadAt(b, off); err != nil {
				return err
			}
			sums[i] = crc32.Checksum(b, castagnoli)
			return nil
		}
	})
	return sums, err
}

// checkPack checks packed checkpoint p against its trailer and returns
// the image's size.
func checkPack(ctx context.Context, p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	total := fi.Size()
	var tail [20]byte
	if total < sqfsSuperSize+int64(len(tail)) {
		return 0, errors.New("too short for its trailer (truncated?)")
	}
	if _, err := f.ReadAt(tail[:], total-int64(len(tail))); err != nil {
		return 0, err
	}
	if binary.LittleEndian.Uint32(tail[16:]) != packMagic {
		return 0, errors.New("no trailer at its end (truncated?)")
	}
	size := int64(binary.LittleEndian.Uint64(tail[:]))
	chunk := binary.LittleEndian.Uint32(tail[8:])
	n := int64(binary.LittleEndian.Uint32(tail[12:]))
	if chunk != sumChunk || n > maxPackSums || size < sqfsSuperSize || (size+sumChunk-1)/sumChunk != n || size+4*n+20 != total {
		return 0, fmt.Errorf("its trailer does not agree with its size (%d bytes, trailer says %d in %d sums of %d)", total, size, n, chunk)
	}
	want := make([]byte, 4*n)
	if _, err := f.ReadAt(want, size); err != nil {
		return 0, err
	}
	got, err := chunkSums(ctx, f, size)
	if err != nil {
		return 0, err
	}
	for i, s := range got {
		if binary.LittleEndian.Uint32(want[4*i:]) != s {
			return 0, fmt.Errorf("its bytes %d to %d do not match their checksum", int64(i)*sumChunk, min(size, int64(i+1)*sumChunk))
		}
	}
	return size, nil
}

// errDamaged is a pack's check failing: the checkpoint is unusable
// (unlike a mount that fails for want of a loop device).
var errDamaged = errors.New("the checkpoint is damaged")

// mountPack checks packed checkpoint p and mounts it read-only at dir,
// a new directory.
func mountPack(ctx context.Context, p, dir string) error {
	if _, err := checkPack(ctx, p); err != nil {
		return fmt.Errorf("%w: %s: %v", errDamaged, filepath.Base(p), err)
	}
	unmountPack(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	fd, dev, err := disk.AttachReadOnly(p)
	if err != nil {
		os.Remove(dir)
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(dev, dir, "squashfs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mounting %s: %w", filepath.Base(p), err)
	}
	return nil
}

// unmountPack detaches what is mounted at dir (runsc may read on from
// the files it opened: the image stays until it closes them) and
// removes dir.
func unmountPack(dir string) {
	for unix.Unmount(dir, unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(dir)
}
