package guest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// bootIDPath is the kernel's boot identity: without a mount over it, a
// sandbox reads the host's (which identifies the host, and is the same
// for every sandbox on it and across a sandbox's resumes).
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID gives this boot of the sandbox an identity of its own: a random
// UUID, read-only, bound over the kernel's boot_id. Each guest start is a
// boot (a create, a resume from pause), so each gets a new one, as a
// machine's reboot does. The file is made on the sandbox's /dev tmpfs and
// unlinked once bound, so nothing names it but the mount.
func (r *rootMounter) bootID() error {
	target, err := openInRoot(r.root, bootIDPath)
	if err != nil {
		return nil // not on this kernel
	}
	defer target.Close()
	dev, err := openInRoot(r.root, "/dev")
	if err != nil {
		return err
	}
	defer dev.Close()
	const name = ".paddock-boot-id"
	fd, err := unix.Openat(int(dev.Fd()), name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("making the boot id: %w", err)
	}
	src := os.NewFile(uintptr(fd), name)
	defer src.Close()
	defer unix.Unlinkat(int(dev.Fd()), name, 0)
	id, err := newBootID()
	if err != nil {
		return fmt.Errorf("making the boot id: %w", err)
	}
	if _, err := src.WriteString(id); err != nil {
		return fmt.Errorf("writing the boot id: %w", err)
	}
	if err := unix.Mount(procPath(src), procPath(target), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the boot id: %w", err)
	}
	return r.remountReadonly(bootIDPath)
}

// newBootID is a random (version 4) UUID as the kernel prints boot_id.
// Its bytes come from getrandom(2) itself, not crypto/rand: that package
// is the guest's only use of the crypto tree, whose package inits and
// first read (a DRBG seeded behind it) cost every guest's start page
// faults for 16 bytes the kernel hands out directly.
func newBootID() (string, error) {
	var b [16]byte
	if n, err := unix.Getrandom(b[:], 0); err != nil || n != len(b) {
		return "", fmt.Errorf("getrandom: %d bytes, %v", n, err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}
