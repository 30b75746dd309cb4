//go:build linux

// Package untar extracts tar streams that may be hostile (a sandbox's,
// or one sent to a sandbox) into a directory, never writing outside it or
// through a link: the guest's tar uploads and the CLI's copies out of a
// sandbox use it.
package untar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/openat"
	"github.com/paddock-dev/paddock/internal/sparse"
)

// buffers recycles the copy buffers of file entries.
var buffers = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// readerOnly hides a reader's other methods (WriterTo) from io.Copy.
type readerOnly struct{ io.Reader }

// ExtractOptions say how ExtractTar treats what it extracts.
type ExtractOptions struct {
	// Chown gives entries an owner: UID and GID where they are not -1,
	// else the tar header's ids. Without it files belong to the caller.
	Chown    bool
	UID, GID int
	// KeepSetID keeps setuid and setgid bits. Extracting a sandbox's
	// tar on the host must not: it would make set-id programs there.
	KeepSetID bool
	// Rename maps an entry's name (clean and relative) to the name it is
	// extracted as; "" skips the entry. Nil keeps names.
	Rename func(name string) string
	// Cut is the error the archive's reader returns when its data
	// stopped coming (its client went away): it is passed on as it is,
	// not reported as a bad archive.
	Cut error
	// MaxSize caps the bytes of file content the extraction makes, holes
	// included (a sparse entry counts its whole size); 0 is no cap. A
	// sandbox's disk cap bounds what goes in; a copy out to the host has
	// only this.
	MaxSize int64
}

// ExtractStats says what ExtractTar did.
type ExtractStats struct {
	Entries int64 // entries extracted
	Skipped int64 // devices and entry types it does not make
}

// ExtractTar extracts a tar stream into the directory dir (a handle). The
// tar is hostile:
//
//   - names are made relative (a leading "/" is dropped) and a name with a
//     ".." element is refused;
//   - each entry's parent is resolved beneath dir (openat2
//     RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS): a symbolic link, from the
//     tar or already there, that leads out of dir is refused, so nothing
//     is written "through" a link to outside;
//   - the entry itself is made under that parent handle without following
//     anything there (a file is written to a temporary name and renamed
//     over whatever is in the way, a link is never written through);
//   - a hard link's target is resolved beneath dir the same way;
//   - symbolic links are made as they are: their targets are only text,
//     and whatever follows them later resolves them where it runs (file
//     ops in the sandbox, under the sandbox's root);
//   - devices are skipped.
//
// Entries before a refused one stay extracted.
func ExtractTar(dir *os.File, r io.Reader, opts ExtractOptions) (ExtractStats, error) {
	var stats ExtractStats
	x := &extractor{dir: int(dir.Fd()), opts: opts}
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	x.buf = *bp
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return stats, nil
		}
		if err != nil {
			if opts.Cut != nil && errors.Is(err, opts.Cut) {
				return stats, err
			}
			return stats, errdefs.Invalid("tar", "reading the archive after %d entries: %v", stats.Entries, err)
		}
		done, err := x.extract(h, tr)
		if err != nil {
			return stats, err
		}
		if done {
			stats.Entries++
		} else {
			stats.Skipped++
		}
	}
}

type extractor struct {
	dir  int
	opts ExtractOptions
	buf  []byte
	size int64 // bytes of file content made so far
}

// entryName cleans an entry's name: relative, no "." or empty elements;
// "" for the archive's own root ("./"). A ".." element is refused.
func entryName(name string) (string, error) {
	var parts []string
	for _, e := range strings.Split(name, "/") {
		switch e {
		case "", ".":
			continue
		case "..":
			return "", errdefs.Invalid("tar", "entry %q: has a \"..\" element; refused", name)
		}
		parts = append(parts, e)
	}
	n := strings.Join(parts, "/")
	if len(n) > openat.MaxPath {
		return "", errdefs.Invalid("tar", "entry %q: name longer than %d bytes", name[:64]+"...", openat.MaxPath)
	}
	return n, nil
}

