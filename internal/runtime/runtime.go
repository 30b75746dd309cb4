// Package runtime defines what paddock asks of an isolation tier: start a
// sandbox's guest, find it again after a daemon restart, and remove every
// trace of it. The native tier (namespaces, cgroups, seccomp) lives in
// runtime/native; a gVisor tier will sit beside it.
package runtime

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// Spec describes a sandbox to start.
type Spec struct {
	ID string
	// Runtime names the tier to start it on (Tiers); "" is the default.
	Runtime   string
	Image     *image.Image
	Resources api.Resources
	// Env is the sandbox's environment (KEY=VALUE), image defaults first.
	Env     []string
	Workdir string
	// UIDBase is the first host uid (and gid) of the sandbox's 65536-id
	// range; root in the sandbox is UIDBase on the host. Zero lets the
	// runtime take a range from its IDs (a sandbox started again must keep
	// its range: its files are owned by it). Instance.Info reports it.
	UIDBase uint32
	// Mounts are host directories (volumes) mounted into the sandbox.
	// They are owned by canonical ids and attached idmapped.
	Mounts []Mount
	// DiskFrom, for a sandbox without a disk yet, is an image file (a
	// snapshot) whose copy becomes its disk.
	DiskFrom string
	// FromCheckpoint starts the sandbox from the memory checkpoint its
	// tier's Checkpoint wrote on its disk: its processes continue where
	// they were. Env and Setup are not used (the guest has its
	// environment).
	FromCheckpoint bool
	// CheckpointFrom starts a new sandbox from a memory snapshot: the
	// checkpoint directory its tier's CheckpointTo wrote, with DiskFrom
	// the disk copied with it. Its processes continue as copies of the
	// snapshot's in the new sandbox (its own id, disk and network slot);
	// Setup is called and its environment, with Env, is given to new
	// processes. The directory is only read: one snapshot starts many.
	CheckpointFrom string
	// Setup, if set, is called once the sandbox's id is known and before
	// any of its processes run (a warm guest's id is only known when it is
	// taken); it returns more environment (KEY=VALUE).
	Setup func(id string) ([]string, error)
	// Held leaves the rest of coming up (the sandbox's limits, its
	// guest's activation) to the caller's Activating.Activate, once it has
	// recorded the sandbox: the two do not compete for the host's CPUs and
	// disk meanwhile, and no goroutine hand-off stands between them and
	// the caller's answer. Nothing the sandbox runs starts before then
	// (Dial waits). A held sandbox that dies unactivated is cleaned up.
	Held bool
	// Join, for a container of a sandbox other than its first, is the
	// sandbox's first instance (started by the same runtime): the
	// container is its own guest, on its own uid range, disk and
	// namespaces, but in that instance's network namespace, and its cgroup
	// is a child of the sandbox's. ID must be ContainerID's.
	Join Instance
}

// ContainerID is the id of container name of sandbox id as a runtime
// knows it: its run dir, disk and cgroup (below the sandbox's) are named
// by it. Sandbox ids never hold "--" (NewID), container names neither
// (api.IsContainerName).
func ContainerID(id, name string) string { return id + "--" + name }

// SplitContainerID undoes ContainerID; ok is false for a sandbox's id.
func SplitContainerID(cid string) (id, name string, ok bool) {
	id, name, ok = strings.Cut(cid, "--")
	return id, name, ok && id != "" && name != ""
}

// Network connects sandboxes to the host's egress path. The runtime calls
// it when it makes a sandbox's network namespace and when the sandbox goes.
type Network interface {
	// Attach wires the network namespace open at netnsFD to sandbox id.
	Attach(id string, netnsFD int) (NetSetup, error)
	// Restore re-adopts a sandbox's wiring after a daemon restart, from
	// the state Attach returned.
	Restore(id string, state []byte) error
	// Detach releases the wiring of a sandbox whose processes are gone;
	// what it needs to start again (its CA) is kept.
	Detach(id string)
	// Forget releases everything of a removed sandbox.
	Forget(id string)
}

// NetSlots is a Network that makes network namespaces ahead of time and
// recycles them (the gateway's network slots): a guest is forked into one
// instead of a namespace of its own, and Attach given it records the
// sandbox's.
type NetSlots interface {
	Network
	// TakeNetns hands out a namespace for a guest to be forked into.
	TakeNetns() (NetNS, error)
	// Recycle is Detach for a sandbox whose processes are known to be
	// gone (its cgroup was removed): its namespace is reset and handed
	// to another guest, or destroyed if it cannot be reset; its files
	// may go to another sandbox once it is forgotten.
	Recycle(id string)
}

// Readdresser is a Network that can put a sandbox's addresses back in
// its own namespace, for a kernel restored into it (the gvisor tier's
// memory snapshot of a running sandbox): a gVisor netstack takes them off
// the interface it takes over.
type Readdresser interface {
	Readdress(id string, netnsFD int) error
}

// NetNS is a network namespace TakeNetns handed out.
type NetNS interface {
	// FD is the namespace, open while the NetNS is.
	FD() int
	// Sysfs returns a new detached read-only sysfs mount of it, for the
	// guest's /sys; the caller closes it.
	Sysfs() (int, error)
	// Close destroys a namespace no sandbox was attached to; once one
	// was, the namespace is the sandbox's and Close does nothing.
	Close()
}

// NetSetup is what Attach made for a sandbox.
type NetSetup struct {
	// State is opaque, for Restore.
	State []byte
	// Files are host files (or directories) bound read-only into the
	// sandbox (resolv.conf, hosts, hostname, the CA bundle, /run/paddock).
	Files []FileBind
	// Env points the sandbox's tools at the proxy and the CA.
	Env []string
}

// HostnamePath is where a sandbox's hostname file is bound: a FileBind
// there names the sandbox Attach was given, so a container that joins
// the sandbox's network, which has a hostname of its own, is not given it.
const HostnamePath = "/etc/hostname"

// FileBind is a host file or directory bound read-only into a sandbox.
type FileBind struct {
	Source string
	Dest   string
	Dir    bool
}

// Mount is a host directory mounted into a sandbox.
type Mount struct {
	Source   string
	Dest     string
	ReadOnly bool
}

// idPrefix starts every id NewID mints: the node's tag in a cluster
// (api.Node.Tag), so that a gateway routes a call by the id alone. It is
// set once at start-up, before anything mints an id.
var idPrefix string

// SetIDPrefix makes every id NewID mints from now on start with tag (a
// node's tag, api.IsNodeTag; "" for none).
func SetIDPrefix(tag string) error {
	if tag != "" && !api.IsNodeTag(tag) {
		return fmt.Errorf("%w: id prefix %q: want 1 to %d of a-z and 0-9", errdefs.ErrInvalid, tag, api.MaxNodeTag)
	}
	idPrefix = tag
	return nil
}

