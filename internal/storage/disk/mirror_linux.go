package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A mirror is a file-by-file copy of one volume's tree into another, for
// a volume made from a seed (seed_linux.go). It keeps what a clone of the
// image keeps and a sandbox can see: every kind of file (whiteouts and
// other device nodes, FIFOs, sockets and symbolic links as themselves),
// owners, modes with their setuid, setgid and sticky bits, extended
// attributes (overlayfs's own, capabilities, ACLs), hard links, holes,
// access and modification times, and the inode flags a user can set. Inode
// numbers and change times are the new filesystem's.
//
// The source was written by a sandbox: nothing is followed. Every name is
// taken from a directory open by descriptor, every call is relative to
// one (or to /proc/self/fd for a symbolic link's attributes), symbolic
// links are read, never opened, and device nodes are never opened. The
// walk is bounded in depth, entries and bytes; past a bound it fails and
// the caller falls back to a clone.

const (
	// mirrorMaxDepth bounds the directories open at once.
	mirrorMaxDepth = 128
	// mirrorBuf is the buffer file data goes through.
	mirrorBuf = 64 << 10
)

// Inode flags (linux/fs.h), which FS_IOC_GETFLAGS and FS_IOC_SETFLAGS
// read and write as an int.
const (
	flSync        = 0x8
	flImmutable   = 0x10
	flAppend      = 0x20
	flNodump      = 0x40
	flNoatime     = 0x80
	flEncrypt     = 0x800
	flDirsync     = 0x10000
	flTopdir      = 0x20000
	flVerity      = 0x100000
	flDax         = 0x2000000
	flProjinherit = 0x20000000
	flCasefold    = 0x40000000

	// flagsKept are the flags a mirror copies: those a file's owner (or
	// root) sets with chattr. Others are the filesystem's own (extents,
	// an indexed directory, inline data).
	flagsKept = flSync | flImmutable | flAppend | flNodump | flNoatime | flDirsync | flTopdir | flProjinherit
	// flagsRefused are flags a mirror cannot make the same: an encrypted,
	// verity or case-folded tree, or a direct-access file.
	flagsRefused = flEncrypt | flVerity | flCasefold | flDax
)

// errMirrorBounds reports a tree past a mirror's bounds.
var errMirrorBounds = errors.New("tree too large to mirror")

// mirrorError names the entry a mirror failed at, below its root.
type mirrorError struct {
	path string
	err  error
}

func (e *mirrorError) Error() string { return e.path + ": " + e.err.Error() }
func (e *mirrorError) Unwrap() error { return e.err }

// mirror copies the entries of the directory src into the empty directory
// dst, both open (O_DIRECTORY), except those named in skip at the top. It
// copies at most maxInodes files and maxBytes bytes of data.
type mirror struct {
	ctx       context.Context
	inodes    int
	bytes     int64
	maxInodes int
	maxBytes  int64
	buf       []byte
	xbuf      []byte // attribute names
	// links maps a multiply-linked source inode to its first copy's path
	// below the destination's root.
	links map[[2]uint64]string
	root  int // the destination's root
}

// mirrorTree copies src's entries into dst (both paths of directories),
// skipping the top-level names in skip.
func mirrorTree(ctx context.Context, src, dst string, skip map[string]bool, maxInodes int, maxBytes int64) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", src, err)
	}
	defer unix.Close(sfd)
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dst, err)
	}
	defer unix.Close(dfd)
	m := &mirror{ctx: ctx, maxInodes: maxInodes, maxBytes: maxBytes, links: map[[2]uint64]string{}, root: dfd}
	return m.dir(sfd, dfd, "", skip, 0)
}

// dir copies the entries of the directory open at sfd into the one open
// at dfd, whose path below the destination's root is rel.
func (m *mirror) dir(sfd, dfd int, rel string, skip map[string]bool, depth int) error {
	if depth >= mirrorMaxDepth {
		return fmt.Errorf("%w: deeper than %d directories", errMirrorBounds, mirrorMaxDepth)
	}
	dup, err := unix.Openat(sfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	list := os.NewFile(uintptr(dup), "dir")
	defer list.Close()
	// In batches: the entry bound, not the directory's size, bounds what
	// is held (a file may have tens of thousands of names).
	for {
		names, err := list.Readdirnames(64)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, name := range names {
			if skip[name] {
				continue
			}
			if err := m.ctx.Err(); err != nil {
				return err
			}
			if err := m.entry(sfd, dfd, name, rel, depth); err != nil {
				var inner *mirrorError
				if errors.As(err, &inner) {
					return err // named where it happened, below
				}
				return &mirrorError{path: join(rel, name), err: err}
			}
		}
	}
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// entry copies one entry, name in the directory open at sfd, into the one
// open at dfd.
func (m *mirror) entry(sfd, dfd int, name, rel string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if m.inodes++; m.inodes > m.maxInodes {
		return fmt.Errorf("%w: more than %d files", errMirrorBounds, m.maxInodes)
	}
	path := join(rel, name)
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := m.links[key]; ok {
			return unix.Linkat(m.root, first, dfd, name, 0)
		}
		m.links[key] = path
	}
	perm := uint32(st.Mode &^ unix.S_IFMT)
	switch kind {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return err
		}
		s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		d, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(d)
		if err := m.dir(s, d, path, nil, depth+1); err != nil {
			return err
		}
		return m.finish(s, d, &st, perm)
	case unix.S_IFREG:
		s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		d, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(d)
		if err := m.data(s, d, st.Size); err != nil {
			return err
		}
		return m.finish(s, d, &st, perm)
	case unix.S_IFLNK:
		target, err := readlinkat(sfd, name, st.Size)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown file type %#o", kind)
	}
	// What cannot be opened safely is finished by name.
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if kind != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, perm, 0); err != nil {
			return err
		}
	}
	if err := m.copyXattrs(linkXattrs(fdPath(sfd, name), fdPath(dfd, name))); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, name, times(&st), unix.AT_SYMLINK_NOFOLLOW)
}