// entryError turns a syscall error about a tar entry into a category.
func entryError(name string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV):
		return errdefs.Invalid("tar", "entry %q: leads out of the destination directory (through a symbolic link or a mount); refused", name)
	case errors.Is(err, unix.ELOOP):
		return errdefs.Invalid("tar", "entry %q: goes through a /proc magic link or too many symbolic links; refused", name)
	}
	return openat.Error(fmt.Sprintf("tar entry %q", name), err)
}

// parentOf resolves the directory of entry name beneath the destination,
// creating missing directories (0755), and returns it with the last
// element.
func (x *extractor) parentOf(name string) (*os.File, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: openat.ResolveBeneath}
	fd, err := openat.Openat2(x.dir, dir, how)
	if errors.Is(err, unix.ENOENT) {
		// Make the missing directories one element at a time, each
		// resolved beneath the destination.
		cur := "."
		for _, e := range strings.Split(dir, "/") {
			next := path.Join(cur, e)
			pfd, err := openat.Openat2(x.dir, cur, how)
			if err != nil {
				return nil, "", entryError(name, err)
			}
			err = unix.Mkdirat(pfd, e, 0o755)
			unix.Close(pfd)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return nil, "", entryError(name, err)
			}
			cur = next
		}
		fd, err = openat.Openat2(x.dir, dir, how)
	}
	if err != nil {
		return nil, "", entryError(name, err)
	}
	if openat.NoDescend(fd) {
		unix.Close(fd)
		return nil, "", fmt.Errorf("%w: tar entry %q: inside /proc or /sys; refused", errdefs.ErrDenied, name)
	}
	return os.NewFile(uintptr(fd), dir), base, nil
}

// extract makes one entry; it reports false for an entry it skips.
func (x *extractor) extract(h *tar.Header, tr io.Reader) (bool, error) {
	switch h.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return false, nil
	case tar.TypeChar, tar.TypeBlock:
		return false, nil // a sandbox cannot mknod devices, and a host must not
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return false, nil
	}
	name, err := entryName(h.Name)
	if err != nil {
		return false, err
	}
	if name != "" && x.opts.Rename != nil {
		name = x.opts.Rename(name)
	}
	if name == "" {
		return false, nil // the archive's root: the destination itself
	}
	if h.Typeflag == tar.TypeReg && x.opts.MaxSize > 0 {
		if h.Size > x.opts.MaxSize-x.size {
			return false, fmt.Errorf("%w: tar entry %q: its %d bytes pass the cap of %d bytes on what this copy may write", errdefs.ErrTooLarge, name, h.Size, x.opts.MaxSize)
		}
		x.size += h.Size
	}
	parent, base, err := x.parentOf(name)
	if err != nil {
		return false, err
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	label := fmt.Sprintf("tar entry %q", name)
	mode := uint32(h.Mode) & 0o7777
	if !x.opts.KeepSetID {
		mode &^= unix.S_ISUID | unix.S_ISGID
	}
	uid, gid := -1, -1
	if x.opts.Chown {
		uid, gid = h.Uid, h.Gid
		if x.opts.UID >= 0 {
			uid = x.opts.UID
		}
		if x.opts.GID >= 0 {
			gid = x.opts.GID
		}
	}
	if h.Typeflag == tar.TypeDir {
		d, err := openat.Mkdir(pfd, base, label, mode, -1, -1, false)
		if errors.Is(err, errdefs.ErrConflict) {
			// A file or link is in the way: replace it.
			if uerr := unix.Unlinkat(pfd, base, 0); uerr != nil {
				return false, entryError(name, uerr)
			}
			d, err = openat.Mkdir(pfd, base, label, mode, -1, -1, true)
		}
		if err != nil {
			return false, err
		}
		defer d.Close()
		if openat.NoDescend(int(d.Fd())) {
			return false, nil // a kernel file system's mount point: left alone
		}
		if err := openat.SetOwnerMode(int(d.Fd()), label, uid, gid, mode); err != nil {
			return false, err
		}
		return true, nil
	}
	tmp := openat.TempName()
	switch h.Typeflag {
	case tar.TypeReg:
		err = x.writeFile(pfd, tmp, label, tr, uid, gid, mode)
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.IndexByte(h.Linkname, 0) >= 0 || len(h.Linkname) > openat.MaxPath {
			return false, errdefs.Invalid("tar", "entry %q: bad symbolic link target", name)
		}
		if err = unix.Symlinkat(h.Linkname, pfd, tmp); err == nil && (uid >= 0 || gid >= 0) {
			err = unix.Fchownat(pfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
	case tar.TypeLink:
		err = x.link(pfd, tmp, name, h.Linkname)
	case tar.TypeFifo:
		if err = unix.Mknodat(pfd, tmp, unix.S_IFIFO|0o600, 0); err == nil {
			err = x.fixFifo(pfd, tmp, label, uid, gid, mode)
		}
	}
	if err == nil && h.Typeflag != tar.TypeLink {
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		unix.UtimesNanoAt(pfd, tmp, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err == nil {
		// Whatever is in the way (a file, a link, an empty directory) is
		// replaced; nothing is written through it.
		err = unix.Renameat(pfd, tmp, pfd, base)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			if unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR) == nil {
				err = unix.Renameat(pfd, tmp, pfd, base)
			}
		}
		if err == nil {
			// A hard link to the entry's own name renames nothing and
			// leaves the temporary name.
			unix.Unlinkat(pfd, tmp, 0)
		}
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		var cat error
		if errors.As(err, new(unix.Errno)) {
			cat = entryError(name, err)
		} else {
			cat = err
		}
		return false, cat
	}
	return true, nil
}

func (x *extractor) writeFile(pfd int, tmp, label string, tr io.Reader, uid, gid int, mode uint32) error {
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), label)
	defer f.Close()
	// Runs of zeros (a sparse entry's holes among them) become holes.
	sw := sparse.NewWriter(f)
	_, err = io.CopyBuffer(sw, readerOnly{tr}, x.buf)
	if err == nil {
		err = sw.Close()
	}
	if err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return err
		}
		if x.opts.Cut != nil && errors.Is(err, x.opts.Cut) {
			return err
		}
		return errdefs.Invalid("tar", "%s: %v", label, err)
	}
	if err := openat.SetOwnerMode(fd, label, uid, gid, mode); err != nil {
		return err
	}
	return nil
}

