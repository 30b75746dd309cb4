package guest

import (
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/openat"
)

// fileRootDir is the directory file ops resolve paths under: the
// sandbox's root once the guest has entered it. Tests point it at a
// temporary directory.
var fileRootDir = "/"

// The guest holds host resources (its control socket, the cgroup's OOM
// counter), and /proc/1 is the guest: a file op that followed
// /proc/1/fd/N, /proc/self/root or /proc/1/cwd would act on the host side
// of the sandbox. So every path is resolved by the kernel under a handle
// on the root (openat2 RESOLVE_IN_ROOT: "..", absolute symlinks and
// symlinks to ".." stay inside), magic links are refused
// (RESOLVE_NO_MAGICLINKS; openat.ResolveInRoot), and nothing on procfs is
// touched at all: what it holds that a file op could reach and the
// sandbox's own processes could not is the guest's own state (its
// environment, memory, fd table).

// fsRoot is the handle every path of a file op is resolved under.
type fsRoot struct {
	f *os.File // O_PATH|O_DIRECTORY
	// workdir is what relative paths are resolved against.
	workdir string
}

// openFSRoot opens dir as a root for file ops.
func openFSRoot(dir, workdir string) (*fsRoot, error) {
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the sandbox root: %w", err)
	}
	if workdir == "" {
		workdir = "/"
	}
	return &fsRoot{f: f, workdir: workdir}, nil
}

func (r *fsRoot) Close() error { return r.f.Close() }

func (r *fsRoot) fd() int { return int(r.f.Fd()) }

// clean turns a path argument into a clean absolute path inside the
// sandbox: relative paths are taken from the workdir. The result is only a
// name; resolving it is the kernel's job (under the root).
func (r *fsRoot) clean(field, p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Invalid(field, "must not be empty")
	case strings.IndexByte(p, 0) >= 0:
		return "", errdefs.Invalid(field, "contains a NUL byte")
	case len(p) > openat.MaxPath:
		return "", errdefs.Invalid(field, "longer than %d bytes", openat.MaxPath)
	}
	if !strings.HasPrefix(p, "/") {
		p = r.workdir + "/" + p
	}
	return path.Clean(p), nil
}

// rel is p (clean and absolute) as a path relative to the root handle.
func rootRel(p string) string {
	if p == "/" {
		return "."
	}
	return strings.TrimPrefix(p, "/")
}

// open resolves p (clean, absolute) inside the root, following symbolic
// links the way the kernel does with the root as "/", and opens it with
// flags. What it opens must not be on procfs.
func (r *fsRoot) open(p string, flags int) (*os.File, error) {
	fd, err := openat.Openat2(r.fd(), rootRel(p), &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: openat.ResolveInRoot})
	if err != nil {
		return nil, openat.Error(p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	if err := notProc(f, p); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// parent resolves the directory holding p's last element and returns a
// handle on it with the element's name. The element itself is not
// resolved, so ops on it (create, remove, rename, lstat) act on the name
// and never through a symbolic link there. For "/" it returns the root
// and ".".
func (r *fsRoot) parent(p string) (*os.File, string, error) {
	if p == "/" {
		d, err := r.open("/", unix.O_PATH|unix.O_DIRECTORY)
		return d, ".", err
	}
	dir, base := path.Split(p)
	dir = path.Clean(dir)
	fd, err := openat.Openat2(r.fd(), rootRel(dir), &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: openat.ResolveInRoot})
	if err != nil {
		return nil, "", openat.Error(dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	if err := notProc(d, p); err != nil {
		d.Close()
		return nil, "", err
	}
	return d, base, nil
}

// notProc refuses a handle on procfs.
func notProc(f *os.File, p string) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return openat.Error(p, err)
	}
	if st.Type == unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w: %s: is on /proc, which file operations do not touch (use exec)", errdefs.ErrDenied, p)
	}
	return nil
}

// isPseudoFS reports whether the file system under fd makes up its files'
// sizes (sysfs, cgroupfs and the like), so that a read cannot announce one.
func isPseudoFS(fd int) bool {
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil {
		return true
	}
	switch st.Type {
	case unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC, unix.DEBUGFS_MAGIC,
		unix.SECURITYFS_MAGIC, unix.TRACEFS_MAGIC, unix.BPF_FS_MAGIC:
		return true
	}
	return false
}

// lstatAt describes name in dir without following a symbolic link.
func lstatAt(dir int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// readlinkAt returns a symbolic link's target.
func readlinkAt(dir int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > openat.MaxPath {
			return string(buf[:n]), nil
		}
	}
}

// openChildDir opens the directory name in dir for reading, never
// through a symbolic link (a name swapped for one fails).
func openChildDir(dir int, name string) (*os.File, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// fileType names the type bits of a mode.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return api.TypeFile
	case unix.S_IFDIR:
		return api.TypeDir
	case unix.S_IFLNK:
		return api.TypeSymlink
	}
	return api.TypeOther
}

// fileInfo builds an api.FileInfo from a stat; ids may be nil.
func fileInfo(p string, st *unix.Stat_t, target string, ids *idNames) api.FileInfo {
	name := path.Base(p)
	fi := api.FileInfo{
		Name:       name,
		Path:       p,
		Type:       fileType(st.Mode),
		Size:       st.Size,
		Mode:       api.FileMode(st.Mode & 0o7777),
		UID:        st.Uid,
		GID:        st.Gid,
		ModTime:    timespecTime(st.Mtim),
		LinkTarget: target,
	}
	if ids != nil {
		fi.User = ids.users[st.Uid]
		fi.Group = ids.groups[st.Gid]
	}
	return fi
}

// statPath describes p itself (a symbolic link as a link).
func (r *fsRoot) statPath(p string, ids *idNames) (*api.FileInfo, error) {
	dir, base, err := r.parent(p)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	st, err := lstatAt(int(dir.Fd()), base)
	if err != nil {
		return nil, openat.Error(p, err)
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target, _ = readlinkAt(int(dir.Fd()), base)
	}
	fi := fileInfo(p, &st, target, ids)
	return &fi, nil
}

func timespecTime(ts unix.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }
