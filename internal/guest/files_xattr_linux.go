package guest

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/openat"
)

// Extended attributes a file request may set or read: user.* only, the
// namespace a sandbox's own processes use (setfattr -n user.x), so that
// what a client writes and what the sandbox writes are one set. trusted.*
// and security.* stay out of reach; user.overlay.* is overlayfs's own.

// xattrPrefix is the namespace requests are confined to.
const xattrPrefix = "user."

// Bounds of what one request sets: the kernel's own limits are 255-byte
// names and 64 KiB values, and an ext4 inode's xattrs share one block.
const (
	maxXattrName   = 255
	maxXattrValue  = 4096
	maxXattrsSet   = 64
	maxXattrListSz = 64 << 10
)

// checkXattrArgs refuses xattr names and prefixes outside user.*.
func checkXattrArgs(fr *guestapi.FileRequest) error {
	if fr.XattrPrefix != "" && !strings.HasPrefix(fr.XattrPrefix, xattrPrefix) {
		return errdefs.Invalid("xattr_prefix", "%q is not under %s", fr.XattrPrefix, xattrPrefix)
	}
	if len(fr.Xattrs) > maxXattrsSet {
		return errdefs.Invalid("xattrs", "%d attributes, at most %d", len(fr.Xattrs), maxXattrsSet)
	}
	for name, v := range fr.Xattrs {
		switch {
		case !strings.HasPrefix(name, xattrPrefix) || len(name) == len(xattrPrefix):
			return errdefs.Invalid("xattrs", "%q is not a name under %s", name, xattrPrefix)
		case strings.HasPrefix(name, "user.overlay."):
			return errdefs.Invalid("xattrs", "%q is overlayfs's", name)
		case len(name) > maxXattrName || strings.ContainsRune(name, 0):
			return errdefs.Invalid("xattrs", "name %.40q... is too long or holds a NUL", name)
		case len(v) > maxXattrValue:
			return errdefs.Invalid("xattrs", "the value of %q is over %d bytes", name, maxXattrValue)
		}
	}
	return nil
}

// setXattrs gives the open file fd the attributes x.
func setXattrs(fd int, p string, x map[string]string) error {
	for name, v := range x {
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			return openat.Error(p, err)
		}
	}
	return nil
}

// addXattrs fills fi.Xattrs with the attributes of name in dir (a
// regular file or a directory, as fi says) whose names start with prefix.
// The file is opened without following a link and without blocking (it
// may have been swapped for a fifo), as a handle is what fgetxattr needs.
// A file that is gone or whose filesystem keeps no xattrs has none.
func addXattrs(fi *api.FileInfo, dir int, name, prefix string) {
	if prefix == "" || fi.Type != api.TypeFile && fi.Type != api.TypeDir {
		return
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	fi.Xattrs = readXattrs(fd, prefix)
}

// readXattrs returns fd's attributes whose names start with prefix; nil
// when there are none.
func readXattrs(fd int, prefix string) map[string]string {
	names := make([]byte, 1024)
	for {
		n, err := unix.Flistxattr(fd, names)
		if errors.Is(err, unix.ERANGE) && len(names) < maxXattrListSz {
			names = make([]byte, len(names)*4)
			continue
		}
		if err != nil {
			return nil
		}
		names = names[:n]
		break
	}
	var out map[string]string
	val := make([]byte, 256)
	for _, name := range strings.Split(string(names), "\x00") {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		n, err := unix.Fgetxattr(fd, name, val)
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Fgetxattr(fd, name, nil); err == nil && n <= 64<<10 {
				val = make([]byte, n)
				n, err = unix.Fgetxattr(fd, name, val)
			}
		}
		if err != nil {
			continue // removed meanwhile, or grown past the bound
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = string(val[:n])
	}
	return out
}

// statXattrs is statPath with the attributes under prefix.
func (r *fsRoot) statXattrs(p string, ids *idNames, prefix string) (*api.FileInfo, error) {
	fi, err := r.statPath(p, ids)
	if err != nil || prefix == "" {
		return fi, err
	}
	dir, base, err := r.parent(p)
	if err != nil {
		return fi, nil
	}
	defer dir.Close()
	addXattrs(fi, int(dir.Fd()), base, prefix)
	return fi, nil
}
