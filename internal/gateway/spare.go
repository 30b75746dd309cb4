package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/spare"
)

// A removed sandbox's directory is kept for the next sandbox rather than
// deleted (package spare, in Dir/spare): making the three directories and
// the hosts file of each sandbox, and deleting them again, was the
// largest part of the daemon's CPU under churn (issue 21).
//
// What a spare keeps: its three directories; files/hosts and
// files/hostname, which the next sandbox's writeFiles writes over in
// place (every byte, then the file cut to the new length) before
// anything binds them; and the self tree's own files, emptied, as the
// next versions the next sandbox's self writes take (swapIn).
// Everything else (the CA links, the links to the self tree's defaults,
// anything a crash left) is unlinked before the directory becomes a
// spare, so no spare holds a removed sandbox's CA or self view, and its
// hosts and hostname files name it only until the next sandbox writes
// its own. Only a sandbox whose processes are known to have ended
// (Recycle: its cgroup was removed) gives its directory up: none of them
// can still see the directory, which the binds of its self tree and
// files would otherwise show them as the next sandbox's.

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

// emptyDir unlinks every file of a sandbox's directory but files/hosts,
// files/hostname and the self tree's own files, which it empties and
// keeps as the directory's next files (swapIn). A directory other than
// files and self, or one inside them, fails it: the gateway makes none.
func emptyDir(dir string) error {
	for _, sub := range []string{"", "files", "self"} {
		d := filepath.Join(dir, sub)
		ents, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range ents {
			name := e.Name()
			switch {
			case e.IsDir() && sub == "" && (name == "files" || name == "self"):
				continue
			case e.IsDir():
				return fmt.Errorf("unexpected directory %s", filepath.Join(d, name))
			case sub == "files" && (name == "hosts" || name == "hostname") && e.Type().IsRegular():
				continue
			case sub == "" && strings.HasPrefix(name, nextPrefix) && spare.Truncate(filepath.Join(d, name)) == nil:
				continue
			case sub == "self" && keepNext(dir, name):
				continue
			}
			if err := os.Remove(filepath.Join(d, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepNext empties the self tree's file name of a sandbox's directory
// and moves it to its next file, unless that is there already or the
// file is not one of its own (a link to the defaults): then it reports
// false, and the file is the caller's to unlink.
func keepNext(dir, name string) bool {
	path := filepath.Join(dir, "self", name)
	if spare.Truncate(path) != nil {
		return false
	}
	return unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, filepath.Join(dir, nextPrefix+name), unix.RENAME_NOREPLACE) == nil
}

// nextPrefix names a self tree file's next version in the sandbox's
// directory, outside the tree that the sandbox sees.
const nextPrefix = ".next-"

// swapIn writes b to the file name of the self tree in dir, which a
// sandbox reads: into the file's next version (dir's parent's
// nextPrefix+name, written over in place, or made), then exchanged with
// the file, so that a reader sees the old content or the new, never a
// mix, and the old becomes the next version. A write made no inode and
// freed none once a sandbox's directory had its next files, nor with a
// recycled directory's (durable.Replace made a temporary file for every
// write, and the removal freed it: 0.1-0.4 ms of CPU each under churn on
// ext4). A reader that keeps the file open across two writes may see the
// second written over the first: the sandbox's own view, a write at most
// every few seconds.
func swapIn(dir, name string, b []byte) error {
	path, next := filepath.Join(dir, name), filepath.Join(filepath.Dir(dir), nextPrefix+name)
	if err := writeNext(next, b); err != nil {
		return err
	}
	err := unix.Renameat2(unix.AT_FDCWD, next, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) {
		err = unix.Renameat2(unix.AT_FDCWD, next, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
	}
	if err != nil {
		return &os.LinkError{Op: "exchange", Old: next, New: path, Err: err}
	}
	return nil
}

// writeNext writes b over the next file at path, a regular file of its
// own, or makes it: what is there that is not (a link to the defaults,
// anything a crash or an older daemon left) is unlinked first.
func writeNext(path string, b []byte) error {
	err := overwrite(path, b)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return &os.PathError{Op: "create", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o644); err != nil { // the sandbox reads it, whatever the umask
		return &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return writeOver(fd, path, b)
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
	return writeOver(fd, path, b)
}

// writeOver writes b from the start of fd, the file at path, and cuts
// the file to len(b).
func writeOver(fd int, path string, b []byte) error {
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
