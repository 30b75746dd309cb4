package gvisor

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

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
