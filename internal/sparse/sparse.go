// Package sparse keeps the holes of sparse files when they are copied: it
// finds a file's data extents (SEEK_DATA/SEEK_HOLE), writes a file into a
// tar stream as a GNU PAX sparse entry (format 1.0, which GNU tar, bsdtar
// and Go's archive/tar read) so that only its data travels, and writes a
// stream back with holes where it holds runs of zeros.
package sparse

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"time"
)

// Extent is a run of a file's bytes that holds data.
type Extent struct {
	Offset, Length int64
}

// Bytes is how many bytes the extents hold.
func Bytes(ex []Extent) int64 {
	var n int64
	for _, e := range ex {
		n += e.Length
	}
	return n
}

const block = 512

// WriteTar writes a regular file's entry in GNU tar's PAX sparse format
// 1.0: a PAX header with the GNU.sparse records, a header, the map of the
// data extents and then only their bytes. h says the file's name, mode,
// owner, times and Size (its apparent size); data are its extents, in
// order, within Size. tw must be the writer of w, between entries: the
// entry is written to w directly (Go's tar.Writer writes no sparse files)
// and tw goes on with the next entry. Bytes the file no longer holds
// (it shrank meanwhile) are written as zeros.
func WriteTar(tw *tar.Writer, w io.Writer, h *tar.Header, f io.ReaderAt, data []Extent, buf []byte) error {
	if err := tw.Flush(); err != nil {
		return err
	}
	var m bytes.Buffer
	m.WriteString(strconv.Itoa(len(data)) + "\n")
	for _, e := range data {
		fmt.Fprintf(&m, "%d\n%d\n", e.Offset, e.Length)
	}
	m.Write(make([]byte, pad(int64(m.Len()))))
	size := int64(m.Len()) + Bytes(data)

	recs := map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     h.Name,
		"GNU.sparse.realsize": strconv.FormatInt(h.Size, 10),
		"size":                strconv.FormatInt(size, 10),
		"uid":                 strconv.Itoa(h.Uid),
		"gid":                 strconv.Itoa(h.Gid),
		"mtime":               paxTime(h.ModTime),
	}
	if h.Uname != "" {
		recs["uname"] = h.Uname
	}
	if h.Gname != "" {
		recs["gname"] = h.Gname
	}
	for k, v := range h.PAXRecords {
		if _, ok := recs[k]; !ok {
			recs[k] = v
		}
	}
	var pax bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(recs)) {
		pax.WriteString(paxRecord(k, recs[k]))
	}
	base := path.Base(h.Name)
	if _, err := w.Write(header("PaxHeaders.0/"+base, 'x', 0o644, 0, 0, int64(pax.Len()), h.ModTime)); err != nil {
		return err
	}
	pax.Write(make([]byte, pad(int64(pax.Len()))))
	if _, err := w.Write(pax.Bytes()); err != nil {
		return err
	}
	if _, err := w.Write(header("GNUSparseFile.0/"+base, tar.TypeReg, h.Mode, h.Uid, h.Gid, size, h.ModTime)); err != nil {
		return err
	}
	if _, err := w.Write(m.Bytes()); err != nil {
		return err
	}
	for _, e := range data {
		n, err := io.CopyBuffer(w, io.NewSectionReader(f, e.Offset, e.Length), buf)
		if err != nil {
			return err
		}
		if err := zeros(w, e.Length-n, buf); err != nil {
			return err
		}
	}
	return zeros(w, pad(Bytes(data)), buf)
}

func pad(n int64) int64 { return -n & (block - 1) }

func zeros(w io.Writer, n int64, buf []byte) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		clear(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// header is a ustar header block. Numbers a field cannot hold are left
// zero: the PAX records before it carry them.
func header(name string, typ byte, mode int64, uid, gid int, size int64, mod time.Time) []byte {
	b := make([]byte, block)
	if len(name) > 99 {
		name = name[:99]
	}
	copy(b[0:100], name)
	octal(b[100:108], mode&0o7777)
	octal(b[108:116], int64(uid))
	octal(b[116:124], int64(gid))
	octal(b[124:136], size)
	octal(b[136:148], max(mod.Unix(), 0))
	b[156] = typ
	copy(b[257:265], "ustar\x0000")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	octal(b[148:155], sum)
	b[155] = ' '
	return b
}

// octal writes n in a field as NUL-terminated octal, or leaves it zero
// if it does not fit.
func octal(f []byte, n int64) {
	s := strconv.FormatInt(n, 8)
	if n < 0 || len(s) > len(f)-1 {
		clear(f)
		copy(f, bytes.Repeat([]byte{'0'}, len(f)-1))
		return
	}
	copy(f, fmt.Sprintf("%0*s", len(f)-1, s))
	f[len(f)-1] = 0
}

func paxTime(t time.Time) string {
	if t.Nanosecond() == 0 {
		return strconv.FormatInt(t.Unix(), 10)
	}
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}

// paxRecord formats one record: its length (counting itself), the key
// and the value.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	n += len(strconv.Itoa(n))
	r := strconv.Itoa(n) + " " + k + "=" + v + "\n"
	if len(r) != n {
		r = strconv.Itoa(len(r)) + " " + k + "=" + v + "\n"
	}
	return r
}

// Writer writes a file with holes where what it is given holds runs of
// zeros (a block of 4 KiB at a time): a sparse file copied as a plain
// stream gets its holes back. Close sets the file's size to what was
// written (a file ending in a hole has no bytes there to write).
type Writer struct {
	f   *os.File
	off int64 // bytes written or skipped
}

// NewWriter returns a Writer on f (empty, at offset 0).
func NewWriter(f *os.File) *Writer { return &Writer{f: f} }

const zeroBlock = 4096

var zeroBuf [zeroBlock]byte

func (w *Writer) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		// A run of data blocks is written at once; a zero block is skipped.
		end := done
		for end < len(p) {
			k := min(zeroBlock, len(p)-end)
			if bytes.Equal(p[end:end+k], zeroBuf[:k]) {
				break
			}
			end += k
		}
		if end > done {
			n, err := w.f.WriteAt(p[done:end], w.off)
			w.off += int64(n)
			done += n
			if err != nil {
				return done, err
			}
			continue
		}
		k := min(zeroBlock, len(p)-done)
		w.off += int64(k)
		done += k
	}
	return done, nil
}

// Close sets the file's size; it does not close the file.
func (w *Writer) Close() error { return w.f.Truncate(w.off) }

// Size is how many bytes were written, holes included.
func (w *Writer) Size() int64 { return w.off }
