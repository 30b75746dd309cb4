package disk

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// UnmountAll unmounts everything mounted strictly below dir, deepest
// first, for uninstalls: nothing may use those mounts any more (the
// sandboxes are gone). The substrate on dir itself stays; Unmount takes it
// down afterwards.
func UnmountAll(dir string) error {
	mounts, err := mountpointsUnder(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return err
	}
	// Deeper mounts sort after the ones they sit on.
	slices.Sort(mounts)
	slices.Reverse(mounts)
	var errs []error
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}
