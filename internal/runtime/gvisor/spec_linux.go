package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/openat"

	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// bundle is what a sandbox's OCI bundle is made of.
type bundle struct {
	id     string
	rootfs string // the overlay mounted on the host
	guest  string // the guest binary on the host
	ctl    string // the host directory the guest binds its socket in
	image  *image.Image
	net    runtime.NetSetup
	mounts []runtime.Mount
	netns  string // a path to the network slot's namespace; "" for a new one
	cgroup string // the sandbox's cgroup, relative to the hierarchy's root
	tmp    string // the root's /tmp on the host, bound at /tmp; "" for gVisor's own tmpfs
}

// allCaps is the guest's capability set inside gVisor: every one the
// sentry knows; the guest drops to the sandbox's set (Config.Caps)
// before it forks anything.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
}

// bundleSpec is the OCI runtime spec runsc starts a sandbox from: the
// guest as its only process, the image's binds, the network's files and
// the volumes as bind mounts, the guest's binary and socket directory
// under /dev (the sentry's own tmpfs: nothing of them reaches the disk).
// The root's /tmp is bound over itself (b.tmp): runsc mounts a tmpfs of
// its own on an empty /tmp that no mount names, which would keep a
// gvisor sandbox's /tmp in memory, outside its disk's limit, its
// snapshots and its archives, unlike a native one's.
func bundleSpec(b bundle) *specs.Spec {
	readOnly := func(setuid bool) []string {
		o := []string{"rbind", "ro", "nodev"}
		if !setuid {
			o = append(o, "nosuid")
		}
		return o
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: guestDir, Type: "bind", Source: b.ctl, Options: []string{"rbind", "rw", "nodev", "nosuid", "noexec"}},
		{Destination: guestExe, Type: "bind", Source: b.guest, Options: []string{"bind", "ro", "nodev", "nosuid"}},
	}
	if b.tmp != "" {
		mounts = append(mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: b.tmp, Options: []string{"rbind", "rw"}})
	}
	for _, bind := range b.image.Binds {
		mounts = append(mounts, specs.Mount{Destination: bind.Dest, Type: "bind", Source: bind.Source, Options: readOnly(b.image.AllowSetuid)})
	}
	for _, f := range b.net.Files {
		mounts = append(mounts, specs.Mount{Destination: f.Dest, Type: "bind", Source: f.Source, Options: readOnly(false)})
	}
	for _, m := range b.mounts {
		o := []string{"rbind", "nodev", "nosuid"}
		if m.ReadOnly {
			o = append(o, "ro")
		}
		mounts = append(mounts, specs.Mount{Destination: m.Dest, Type: "bind", Source: m.Source, Options: o})
	}
	network := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: b.netns}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: []string{guestExe, "guest"},
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: allCaps, Effective: allCaps, Permitted: allCaps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
		},
		Root:     &specs.Root{Path: b.rootfs},
		Hostname: b.id,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: b.cgroup,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, network,
			},
		},
	}
}

// tmpOnDiskName is the file a checkpoint holds when its sandbox's /tmp
// was the root's own (bundle.tmp), not gVisor's tmpfs: a restore must
// mount what the saved kernel had.
const tmpOnDiskName = "tmp-on-disk"

// rootTmp makes sure the root filesystem mounted at rootfs has a /tmp
// directory (mode 1777 when it makes one) and returns its path on the
// host, or "" when the image's /tmp is no directory (a symbolic link, a
// file): that is then left to gVisor, as runsc does. The name is
// resolved beneath rootfs without following links; nothing of the
// sandbox runs yet, so the path cannot change before runsc binds it.
func rootTmp(rootfs string) (string, error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening the sandbox's root: %w", err)
	}
	defer unix.Close(root)
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: openat.ResolveBeneath | unix.RESOLVE_NO_SYMLINKS}
	made := false
	fd, err := openat.Openat2(root, "tmp", how)
	if errors.Is(err, unix.ENOENT) {
		if err = unix.Mkdirat(root, "tmp", 0o1777); err != nil && !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("making the sandbox's /tmp: %w", err)
		}
		made = err == nil
		fd, err = openat.Openat2(root, "tmp", how)
	}
	switch {
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("opening the sandbox's /tmp: %w", err)
	}
	defer unix.Close(fd)
	if made {
		// Past the umask.
		if err := unix.Fchmod(fd, 0o1777); err != nil {
			return "", fmt.Errorf("making the sandbox's /tmp: %w", err)
		}
	}
	return filepath.Join(rootfs, "tmp"), nil
}

// bindsTmp reports whether sandbox id's bundle binds the root's /tmp.
func (r *Runtime) bindsTmp(id string) (bool, error) {
	spec, err := r.bundle(id)
	if err != nil {
		return false, err
	}
	for _, m := range spec.Mounts {
		if m.Destination == "/tmp" && m.Type == "bind" {
			return true, nil
		}
	}
	return false, nil
}

// keepTmp marks checkpoint directory dir as taken with the root's /tmp
// bound (tmpOnDiskName) when sandbox id's bundle binds it.
func (r *Runtime) keepTmp(id, dir string) error {
	binds, err := r.bindsTmp(id)
	if err != nil {
		return fmt.Errorf("reading the sandbox's mounts: %w", err)
	}
	if !binds {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, tmpOnDiskName), nil, 0o600)
}

// restoredTmp is bundle.tmp for a restore of checkpoint directory image
// into rootfs: the root's /tmp when the checkpoint was taken with it
// bound, else "" (gVisor's tmpfs, saved with the kernel).
func restoredTmp(image, rootfs string) (string, error) {
	if _, err := os.Stat(filepath.Join(image, tmpOnDiskName)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("%w: %v", runtime.ErrCheckpointUnusable, err)
	}
	return rootTmp(rootfs)
}