// NewID returns a fresh sandbox id: 12 lowercase letters and digits, the
// first ones the node's tag (SetIDPrefix). With a tag of at most
// api.MaxNodeTag characters at least 8 are random (36^8, 2.8e12 ids per
// node); tags are distinct, so ids are unique across a cluster.
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 12)
	rand.Read(b)
	n := copy(b, idPrefix)
	for i := n; i < len(b); i++ {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// IDs hands out host uid/gid ranges of 65536 ids. The sandbox manager
// implements it, because it records which sandbox owns which range.
type IDs interface {
	// Alloc reserves a free range and returns its base.
	Alloc() (uint32, error)
	// Free releases a range that no sandbox took.
	Free(base uint32)
}

// RestoreSpec is what the caller recorded of a sandbox it reattaches to.
type RestoreSpec struct {
	State []byte // what its Instance's State returned
	// Resources are its limits, set again: a daemon that died right after
	// answering a create may not have set them yet (see Activating).
	Resources api.Resources
	// Frozen: the sandbox was frozen on request and stays so. Otherwise
	// it is thawed (left frozen by an older daemon's cut-short create,
	// say).
	Frozen bool
}

// Runtime is an isolation tier.
type Runtime interface {
	Name() string
	// Start builds and starts a sandbox. The writable layer is kept if
	// one exists for spec.ID (a restart), created otherwise.
	Start(ctx context.Context, spec Spec) (Instance, error)
	// Restore reattaches to a sandbox started by an earlier daemon.
	Restore(ctx context.Context, id string, rs RestoreSpec) (Instance, error)
	// Stop ends a sandbox's processes and releases its CPU and memory,
	// keeping its writable layer.
	Stop(ctx context.Context, id string) error
	// Remove deletes every trace of a sandbox, running or not.
	Remove(ctx context.Context, id string) error
	// Snapshot copies sandbox id's writable layer into the new file dst,
	// consistently: pause, when not nil, freezes the sandbox's processes
	// around the moment of capture and returns the function that thaws
	// them.
	Snapshot(ctx context.Context, id, dst string, pause func() (resume func(), err error)) (Capture, error)
	// DiskUsage reports the bytes used on sandbox id's disk and its size.
	DiskUsage(id string) (used, size int64, err error)
	// Leftovers lists ids that have host resources, so that the caller
	// can remove those it has no record of. What the runtime made ahead
	// of time for sandboxes to come (warm guests, their disks) is its
	// own and never listed: the pools may refill while the caller
	// reconciles.
	Leftovers() ([]string, error)
	// Close releases what the runtime holds for sandboxes not yet made;
	// running sandboxes are left alone.
	Close() error
}

// Checkpointer is offered by tiers that can pause a sandbox with its
// processes (the gvisor tier).
type Checkpointer interface {
	// Checkpoint writes running sandbox id's processes (their memory,
	// open files, sockets) to its disk and leaves them stopped, not
	// ended: the caller's Stop ends them, and a Start with
	// Spec.FromCheckpoint continues them. On failure they run on and the
	// error says why. The caller need not wait for the instance's Done
	// before that Stop, once it has killed the instance: Stop then
	// returns before the processes have exited (stopped, they cannot run
	// again), and the runtime waits for their exit, and removes what
	// they held, before the sandbox's next Start or Remove.
	Checkpoint(ctx context.Context, id string) (Checkpoint, error)
	// CheckpointTo writes running sandbox id's processes to dir, a new
	// directory, and lets them run on (the gvisor tier restores them
	// from dir: the instance's State may change, its Done does not
	// fire). during, if set, runs while they are stopped (a copy of the
	// disk then matches what was saved); its error fails the
	// checkpoint. On failure dir is removed and the processes run on,
	// or, if they could not be brought back, the instance's Done fires;
	// the error says why.
	CheckpointTo(ctx context.Context, id, dir string, during func() error) (Checkpoint, error)
	// Squeeze compresses paused sandbox id's checkpoint in the
	// background, as after Checkpoint (Checkpoint.Squeezed): for one
	// whose compression a daemon's end stopped.
	Squeeze(id string) <-chan int64
}

// Checkpoint reports a memory checkpoint.
type Checkpoint struct {
	// Bytes is what it takes on the sandbox's disk.
	Bytes int64
	// MemoryBytes is the memory the sandbox's processes used.
	MemoryBytes int64
	Took        time.Duration
	// Stopped is how long the sandbox's processes were stopped.
	Stopped time.Duration
	// Squeezed, if not nil, is a checkpoint written uncompressed (Bytes
	// is that size) and being compressed behind the answer: it yields
	// the size on disk once compressed, then closes; it closes without
	// one if the compression stopped (a start took the checkpoint
	// first, or it failed: the checkpoint stays as it was, usable).
	Squeezed <-chan int64
}

var (
	// ErrNoCheckpoint: the sandbox's tier keeps no memory on a pause.
	ErrNoCheckpoint = errors.New("this runtime keeps no memory on a pause")
	// ErrCheckpointUnusable marks a start from a checkpoint that failed
	// for the checkpoint's sake (missing, truncated, corrupt): the
	// sandbox's files are intact and a start without it may work.
	ErrCheckpointUnusable = errors.New("the memory checkpoint cannot be restored")
)

// Capture reports a snapshot of a writable layer.
type Capture struct {
	// Frozen is how long the sandbox's processes were paused.
	Frozen time.Duration
	Total  time.Duration
	// Size is the captured filesystem's size; Allocated what its data
	// takes.
	Size, Allocated int64
	// Shared says the copy shares blocks with its source (reflink).
	Shared bool
}

// Instance is a started sandbox.
type Instance interface {
	ID() string
	// State is opaque data to persist for Restore.
	State() []byte
	// Dial opens a connection to the sandbox's guest.
	Dial(ctx context.Context) (net.Conn, error)
	// Done is closed when the sandbox's guest has exited.
	Done() <-chan struct{}
	// Kill ends every process in the sandbox; Done closes afterwards.
	Kill() error
	// Freeze stops every process in place (memory kept); Thaw lets them
	// run again.
	Freeze(ctx context.Context) error
	Thaw() error
	// Update sets the CPU, memory and pids limits in place to res's; a
	// zero field means no limit (callers pass all three). The disk's
	// size does not change.
	Update(res api.Resources) error
	Info() api.RuntimeInfo
}

// Activating is offered by instances that finish coming up after Start
// returns. Activate returns once the instance no longer needs this daemon
// to come up (it would survive the daemon's death from then on), or once
// that failed; for a Held start it does that part itself, in the caller's
// goroutine, and leaves the rest (the guest's reply) to the background.
type Activating interface {
	Activate()
	// StartErr, once the instance is done, is why it could not come up
	// (nil if it did).
	StartErr() error
}

// PoolRoom is offered by runtimes that bound what their pools hold by the
// host's memory: warm pools kept outside the runtime (a group template's,
// in the sandbox manager) grow under the same bound.
type PoolRoom interface {
	// HasPoolRoom reports whether the host has the memory for one more
	// sandbox made ahead.
	HasPoolRoom() bool
}

// Backgrounder is offered by instances whose CPU priority can be
// lowered: a group made ahead for a warm pool runs its services at the
// weight of a background task until it is handed out.
type Backgrounder interface {
	// SetBackground gives the sandbox's cgroup (which holds its
	// containers') a background task's weight (on) or the normal one.
	// Called after Activate, it first waits for the activation to have
	// set the normal one, so that the two do not race.
	SetBackground(on bool) error
}

// ExitWatcher is offered by instances that can run a function when their
// guest exits, so that a caller watching many sandboxes parks no
// goroutine per sandbox to wait on Done.
type ExitWatcher interface {
	// OnExit runs f on a goroutine of its own once Done is closed (soon
	// after, if it is already).
	OnExit(f func())
}

// PoolSource is what a warm pool's sandboxes are made from: an image and,
// for a template, the snapshot image their disk is a copy of. A create
// whose image, DiskFrom and disk size match takes one of them.
type PoolSource struct {
	Image     func() (*image.Image, error)
	DiskFrom  string
	DiskBytes int64
	// Limits, if set, are the limits most creates from the pool ask for
	// (the defaults): set ahead on its sandboxes, so that a hand-out
	// asking for them is not limited on its way to its first command.
	// Any limits may still be asked for.
	Limits api.Resources
}

// Pools is offered by runtimes that keep sandboxes ready ahead of time.
type Pools interface {
	// SetPool keeps size sandboxes of src ready under name ("image:host",
	// "template:web"); size 0 removes the pool.
	SetPool(name string, src PoolSource, size int)
	// PoolSizes reports the ready sandboxes by pool name.
	PoolSizes() map[string]int
	// PoolTargets reports the size each pool is kept at.
	PoolTargets() map[string]int
}
