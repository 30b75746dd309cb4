package guest

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/openat"
	"github.com/paddock-dev/paddock/internal/sparse"
)

// tarSource writes a file or a directory tree of the sandbox as a tar
// stream. Entry names start with the path's last element ("proj/",
// "proj/main.go"; "." for the root), as `tar -C parent -c name` would.
// It does not follow symbolic links (they are stored as links), does not
// enter /proc or /sys, and leaves out devices and sockets.
type tarSource struct {
	r       *fsRoot
	p       string
	dir     *os.File
	base    string
	ids     *idNames
	w       io.Writer // under tw, for sparse entries
	tw      *tar.Writer
	links   map[[2]uint64]string
	buf     []byte
	entries int64
}

func (r *fsRoot) newTarSource(p string) (*tarSource, error) {
	dir, base, err := r.parent(p)
	if err != nil {
		return nil, err
	}
	if _, err := lstatAt(int(dir.Fd()), base); err != nil {
		dir.Close()
		return nil, openat.Error(p, err)
	}
	return &tarSource{r: r, p: p, dir: dir, base: base, ids: r.ids(), links: map[[2]uint64]string{}}, nil
}

func (t *tarSource) Close() error { return t.dir.Close() }

func (t *tarSource) write(w io.Writer) error {
	bp := fileChunks.Get().(*[]byte)
	defer fileChunks.Put(bp)
	t.buf = *bp
	t.w, t.tw = w, tar.NewWriter(w)
	name := path.Base(t.p)
	if t.p == "/" {
		name = "."
	}
	st, err := lstatAt(int(t.dir.Fd()), t.base)
	if err != nil {
		return openat.Error(t.p, err)
	}
	if err := t.entry(int(t.dir.Fd()), t.base, t.p, name, &st); err != nil {
		return err
	}
	return t.tw.Close()
}

func (t *tarSource) header(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		Uname:   t.ids.users[st.Uid],
		Gname:   t.ids.groups[st.Gid],
		ModTime: timespecTime(st.Mtim),
		Format:  tar.FormatPAX,
	}
}

// entry writes name (in dir; p inside the sandbox) and, for a directory,
// what it holds.
func (t *tarSource) entry(dir int, name, p, tarName string, st *unix.Stat_t) error {
	h := t.header(tarName, st)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
		h.Name += "/"
		if err := t.tw.WriteHeader(h); err != nil {
			return err
		}
		t.entries++
		sub, err := openChildDir(dir, name)
		if err != nil {
			return nil // removed or swapped meanwhile
		}
		defer sub.Close()
		if openat.NoDescend(int(sub.Fd())) {
			return nil
		}
		names, err := sub.Readdirnames(-1)
		if err != nil {
			return openat.Error(p, err)
		}
		sort.Strings(names)
		for _, n := range names {
			cst, err := lstatAt(int(sub.Fd()), n)
			if err != nil {
				continue
			}
			if err := t.entry(int(sub.Fd()), n, path.Join(p, n), tarName+"/"+n, &cst); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFLNK:
		target, err := readlinkAt(dir, name)
		if err != nil {
			return nil
		}
		h.Typeflag = tar.TypeSymlink
		h.Linkname = target
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if st.Nlink > 1 {
			if first, ok := t.links[key]; ok {
				h.Typeflag = tar.TypeLink
				h.Linkname = first
				break
			}
			t.links[key] = tarName
		}
		return t.file(dir, name, p, h, st)
	default:
		return nil // devices and sockets
	}
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	t.entries++
	return nil
}

// file writes a regular file's header and exactly st.Size bytes: a file
// that shrinks meanwhile is padded with zeros, one that grows is cut.
func (t *tarSource) file(dir int, name, p string, h *tar.Header, st *unix.Stat_t) error {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // removed or swapped meanwhile
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var fst unix.Stat_t
	if unix.Fstat(fd, &fst) != nil || fst.Ino != st.Ino || fst.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	h.Typeflag = tar.TypeReg
	h.Size = st.Size
	// A file with holes goes as a sparse entry: only its data travels.
	if ex, err := sparse.Extents(f, st.Size); err == nil && sparse.Sparse(ex, st.Size) {
		t.entries++
		if err := sparse.WriteTar(t.tw, t.w, h, f, ex, t.buf); err != nil {
			if _, ok := err.(*os.PathError); ok {
				return openat.Error(p, err)
			}
			return err
		}
		return nil
	}
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	t.entries++
	n, err := io.CopyBuffer(t.tw, io.LimitReader(fileReaderOnly{f}, st.Size), t.buf)
	if err != nil {
		if errors.Is(err, tar.ErrWriteTooLong) {
			return nil
		}
		if _, ok := err.(*os.PathError); ok {
			return openat.Error(p, err)
		}
		return err
	}
	for n < st.Size {
		k := min(int64(len(t.buf)), st.Size-n)
		clear(t.buf[:k])
		if _, err := t.tw.Write(t.buf[:k]); err != nil {
			return err
		}
		n += k
	}
	return nil
}

// fileReaderOnly hides a reader's other methods (WriterTo) from io.Copy.
type fileReaderOnly struct{ io.Reader }
