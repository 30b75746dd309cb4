package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/minio/minio-go/v7"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sparse"
)

// A disk travels as zstd of: the magic, the image's size, the number of
// data extents and each extent's offset and length (little-endian
// uint64s), the extents' bytes in order, and the end mark. Holes do not
// travel; the reader checks every number before it writes.
var (
	diskMagic = [8]byte{'P', 'D', 'K', 'D', 'I', 'S', 'K', '1'}
	diskEnd   = [8]byte{'P', 'D', 'K', 'E', 'N', 'D', 0, 0}
)

// maxExtents bounds the extent map a reader accepts (an ext4 image's data
// runs number in the thousands).
const maxExtents = 1 << 20

// FirstDisk is the object of a sandbox's disk (a group's first
// container's); ContainerDisk and SharedDisk name a group's others.
const FirstDisk = "disk"

// ContainerDisk is the object of the disk of container name (not the
// first) of a sandbox of several.
func ContainerDisk(name string) string { return "container-" + name }

// SharedDisk is the object of shared volume name of a sandbox of several
// containers.
func SharedDisk(name string) string { return "shared-" + name }

// checkObject refuses an object name that is not one of the above with
// a container's or volume's name (api.IsContainerName: a-z, 0-9, '-').
func checkObject(object string) error {
	name, ok := strings.CutPrefix(object, "container-")
	if !ok {
		name, ok = strings.CutPrefix(object, "shared-")
	}
	if object == FirstDisk || (ok && name != "" && len(name) <= 63 && strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") == "") {
		return nil
	}
	return errdefs.Invalid("disk", "%q is not a disk of an archived sandbox", object)
}

// PutDisk streams the disk image at path into object (FirstDisk,
// ContainerDisk, SharedDisk) of sandbox id's archive, compressed, in
// parts, and checks that the store holds all of it.
func (s *Store) PutDisk(ctx context.Context, id, object, path string) (Disk, error) {
	var d Disk
	if err := checkObject(object); err != nil {
		return d, err
	}
	if err := s.ensureBucket(ctx); err != nil {
		return d, err
	}
	f, err := os.Open(path)
	if err != nil {
		return d, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return d, err
	}
	d.Size = fi.Size()
	ex, err := sparse.Extents(f, d.Size)
	if err != nil {
		return d, err
	}
	d.Data = sparse.Bytes(ex)

	pr, pw := io.Pipe()
	sum := sha256.New()
	counted := &counter{}
	go func() {
		pw.CloseWithError(writeDisk(io.MultiWriter(pw, sum, counted), f, d.Size, ex))
	}()
	what := "the disk of " + id
	if object != FirstDisk {
		what = "the " + object + " disk of " + id
	}
	info, err := s.c.PutObject(ctx, s.cfg.Bucket, s.key(id, object), pr, -1, minio.PutObjectOptions{
		ContentType:    "application/octet-stream",
		PartSize:       s.cfg.PartSize,
		NumThreads:     s.cfg.Threads,
		SendContentMd5: true, // the store checks each part
	})
	pr.CloseWithError(errors.New("upload ended")) // ends the writer if the upload failed
	if err != nil {
		return d, s.unavailable("uploading "+what, err)
	}
	d.Bytes, d.SHA256 = counted.n, hex.EncodeToString(sum.Sum(nil))
	if info.Size != d.Bytes {
		return d, s.unavailable("uploading "+what, fmt.Errorf("the store took %d bytes of %d", info.Size, d.Bytes))
	}
	st, err := s.c.StatObject(ctx, s.cfg.Bucket, s.key(id, object), minio.StatObjectOptions{})
	if err != nil {
		return d, s.unavailable("checking "+what, err)
	}
	if st.Size != d.Bytes {
		return d, s.unavailable("checking "+what, fmt.Errorf("the store holds %d bytes of %d", st.Size, d.Bytes))
	}
	return d, nil
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func writeDisk(w io.Writer, f *os.File, size int64, ex []sparse.Extent) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	hdr := make([]byte, 0, 24+16*len(ex))
	hdr = append(hdr, diskMagic[:]...)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(size))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(len(ex)))
	for _, e := range ex {
		hdr = binary.LittleEndian.AppendUint64(hdr, uint64(e.Offset))
		hdr = binary.LittleEndian.AppendUint64(hdr, uint64(e.Length))
	}
	if _, err := bw.Write(hdr); err != nil {
		return err
	}
	for _, e := range ex {
		n, err := io.Copy(bw, io.NewSectionReader(f, e.Offset, e.Length))
		if err != nil {
			return err
		}
		if n != e.Length {
			return fmt.Errorf("the disk image shrank while it was archived")
		}
	}
	if _, err := bw.Write(diskEnd[:]); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// GetDisk writes disk d, object of sandbox id's archive, into dst
