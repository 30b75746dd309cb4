// Package rundir keeps the daemon's run dir in memory. The run dir holds
// what lives only as long as the host is up: the sockets of the daemon
// and of every guest, the sandboxes' mount points, their guests' logs.
// On most hosts it is under /run, a tmpfs; where it is on a disk
// filesystem instead, every sandbox's guest socket is an inode made and
// deleted on that disk, and on an ext4 without a journal each such inode
// costs up to a millisecond of CPU under churn (its allocator skips every
// inode freed in the last five seconds, or five minutes while its
// inode-table block is not yet written back, one buffer lookup each). So
// the daemon mounts a tmpfs of its own on a run dir that is on a disk and
// empty.
package rundir

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/mountinfo"
)

// source names the tmpfs in the mount table, so that Unmount takes down
// only the daemon's own and never a tmpfs an operator put there.
const source = "paddock-run"

// Mount mounts a tmpfs of the daemon's own on dir when dir is on a disk
// filesystem and empty. A dir on a tmpfs already (under /run, or mounted
// by an earlier start) is left as it is. A non-empty dir on a disk holds
// the files of a daemon before this one, whose running sandboxes'
// sockets are in it: it is kept, and logged, until an uninstall or a
// reboot empties it.
func Mount(dir string, log *slog.Logger) error {
	// Two daemons started at once on one run dir take turns here: the
	// second finds the first's tmpfs, not an empty disk dir to mount
	// over the first's pid file with a second tmpfs.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	if _, err := d.Readdirnames(1); !errors.Is(err, io.EOF) {
		if err != nil {
			return fmt.Errorf("reading %s: %w", dir, err)
		}
		log.Info("the run dir is on a disk filesystem and holds an earlier daemon's files: kept there (an uninstall or a reboot lets the next start move it to memory)", "dir", dir)
		return nil
	}
	if err := unix.Mount(source, dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0711"); err != nil {
		return fmt.Errorf("mounting a tmpfs on the run dir %s: %w", dir, err)
	}
	// The mounts the daemon makes under it (sandboxes' roots and
	// binds) stay on the host's side: none propagates to a peer.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("making the run dir's tmpfs %s private: %w", dir, err)
	}
	log.Debug("mounted a tmpfs on the run dir", "dir", dir)
	return nil
}

// Unmount takes down the daemon's tmpfs on dir, if dir has one; what is
// mounted under it must be gone already. A dir without one, or gone, is
// no error.
func Unmount(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", dir, err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("resolving %s: %w", dir, err)
	}
	ours, err := mountedOurs(abs)
	if err != nil || !ours {
		return err
	}
	if err := unix.Unmount(abs, unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unmounting the run dir's tmpfs %s: %w", abs, err)
	}
	return nil
}

// mountedOurs reports whether the top mount at dir is the daemon's tmpfs.
func mountedOurs(dir string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("listing mounts: %w", err)
	}
	ours := false
	for line := range strings.SplitSeq(string(b), "\n") {
		// The last line for a mount point is the mount on top.
		if m, ok := mountinfo.Parse(line); ok && m.Point == dir {
			ours = m.FSType == "tmpfs" && m.Source == source
		}
	}
	return ours, nil
}
