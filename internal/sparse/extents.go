//go:build linux || darwin

package sparse

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Extents lists the data extents of f's first size bytes (SEEK_DATA and
// SEEK_HOLE); a file system without them reports the whole file as data.
// f's offset is kept.
func Extents(f *os.File, size int64) ([]Extent, error) {
	fd := int(f.Fd())
	cur, err := unix.Seek(fd, 0, unix.SEEK_CUR)
	if err != nil {
		return nil, &os.PathError{Op: "lseek", Path: f.Name(), Err: err}
	}
	defer unix.Seek(fd, cur, unix.SEEK_SET)
	var ex []Extent
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if errors.Is(err, unix.EINVAL) {
			return []Extent{{0, size}}, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "lseek", Path: f.Name(), Err: err}
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, &os.PathError{Op: "lseek", Path: f.Name(), Err: err}
		}
		hole = min(hole, size)
		ex = append(ex, Extent{data, hole - data})
		off = hole
	}
	return ex, nil
}

// Sparse reports whether the extents leave holes in size bytes.
func Sparse(ex []Extent, size int64) bool { return Bytes(ex) < size }