// fixFifo sets a new fifo's owner and mode through a descriptor opened
// without following a link (a name can be swapped under us; chmod by name
// would follow what it was swapped for).
func (x *extractor) fixFifo(pfd int, tmp, label string, uid, gid int, mode uint32) error {
	fd, err := unix.Openat(pfd, tmp, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return errdefs.Conflict("%s: replaced while it was being made", label)
	}
	return openat.SetOwnerMode(fd, label, uid, gid, mode)
}

// link makes a hard link at tmp to the entry target, resolved beneath the
// destination.
func (x *extractor) link(pfd int, tmp, name, target string) error {
	t, err := entryName(target)
	if err != nil || t == "" {
		return errdefs.Invalid("tar", "entry %q: hard link to %q: not a file in the archive", name, target)
	}
	if x.opts.Rename != nil {
		if t = x.opts.Rename(t); t == "" {
			return errdefs.Invalid("tar", "entry %q: hard link to %q, which is not extracted", name, target)
		}
	}
	tdir, tbase := path.Split(t)
	tdir = strings.TrimSuffix(tdir, "/")
	if tdir == "" {
		tdir = "."
	}
	fd, err := openat.Openat2(x.dir, tdir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: openat.ResolveBeneath})
	if errors.Is(err, unix.ENOENT) {
		return errdefs.Invalid("tar", "entry %q: hard link to %q, which does not exist in the destination", name, target)
	}
	if err != nil {
		return entryError(name, err)
	}
	defer unix.Close(fd)
	// Without AT_SYMLINK_FOLLOW a link at the target is linked itself,
	// never what it points at.
	if err := unix.Linkat(fd, tbase, pfd, tmp, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return errdefs.Invalid("tar", "entry %q: hard link to %q, which does not exist in the destination", name, target)
		}
		return entryError(name, err)
	}
	return nil
}
