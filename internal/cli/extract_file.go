package cli

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// extractFile unpacks a tar that holds one regular file into dir: the
// client-only build's extraction, which has no openat2 to keep a
// directory's entries inside dir, so it takes a single file whose
// (renamed) name is one plain path element, and nothing else.
func extractFile(dir *os.File, r io.Reader, archive bool, rename func(string) string, limit int64) error {
	tr := tar.NewReader(r)
	h, err := tr.Next()
	if err != nil {
		return fmt.Errorf("reading the copy: %w", err)
	}
	name := strings.TrimSuffix(h.Name, "/")
	if rename != nil {
		name = rename(name)
	}
	if h.Typeflag != tar.TypeReg {
		return errdefs.New(errdefs.ErrUnavailable, "copying a directory or a special file out of a sandbox needs Linux (its tar is unpacked with openat2); this build copies regular files")
	}
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return errdefs.Invalid("tar", "entry %q is not a plain file name", name)
	}
	if limit > 0 && h.Size > limit {
		return fmt.Errorf("%w: %q is %d bytes, over the cap of %d bytes on what this copy may write", errdefs.ErrTooLarge, name, h.Size, limit)
	}
	f, err := os.CreateTemp(dir.Name(), "."+name+".paddock-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = io.CopyN(f, tr, h.Size)
	if err == nil {
		err = f.Chmod(os.FileMode(h.Mode & 0o777))
	}
	if err == nil && archive {
		err = f.Chown(h.Uid, h.Gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		return errdefs.Invalid("tar", "the copy of one file holds more than one entry (%v)", err)
	}
	return os.Rename(f.Name(), filepath.Join(dir.Name(), name))
}