// (empty), checking its size and checksum; on any mismatch it says so and
// dst must be thrown away.
func (s *Store) GetDisk(ctx context.Context, id, object string, d Disk, dst *os.File) error {
	if err := checkObject(object); err != nil {
		return err
	}
	what := "disk of " + id
	if object != FirstDisk {
		what = object + " disk of " + id
	}
	obj, err := s.c.GetObject(ctx, s.cfg.Bucket, s.key(id, object), minio.GetObjectOptions{})
	if err != nil {
		return s.unavailable("downloading the "+what, err)
	}
	defer obj.Close()
	sum := sha256.New()
	counted := &counter{}
	src := &tracked{r: obj}
	in := io.TeeReader(io.TeeReader(src, counted), sum)
	err = ReadDisk(in, dst, d.Size)
	if err == nil {
		// Whatever was left unread (past the end mark) counts too.
		_, err = io.Copy(io.Discard, in)
	}
	var pe *os.PathError
	switch {
	case err == nil:
	case minio.ToErrorResponse(src.err).Code == "NoSuchKey":
		return errdefs.New(errdefs.ErrNotFound, "the archived %s is missing from %s", what, s.Endpoint())
	case src.err != nil && src.err != io.EOF:
		return s.unavailable("downloading the "+what, src.err)
	case errors.As(err, &pe):
		return fmt.Errorf("restoring the %s: %w", what, err)
	default:
		return errdefs.New(errdefs.ErrInvalid, "the archived %s is corrupt: %v", what, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); counted.n != d.Bytes || got != d.SHA256 {
		return errdefs.New(errdefs.ErrInvalid, "the archived %s is corrupt: %d bytes with sha256 %s, the record says %d bytes with sha256 %s",
			what, counted.n, got, d.Bytes, d.SHA256)
	}
	return nil
}

type corruptError struct{ msg string }

func (e *corruptError) Error() string { return e.msg }

func corrupt(format string, a ...any) error { return &corruptError{fmt.Sprintf(format, a...)} }

// ReadDisk writes a disk stream (as PutDisk sends it) into dst, holes
// kept, checking that it is whole and that its size is want.
func ReadDisk(r io.Reader, dst *os.File, want int64) error {
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(64<<20))
	if err != nil {
		return err
	}
	defer zr.Close()
	br := bufio.NewReaderSize(zr, 1<<20)
	var hdr [24]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return streamErr(err)
	}
	if [8]byte(hdr[:8]) != diskMagic {
		return corrupt("not a paddock disk stream")
	}
	size := int64(binary.LittleEndian.Uint64(hdr[8:]))
	n := binary.LittleEndian.Uint64(hdr[16:])
	if size != want || size < 0 {
		return corrupt("its size is %d bytes, the record says %d", size, want)
	}
	if n > maxExtents {
		return corrupt("%d extents", n)
	}
	ex := make([]sparse.Extent, n)
	var end int64
	for i := range ex {
		var b [16]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return streamErr(err)
		}
		e := sparse.Extent{Offset: int64(binary.LittleEndian.Uint64(b[:])), Length: int64(binary.LittleEndian.Uint64(b[8:]))}
		if e.Offset < end || e.Length <= 0 || e.Length > size-e.Offset {
			return corrupt("extent %d (%d+%d) is out of order or past the end", i, e.Offset, e.Length)
		}
		end = e.Offset + e.Length
		ex[i] = e
	}
	if err := dst.Truncate(size); err != nil {
		return err
	}
	for _, e := range ex {
		if _, err := io.Copy(io.NewOffsetWriter(dst, e.Offset), io.LimitReader(br, e.Length)); err != nil {
			return streamErr(err)
		}
	}
	// The extents' bytes may have run short: LimitReader stops quietly.
	var mark [8]byte
	if _, err := io.ReadFull(br, mark[:]); err != nil {
		return streamErr(err)
	}
	if mark != diskEnd {
		return corrupt("no end mark where it belongs")
	}
	if _, err := br.ReadByte(); err != io.EOF {
		if err == nil {
			return corrupt("bytes past the end mark")
		}
		return streamErr(err)
	}
	return nil
}

// streamErr is a read of the stream that failed.
func streamErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return corrupt("it ends early")
	}
	return err
}

// tracked keeps the error its reader (the store's answer) returned, to
// tell a store that went away from a stream that is corrupt.
type tracked struct {
	r   io.Reader
	err error
}

func (t *tracked) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}
