package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// Extract fills the directory snapshot p: from full, a capture of a whole
// sandbox disk (upper/ and work/ of its overlay), and layers, the read-only
// layers of its image top-most first, it copies the merged content of
// directory dir (absolute, clean) into a new volume-format image of size
// bytes at p.Path.
//
// The capture's files were written by the sandbox, so nothing in it is
// trusted: every path is opened component by component without following
// symlinks, and the merged view is a read-only overlay mounted nodev and
// nosuid in a private directory.
func (s *Store) Extract(ctx context.Context, p *Pending, full string, layers []string, dir string, size int64) error {
	rel := strings.TrimPrefix(dir, "/")
	if rel == "" {
		return errdefs.Invalid("path", "a directory snapshot needs a directory below /")
	}
	capID, outID := "cap-"+strings.TrimPrefix(p.ID, Prefix), "out-"+strings.TrimPrefix(p.ID, Prefix)
	capVol, err := s.cfg.Mounts.AcquireFrom(ctx, capID, full, 0, 0)
	if err != nil {
		return fmt.Errorf("attaching capture: %w", err)
	}
	defer s.cfg.Mounts.Remove(context.Background(), capID)
	outVol, err := s.cfg.Mounts.Acquire(ctx, outID, size, 0, 0)
	if err != nil {
		return fmt.Errorf("making directory snapshot filesystem: %w", err)
	}
	defer s.cfg.Mounts.Remove(context.Background(), outID)
	data := filepath.Join(outVol.Path, DataDir)
	if err := os.Mkdir(data, 0o755); err != nil {
		return err
	}

	// Sources, top-most first: the sandbox's writable layer, then the
	// image. A source where dir is opaque, a whiteout or not a directory
	// hides everything below it.
	sources := append([]string{filepath.Join(capVol.Path, "upper")}, layers...)
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, src := range sources {
		fd, hides, err := openLayerDir(src, rel)
		if err != nil {
			return err
		}
		if fd >= 0 {
			fds = append(fds, fd)
		}
		if hides {
			break
		}
	}
	if len(fds) == 0 {
		return errdefs.Invalid("path", "%s is not a directory in the sandbox (or lies on a read-only host bind)", dir)
	}
	// Overlay wants two lower layers without an upper one.
	empty, err := os.MkdirTemp("", "paddock-empty-")
	if err != nil {
		return err
	}
	defer os.Remove(empty)
	merged, err := os.MkdirTemp("", "paddock-merged-")
	if err != nil {
		return err
	}
	defer os.Remove(merged)
	lowers := make([]string, 0, len(fds)+1)
	for _, fd := range fds {
		lowers = append(lowers, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	lowers = append(lowers, empty)
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",userxattr"
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mounting the merged view of %s: %w", dir, err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	if err := s.checkRoom(merged, data); err != nil {
		return err
	}
	if err := copyTree(ctx, merged, data); err != nil {
		return err
	}
	if err := syncfs(outVol.Path); err != nil {
		return err
	}
	img, err := s.cfg.Mounts.ImagePath(outID)
	if err != nil {
		return err
	}
	if err := disk.Clone(img, p.Path); err != nil {
		return fmt.Errorf("storing directory snapshot: %w", err)
	}
	return nil
}

// checkRoom fails with ErrNoSpace unless the files under src fit both in
// the new filesystem at dst and on the storage beneath it. Checking first
// matters: the new filesystem is a sparse image, and an image that cannot
// grow gives I/O errors rather than a clean "no space".
func (s *Store) checkRoom(src, dst string) error {
	need, err := treeBytes(src)
	if err != nil {
		return err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dst, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dst, err)
	}
	if room := int64(fs.Bavail) * fs.Bsize; need > room {
		return errdefs.New(errdefs.ErrNoSpace, "the directory holds %d MiB; the snapshot's filesystem has room for %d MiB", need>>20, room>>20)
	}
	if err := unix.Statfs(s.cfg.Dir, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", s.cfg.Dir, err)
	}
	// The copy is written twice at worst (a temporary filesystem, then
	// its image), plus the filesystem's metadata.
	if room := int64(fs.Bavail) * fs.Bsize; need+need/8+(64<<20) > room {
		return errdefs.New(errdefs.ErrNoSpace, "the directory holds %d MiB; the host's snapshot storage has %d MiB free", need>>20, room>>20)
	}
	return nil
}

// treeBytes is the space the files under root take, hard links counted
// once.
func treeBytes(root string) (int64, error) {
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var total int64
	err := filepath.WalkDir(root, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := ino{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measuring the directory: %w", err)
	}
	return total, nil
}

// copyTree copies src's content into dst (an empty directory) keeping
// owners, modes, times, hard links, symlinks and extended attributes.
func copyTree(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", "--no-dereference", "--", src+"/.", dst+"/")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
		if strings.Contains(msg, "No space left") {
			return errdefs.New(errdefs.ErrNoSpace, "the directory does not fit in the snapshot: %s", msg)
		}
		return fmt.Errorf("copying files: %v: %s", err, msg)
	}
	return nil
}

// openLayerDir opens rel under the layer directory root without following
// symlinks. It returns -1 when rel is absent there, and hides when this
// layer hides the layers below it: rel or a parent is opaque, a whiteout,
// or not a directory.
func openLayerDir(root, rel string) (fd int, hides bool, err error) {
	cur, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, false, nil
		}
		return -1, false, fmt.Errorf("opening layer %s: %w", root, err)
	}
	for _, name := range strings.Split(rel, "/") {
		if name == "" || name == "." || name == ".." {
			// The caller passes a clean path; one that is not could
			// walk out of the layer (".." is a directory too).
			unix.Close(cur)
			return -1, false, errdefs.Invalid("path", "%q is not a clean path below /", "/"+rel)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(cur, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Close(cur)
			if errors.Is(err, unix.ENOENT) {
				return -1, hides, nil
			}
			return -1, false, fmt.Errorf("looking up %s in %s: %w", name, root, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// A whiteout (0/0 char device), a file or a symlink: lower
			// layers' directory is hidden, and this one has none.
			unix.Close(cur)
			return -1, true, nil
		}
		next, err := unix.Openat(cur, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return -1, false, fmt.Errorf("opening %s in %s: %w", name, root, err)
		}
		cur = next
		if opaque(cur) {
			hides = true
		}
	}
	return cur, hides, nil
}

func syncfs(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// opaque reports whether the directory open at fd is marked opaque for
// overlayfs (userxattr or trusted namespace).
func opaque(fd int) bool {
	buf := make([]byte, 8)
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		if n, err := unix.Getxattr(p, name, buf); err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}
