//go:build linux

// Package openat changes file trees that someone else may be changing at
// the same time (a sandbox's files, a tar's entries): every name is
// resolved by the kernel beneath a directory handle (openat2), nothing
// is written through a symbolic link, and syscall errors become error
// categories that name the path. The guest's file ops and tar extraction
// (on either side of a sandbox) build on it.
package openat

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Resolutions that stay under a handle: "..", absolute symbolic links and
// links to ".." stay inside (ResolveInRoot: the handle is "/"; Beneath:
// leaving it is an error, EXDEV), and magic links (/proc/N/fd/M,
// /proc/self/root) are refused.
const (
	ResolveInRoot  = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	ResolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS
)

// MaxPath bounds a path (PATH_MAX).
const MaxPath = 4096

// Openat2 is unix.Openat2, retrying the EAGAIN the kernel answers when a rename or mount
// raced with a confined resolution.
func Openat2(dirfd int, name string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 64 {
			continue
		}
		return fd, err
	}
}

// NoDescend reports whether a walk (list, tar, recursive watch) must not
// enter the directory fd: procfs and sysfs are kernel interfaces, not
// files.
func NoDescend(fd int) bool {
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil {
		return true
	}
	return st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC
}

// errnos are the errors file operations meet: each one's category, and what
// its message says after the path.
var errnos = map[unix.Errno]struct {
	cat error
	msg string
}{
	unix.ENOENT:       {errdefs.ErrNotFound, "no such file or directory"},
	unix.EEXIST:       {errdefs.ErrConflict, "already exists"},
	unix.ENOTEMPTY:    {errdefs.ErrConflict, "directory not empty"},
	unix.EISDIR:       {errdefs.ErrConflict, "is a directory"},
	unix.ENOTDIR:      {errdefs.ErrConflict, "not a directory"},
	unix.EBUSY:        {errdefs.ErrConflict, "busy (a mount point?)"},
	unix.ETXTBSY:      {errdefs.ErrConflict, "text file busy"},
	unix.EMLINK:       {errdefs.ErrConflict, "too many links"},
	unix.ELOOP:        {errdefs.ErrDenied, "refused: a symbolic link loop, or a /proc magic link (file operations never follow those)"},
	unix.EXDEV:        {errdefs.ErrInvalid, "crosses file systems or leaves the directory it must stay in"},
	unix.EACCES:       {errdefs.ErrDenied, "operation not permitted"},
	unix.EPERM:        {errdefs.ErrDenied, "operation not permitted"},
	unix.EROFS:        {errdefs.ErrDenied, "read-only file system"},
	unix.ENOSPC:       {errdefs.ErrTooLarge, "no space left on the sandbox's disk"},
	unix.EDQUOT:       {errdefs.ErrTooLarge, "no space left on the sandbox's disk"},
	unix.EFBIG:        {errdefs.ErrTooLarge, "file too large"},
	unix.ENAMETOOLONG: {errdefs.ErrInvalid, "name too long"},
	unix.EINVAL:       {errdefs.ErrInvalid, "invalid argument"},
}

// Error turns a syscall error about p into an error category with a
// message that names p.
func Error(p string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if e, ok := errnos[errno]; ok {
			if e.cat == errdefs.ErrInvalid {
				// The path is what is invalid: name the field.
				return errdefs.Invalid("path", "%s: %s", p, e.msg)
			}
			return fmt.Errorf("%w: %s: %s", e.cat, p, e.msg)
		}
	}
	return fmt.Errorf("%s: %w", p, err)
}

// TempName is a name for a file made beside its target and renamed over
// it once complete. Its callers create it with O_EXCL|O_NOFOLLOW, so a
// guessed name can only make a create fail; math/rand/v2's generator
// (ChaCha8, seeded by the runtime from the kernel) serves, and keeps the
// guest, which links this package, free of crypto's packages.
func TempName() string {
	return fmt.Sprintf(".paddock-%016x.tmp", rand.Uint64())
}

// SetOwnerMode chowns (ids of -1 are kept) then chmods an open file; p
// names it in errors.
func SetOwnerMode(fd int, p string, uid, gid int, mode uint32) error {
	if uid >= 0 || gid >= 0 {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return errdefs.Invalid("owner", "%s: uid %d or gid %d does not exist in the sandbox", p, uid, gid)
			}
			return Error(p, err)
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return Error(p, err)
	}
	return nil
}

// Mkdir makes directory name in dir (p names it in errors) and returns
// a handle on it, opened without following a symbolic link there. A new
// directory gets mode and owner (ids of -1 are kept). An existing
// directory is fine unless exclusive is set.
func Mkdir(dir int, name, p string, mode uint32, uid, gid int, exclusive bool) (*os.File, error) {
	err := unix.Mkdirat(dir, name, 0o700)
	created := err == nil
	if err != nil && (exclusive || !errors.Is(err, unix.EEXIST)) {
		return nil, Error(p, err)
	}
	fd, err := Openat2(dir, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: ResolveBeneath | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			// Had the link led to a directory, the caller would have
			// resolved it (inside the root) instead of making it.
			return nil, errdefs.Conflict("%s: is a symbolic link to nothing; directories are not made through it", p)
		}
		if errors.Is(err, unix.ENOTDIR) {
			return nil, errdefs.Conflict("%s: exists and is not a directory", p)
		}
		if errors.Is(err, unix.EXDEV) {
			// A mount point: open it the ordinary way.
			fd, err = unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return nil, Error(p, err)
		}
	}
	f := os.NewFile(uintptr(fd), p)
	if created {
		if err := SetOwnerMode(fd, p, uid, gid, mode); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}
