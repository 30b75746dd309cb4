package gateway

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/spare"
)

// A removed sandbox's directory is kept for the next sandbox rather than
// deleted (package spare, in Dir/spare): making the three directories and
// the hosts file of each sandbox, and deleting them again, was the
// largest part of the daemon's CPU under churn (issue 21).
//
// What a spare keeps: its three directories and files/hosts, which the
// next sandbox's writeFiles writes over in place (every byte, then the
// file cut to the new length) before anything binds it. Everything else
// (the CA links, the self tree's files, anything a crash left) is
// unlinked before the directory becomes a spare, so no spare holds a
// removed sandbox's CA or self view, and its hosts file names it only
// until the next sandbox writes its own. Only a sandbox whose processes
// are known to have ended (Recycle: its cgroup was removed) gives its
// directory up: none of them can still see the directory, which the
// binds of its self tree and files would otherwise show them as the
// next sandbox's.

// takeSpare renames a spare directory to dir and reports whether it did;
// if not, dir is the caller's to make. A directory there (a sandbox
// attached again) is never replaced.
func (g *Gateway) takeSpare(dir string) bool {
	return g.spares != nil && g.spares.Take(dir)
}

// recycleDir empties the directory of a removed sandbox, whose processes
// have all ended, and keeps it as a spare. It reports false, leaving the
// directory to be deleted, when the spares are full or the directory
// holds what a sandbox's directory does not.
func (g *Gateway) recycleDir(dir string) bool {
	return g.spares != nil && g.spares.Give(dir, emptyDir)
}

// emptyDir unlinks every file of a sandbox's directory but files/hosts.
// A directory other than files and self, or one inside them, fails it:
// the gateway makes none.
func emptyDir(dir string) error {
	for _, sub := range []string{"", "files", "self"} {
		d := filepath.Join(dir, sub)
		ents, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range ents {
			switch {
			case e.IsDir() && sub == "" && (e.Name() == "files" || e.Name() == "self"):
				continue
			case e.IsDir():
				return fmt.Errorf("unexpected directory %s", filepath.Join(d, e.Name()))
			case sub == "files" && e.Name() == "hosts" && e.Type().IsRegular():
				continue
			}
			if err := os.Remove(filepath.Join(d, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// overwrite writes b over the file at path in place: every byte of it,
// then the file cut to len(b), so nothing of what it held stays. Unlike a
// new file it costs no inode; unlike a truncation to nothing first, ext4
// does not write the file back when it is closed (auto_da_alloc). Only
// for a file nothing reads while it is written.
func overwrite(path string, b []byte) error {
	fd, err := spare.OpenOwn(path)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	for done := 0; done < len(b); {
		n, err := unix.Pwrite(fd, b[done:], int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "write", Path: path, Err: err}
		}
		done += n
	}
	if err := unix.Ftruncate(fd, int64(len(b))); err != nil {
		return &os.PathError{Op: "truncate", Path: path, Err: err}
	}
	return nil
}
