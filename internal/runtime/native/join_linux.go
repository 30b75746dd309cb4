package native

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// A container of a sandbox other than its first (runtime.Spec.Join) is a
// guest of its own, forked into the first's network namespace, with its
// cgroup inside the first's. These are the runtime's few differences for
// it: where its cgroup is, which network namespace it is forked into, and
// that its network is its sandbox's (never wired, recycled or forgotten
// on its own).

// cgroupName is the cgroup of runtime id: a sandbox's is named by its id,
// a container's is "ID/NAME", inside its sandbox's, so that the sandbox's
// limits bound it and its freeze, kill and removal reach it.
func cgroupName(id string) string {
	if sb, name, ok := runtime.SplitContainerID(id); ok {
		return sb + "/" + name
	}
	return id
}

// isContainer reports whether id is a container's beside its sandbox's
// first, whose network is its sandbox's.
func isContainer(id string) bool {
	_, _, ok := runtime.SplitContainerID(id)
	return ok
}

// joinTarget checks a start that joins another instance and returns it.
func (r *Runtime) joinTarget(spec runtime.Spec) (*Sandbox, error) {
	if spec.Join == nil {
		return nil, nil
	}
	sb, ok := spec.Join.(*Sandbox)
	if !ok {
		return nil, errdefs.Invalid("containers", "a container joins a sandbox of the native runtime only")
	}
	if parent, _, ok := runtime.SplitContainerID(spec.ID); !ok || parent != sb.id {
		return nil, fmt.Errorf("%w: container id %q is not of sandbox %s", errdefs.ErrInvalid, spec.ID, sb.id)
	}
	if r.cfg.Cgroups.Mode() == cgroup.V2 && limitsOf(spec.Resources) != (cgroup.Limits{}) {
		return nil, errdefs.New(errdefs.ErrUnavailable, "limits of a container within its sandbox's need cgroup v1 on this host (v2 groups holding processes take no child limits)")
	}
	if sb.exited() {
		return nil, errdefs.Conflict("sandbox %s ended before its container %s started", sb.id, spec.ID)
	}
	return sb, nil
}

// joinedNetns is a running sandbox's network namespace, which a container
// of it is forked into (a runtime.NetNS the runtime opened itself).
type joinedNetns struct{ fd int }

// openNetns opens sb's network namespace, checking after the open that the
// pid is still its guest's.
func openNetns(sb *Sandbox) (*joinedNetns, error) {
	fd, err := openNS(sb.st.PID, "net")
	if err != nil {
		return nil, fmt.Errorf("opening sandbox %s's network namespace: %w", sb.id, err)
	}
	if sb.exited() {
		unix.Close(fd)
		return nil, errdefs.Conflict("sandbox %s ended before its container started", sb.id)
	}
	return &joinedNetns{fd: fd}, nil
}

func (n *joinedNetns) FD() int { return n.fd }

// Close closes the descriptor; the namespace is the sandbox's and stays.
// It may be called more than once.
func (n *joinedNetns) Close() {
	if n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
}

// Sysfs mounts a detached read-only sysfs of the namespace: the
// container's user namespace does not own it, so its guest may not mount
// one itself.
func (n *joinedNetns) Sysfs() (int, error) { return network.SysfsOf(n.fd) }