// finish gives the copy open at d the owner, mode, attributes, flags and
// times of the source open at s (st).
func (m *mirror) finish(s, d int, st *unix.Stat_t, perm uint32) error {
	if err := unix.Fchown(d, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	// After the owner: chown clears setuid and setgid bits.
	if err := unix.Fchmod(d, perm); err != nil {
		return err
	}
	// After the owner too: chown drops security.capability.
	if err := m.copyXattrs(fdXattrs(s, d)); err != nil {
		return err
	}
	// Before the flags: an immutable or append-only file takes no new
	// times; after every write into it.
	if err := futimens(d, times(st)); err != nil {
		return err
	}
	flags, err := unix.IoctlGetInt(s, unix.FS_IOC_GETFLAGS)
	if err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		return fmt.Errorf("reading inode flags: %w", err)
	}
	if flags&flagsRefused != 0 {
		return fmt.Errorf("inode flags %#x cannot be mirrored", flags&flagsRefused)
	}
	if kept := flags & flagsKept; kept != 0 {
		cur, err := unix.IoctlGetInt(d, unix.FS_IOC_GETFLAGS)
		if err != nil {
			return fmt.Errorf("reading inode flags: %w", err)
		}
		if err := unix.IoctlSetPointerInt(d, unix.FS_IOC_SETFLAGS, cur|kept); err != nil {
			return fmt.Errorf("setting inode flags: %w", err)
		}
	}
	return nil
}

// data copies a regular file's size bytes, leaving its holes as holes.
func (m *mirror) data(s, d int, size int64) error {
	if size == 0 {
		return nil
	}
	if err := unix.Ftruncate(d, size); err != nil {
		return err
	}
	if m.buf == nil {
		m.buf = make([]byte, mirrorBuf)
	}
	// Not copy_file_range: the two files are on two filesystems.
	c := copier{ctx: m.ctx, dst: d, src: s, buf: m.buf, before: func(n int64) error {
		if m.bytes += n; m.bytes > m.maxBytes {
			return fmt.Errorf("%w: more than %d bytes", errMirrorBounds, m.maxBytes)
		}
		return nil
	}}
	return c.extents(size)
}

// readlinkat reads the target of the symbolic link name in the directory
// open at dirfd, size bytes long by its lstat.
func readlinkat(dirfd int, name string, size int64) (string, error) {
	buf := make([]byte, max(size, 0)+1)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", errors.New("the link changed while read")
	}
	return string(buf[:n]), nil
}

// fdPath names the file name in the directory open at fd through
// /proc/self/fd: a path whose only component after the descriptor is
// one name, which the l*xattr calls never follow when it is a link.
func fdPath(fd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
}

// xattrOps read a source's extended attributes and write a copy's.
type xattrOps struct {
	list func(dest []byte) (int, error)
	get  func(name string, dest []byte) (int, error)
	set  func(name string, val []byte) error
}

// fdXattrs are the attributes of the files open at s and d: no path is
// resolved (through /proc, that cost more than the copy of a small
// file).
func fdXattrs(s, d int) xattrOps {
	return xattrOps{
		list: func(dest []byte) (int, error) { return unix.Flistxattr(s, dest) },
		get:  func(name string, dest []byte) (int, error) { return unix.Fgetxattr(s, name, dest) },
		set:  func(name string, val []byte) error { return unix.Fsetxattr(d, name, val, 0) },
	}
}

// linkXattrs are those of files that are not opened (links, devices,
// FIFOs, sockets), by path, never following a final link.
func linkXattrs(src, dst string) xattrOps {
	return xattrOps{
		list: func(dest []byte) (int, error) { return unix.Llistxattr(src, dest) },
		get:  func(name string, dest []byte) (int, error) { return unix.Lgetxattr(src, name, dest) },
		set:  func(name string, val []byte) error { return unix.Lsetxattr(dst, name, val, 0) },
	}
}

// copyXattrs copies every extended attribute x lists. Most files have
// none: one call finds that out.
func (m *mirror) copyXattrs(x xattrOps) error {
	if m.xbuf == nil {
		m.xbuf = make([]byte, 4096)
	}
	n, err := x.list(m.xbuf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = x.list(nil); err == nil {
			m.xbuf = make([]byte, n)
			n, err = x.list(m.xbuf)
		}
	}
	if err != nil || n == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return err
	}
	for _, name := range splitNul(m.xbuf[:n]) {
		size, err := x.get(name, nil)
		if err != nil {
			return fmt.Errorf("reading attribute %s: %w", name, err)
		}
		val := make([]byte, size)
		if size, err = x.get(name, val); err != nil {
			return fmt.Errorf("reading attribute %s: %w", name, err)
		}
		if err := x.set(name, val[:size]); err != nil {
			return fmt.Errorf("writing attribute %s: %w", name, err)
		}
	}
	return nil
}

// futimens sets the times of the file open at fd (utimensat with no
// path, as libc's futimens does).
func futimens(fd int, ts []unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			out = append(out, string(b[:i]))
		}
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}

func times(st *unix.Stat_t) []unix.Timespec {
	return []unix.Timespec{st.Atim, st.Mtim}
}
