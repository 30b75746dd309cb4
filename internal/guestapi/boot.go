package guestapi

// Devices are the /dev entries a guest binds from the host (a user
// namespace cannot mknod): the guest forker's minimal root holds them for
// the guests it forks.
var Devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// Config is a message from the daemon on the sync socket. A guest is
// usually started ahead of time: it is sent Prepare (become this sandbox,
// minus its environment) while nobody waits, and Activate (the
// environment; start serving) when a create asks for a sandbox. A cold
// start sends both in one message.
type Config struct {
	Prepare  *Prepare  `json:"prepare,omitempty"`
	Activate *Activate `json:"activate,omitempty"`
}

// Prepare builds the sandbox. Every host directory arrives as a
// descriptor (Mount.FD indexes those sent with the message): the guest runs
// as an unprivileged host uid and may not be able to walk the daemon's
// directories by path.
type Prepare struct {
	// Layers are the read-only lower layers, top-most first.
	Layers []Mount `json:"layers"`
	// Disk is the sandbox's writable volume (a detached mount); the
	// overlay's upper and work dirs are Disk's upper/ and work/.
	Disk Mount `json:"disk"`
	// Binds are host directories mounted read-only into the rootfs.
	Binds []Mount `json:"binds"`
	// OOMFD indexes the fd of the cgroup's OOM event counter file.
	OOMFD int `json:"oom_fd"`
	// PidsTasks, when set, indexes the fd of the sandbox group's v1 pids
	// tasks file (opened by the daemon, which the kernel checks writes
	// against). The guest's process is outside that group: its spawner
	// thread joins it, and so everything the sandbox runs starts in it,
	// while the guest's own threads count against no sandbox limit and
	// it keeps no spare ones for a sandbox at its limit.
	PidsTasks *int   `json:"pids_tasks,omitempty"`
	Hostname  string `json:"hostname"`
	// CgroupV2 mounts the sandbox's own cgroup2 tree at /sys/fs/cgroup.
	CgroupV2 bool `json:"cgroup_v2"`
	// Seccomp is a compiled BPF program the guest and its processes run
	// under. It travels as raw bytes after the message's JSON (SendConfig),
	// not in it: in base64 it was most of a 13.9 KB message that the
	// daemon encoded and every guest scanned byte by byte.
	Seccomp []byte `json:"-"`
	// Caps is the capability set the sandbox keeps ("CAP_CHOWN", ...).
	Caps []string `json:"caps"`
	// AllowSetuid leaves no_new_privs unset, so that setuid programs
	// (sudo) raise a process to the sandbox's root, within Caps.
	AllowSetuid bool `json:"allow_setuid,omitempty"`
	// SkipWarmUp leaves out the warm-up command: the daemon waits for
	// this guest (a resume, a create with no warm guest), and the
	// command would only delay the sandbox's first one.
	SkipWarmUp bool `json:"skip_warm_up,omitempty"`
	// NetReady: the daemon made the guest's network namespace (a network
	// slot: the host's user namespace owns it, so nothing in the sandbox
	// can reconfigure it) with loopback up and ICMP echo sockets allowed,
	// and Binds holds /sys, a sysfs of it (a user namespace may not mount
	// sysfs for a network namespace it does not own).
	NetReady bool `json:"net_ready,omitempty"`
	// RootReady: the runtime built the root filesystem, its mounts, the
	// hostname and the namespaces (the gvisor runtime: runsc, from an OCI
	// bundle), so the guest only bounds what it forks. Layers, Disk and
	// Binds are then empty.
	RootReady bool `json:"root_ready,omitempty"`
	// Listen, if set, is where the guest binds its control socket instead
	// of taking the inherited listener: a directory bound from the host,
	// in which runsc (--host-uds=create) makes a host socket the daemon
	// dials. gVisor takes in host sockets only connected, not listening.
	// The guest covers the directory once bound, so that nothing in the
	// sandbox reaches the socket.
	Listen string `json:"listen,omitempty"`
}

// Activate starts a prepared guest serving with the sandbox's environment.
type Activate struct {
	Serve ServeConfig `json:"serve"`
}

// Mount is a directory for the root filesystem, sent as a detached mount
// the daemon made (open_tree: read-only, idmapped where the kernel
// allows). A mount of the daemon's namespace could not be bound from or
// mounted on inside the guest's; a detached one can be attached.
type Mount struct {
	// Source is the host path, for messages only.
	Source string `json:"source,omitempty"`
	// FD indexes the descriptors sent with the message.
	FD   int    `json:"fd"`
	Dest string `json:"dest,omitempty"`
	// File: the mount is of a file, not a directory.
	File bool `json:"file,omitempty"`
}

// ServeConfig is what the guest needs once the sandbox is built.
type ServeConfig struct {
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	// OutputLimit caps the output retained per process, in bytes.
	OutputLimit int64 `json:"output_limit"`
	// Retain is how many finished processes are kept for reattach.
	Retain int `json:"retain"`
}

// Ready answers each Config: an error, or the phase reached ("prepared",
// or "ready" with the guest's pid in its namespace, which must be 1).
type Ready struct {
	Error string `json:"error,omitempty"`
	// Code is the error's category (errdefs.Code) when it has one: a
	// sandbox whose image cannot be assembled is the caller's fault,
	// not the host's.
	Code  string `json:"code,omitempty"`
	Phase string `json:"phase,omitempty"`
	PID   int    `json:"pid,omitempty"`
}
