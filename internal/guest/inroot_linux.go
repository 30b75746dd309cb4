package guest

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// openInRoot opens path as an O_PATH handle resolved inside root by the
// kernel (openat2 RESOLVE_IN_ROOT): "..", absolute symlinks and
// magic links all stay under root, whatever the sandbox's files say.
func openInRoot(root *os.File, path string) (*os.File, error) {
	return openInRootFlags(root, path, 0)
}

// openInRootFlags is openInRoot with more open flags (O_NOFOLLOW: a last
// element that is a symbolic link is opened itself).
func openInRootFlags(root *os.File, path string, flags int) (*os.File, error) {
	rel := strings.TrimLeft(path, "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(unix.O_PATH | unix.O_CLOEXEC | flags),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// mkdirAllInRoot creates path and its parents inside root and returns a
// handle on it. Existing components are resolved inside root; new ones are
// made one at a time beside a handle on their parent, never through a path
// the sandbox could redirect.
func mkdirAllInRoot(root *os.File, path string, mode uint32) (*os.File, error) {
	if h, err := openInRoot(root, path); err == nil {
		return h, nil
	} else if !errors.Is(err, unix.ENOENT) {
		return nil, err
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	cur, err := openInRoot(root, "/")
	if err != nil {
		return nil, err
	}
	prefix := ""
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			cur.Close()
			return nil, fmt.Errorf("mkdir %s: bad component %q", path, p)
		}
		prefix += "/" + p
		next, err := openInRoot(root, prefix)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(int(cur.Fd()), p, mode); err != nil && !errors.Is(err, unix.EEXIST) {
				cur.Close()
				return nil, &os.PathError{Op: "mkdirat", Path: prefix, Err: err}
			}
			next, err = openInRoot(root, prefix)
		}
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}
