// Package durable owns how the daemon's files are written so that a crash
// leaves each whole (the old content or the new, never a mix), how a write
// is made to last past a power loss (the file and its directory synced),
// and the lock that keeps a second process out of a state directory.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TempPrefix starts the name of every temporary file this package makes
// beside the file it writes. A directory's owner sweeps names with it that
// a crash left behind.
const TempPrefix = ".tmp-"

// WriteFile replaces path with data, mode perm: a temporary file in the
// same directory is written, synced and renamed over path, and the
// directory synced. After a crash path holds the old data or the new.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	if err := replace(path, data, perm, true); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// Replace replaces path with data, mode perm, through a temporary file
// and a rename, so that no reader sees it half written; unlike WriteFile
// it syncs nothing. It is for files rewritten often whose last version
// may be lost to a power loss (a view rebuilt every second, a counter
// saved again soon).
func Replace(path string, data []byte, perm fs.FileMode) error {
	return replace(path, data, perm, false)
}

func replace(path string, data []byte, perm fs.FileMode, sync bool) error {
	f, err := os.CreateTemp(filepath.Dir(path), TempPrefix+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Create writes a new file at path (fs.ErrExist if there is one), syncs
// it and its directory. A file it could not write whole is removed.
func Create(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the creates, renames and removes in dir so far last past
// a power loss.
func SyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// Lock is a directory held by one process: an exclusive flock on the
// file "lock" in it, released by Unlock or when the process ends.
type Lock struct {
	f *os.File
}

// LockDir takes dir for this process. Another holder, in this process or
// another, makes it fail with errdefs.ErrUnavailable at once: two daemons
// on one state directory would undo each other's work.
func LockDir(dir string) (*Lock, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is in use by another process", errdefs.ErrUnavailable, dir)
		}
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the directory.
func (l *Lock) Unlock() error {
	return l.f.Close()
}
