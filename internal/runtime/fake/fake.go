// Package fake is a runtime.Runtime that isolates nothing, for tests that
// need no root: a sandbox's guest is a record on a Host (its limits,
// whether it is frozen, a channel closed when it ends) and its writable
// layer a file in the runtime's directory. A Host stands for the machine:
// runtimes made over the same Host and directory find each other's
// sandboxes, as a restarted daemon does. Fail injects errors.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// Host holds the guests that outlive a Runtime, as processes and cgroups
// outlive a daemon.
type Host struct {
	mu     sync.Mutex
	guests map[string]*guest
}

// NewHost returns a Host with nothing running.
func NewHost() *Host { return &Host{guests: map[string]*guest{}} }

type guest struct {
	id     string
	dir    string // the runtime directory it was started from
	limits api.Resources
	frozen bool
	done   chan struct{}
	conns  []net.Conn // the guest's ends of Dial's pipes
}

// Running reports whether sandbox id has a guest.
func (h *Host) Running(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.guests[id] != nil
}

// Limits reports the limits in force on sandbox id's guest.
func (h *Host) Limits(id string) (api.Resources, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.guests[id]
	if g == nil {
		return api.Resources{}, false
	}
	return g.limits, true
}

// Frozen reports whether sandbox id's guest is frozen.
func (h *Host) Frozen(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.guests[id]
	return g != nil && g.frozen
}

// Kill ends sandbox id's guest behind its runtime's back, as a crash
// would.
func (h *Host) Kill(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(id)
}

func (h *Host) endLocked(id string) {
	g := h.guests[id]
	if g == nil {
		return
	}
	delete(h.guests, id)
	for _, c := range g.conns {
		c.Close()
	}
	close(g.done)
}

// Runtime is the fake tier. Its sandboxes' disks are files in its
// directory.
type Runtime struct {
	host *Host
	dir  string
	ids  runtime.IDs

	// Fail, when set, is asked before each operation on sandbox id (op is
	// "start", "restore", "stop", "remove", "snapshot", "kill", "freeze",
	// "thaw" or "update"); an error it returns is the operation's.
	Fail func(op, id string) error

	mu   sync.Mutex
	next uint32 // the last range handed out without ids
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a runtime over host keeping disks in dir. ids, if not nil,
// hands out uid ranges; otherwise the runtime counts its own.
func New(host *Host, dir string, ids runtime.IDs) (*Runtime, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making fake runtime dir: %w", err)
	}
	return &Runtime{host: host, dir: dir, ids: ids, next: 1 << 20}, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "fake" }

func (r *Runtime) fail(op, id string) error {
	if r.Fail == nil {
		return nil
	}
	return r.Fail(op, id)
}

func (r *Runtime) disk(id string) string { return filepath.Join(r.dir, id+".disk") }

// state is what an Instance's State keeps for Restore.
type state struct {
	UIDBase uint32 `json:"uid_base"`
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := spec.ID
	if id == "" {
		id = runtime.NewID()
	}
	if err := r.fail("start", id); err != nil {
		return nil, err
	}
	base, err := r.base(spec.UIDBase)
	if err != nil {
		return nil, err
	}
	// A range taken here is the sandbox's once Start succeeds (the
	// caller records it); a failed start gives it back.
	ok := false
	defer func() {
		if !ok && spec.UIDBase == 0 && r.ids != nil {
			r.ids.Free(base)
		}
	}()
	if err := r.makeDisk(id, spec.DiskFrom, spec.Resources.DiskBytes); err != nil {
		return nil, err
	}
	if spec.Setup != nil {
		if _, err := spec.Setup(id); err != nil {
			return nil, fmt.Errorf("setting up %s: %w", id, err)
		}
	}
	g := &guest{id: id, dir: r.dir, limits: spec.Resources, done: make(chan struct{})}
	r.host.mu.Lock()
	defer r.host.mu.Unlock()
	if r.host.guests[id] != nil {
		return nil, errdefs.Conflict("sandbox %s is already running", id)
	}
	r.host.guests[id] = g
	ok = true
	return r.instance(g, base), nil
}

// base returns a sandbox's uid range: want if set, else a new one.
func (r *Runtime) base(want uint32) (uint32, error) {
	if want != 0 {
		return want, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.next += 65536
		return r.next, nil
	}
	return r.ids.Alloc()
}

// defaultDisk is the size of a disk whose size the spec leaves unset.
const defaultDisk = 1 << 30

// A fake disk is a file holding its size; its copies copy that.
func (r *Runtime) makeDisk(id, from string, size int64) error {
	path := r.disk(id)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if from != "" {
		return copyFile(from, path)
	}
	if size == 0 {
		size = defaultDisk
	}
	return os.WriteFile(path, []byte(strconv.FormatInt(size, 10)), 0o600)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, id string, rs runtime.RestoreSpec) (runtime.Instance, error) {
	if err := r.fail("restore", id); err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(rs.State, &st); err != nil {
		return nil, fmt.Errorf("reading the state of %s: %w", id, err)
	}
	r.host.mu.Lock()
	defer r.host.mu.Unlock()
	g := r.host.guests[id]
	if g == nil || g.dir != r.dir {
		return nil, errdefs.NotFound("guest of sandbox", id)
	}
	g.limits.CPUs, g.limits.MemoryBytes, g.limits.Pids = rs.Resources.CPUs, rs.Resources.MemoryBytes, rs.Resources.Pids
	g.frozen = rs.Frozen
	return r.instance(g, st.UIDBase), nil
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := r.fail("stop", id); err != nil {
		return err
	}
	r.host.Kill(id)
	return nil
}

// Remove implements runtime.Runtime.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if err := r.fail("remove", id); err != nil {
		return err
	}
	r.host.Kill(id)
	if err := os.Remove(r.disk(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Snapshot implements runtime.Runtime.
func (r *Runtime) Snapshot(ctx context.Context, id, dst string, pause func() (func(), error)) (runtime.Capture, error) {
	if err := r.fail("snapshot", id); err != nil {
		return runtime.Capture{}, err
	}
	start := time.Now()
	if pause != nil {
		resume, err := pause()
		if err != nil {
			return runtime.Capture{}, err
		}
		defer resume()
	}
	if err := copyFile(r.disk(id), dst); err != nil {
		return runtime.Capture{}, fmt.Errorf("capturing %s: %w", id, err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return runtime.Capture{}, err
	}
	took := time.Since(start)
	return runtime.Capture{Frozen: took, Total: took, Size: fi.Size(), Allocated: fi.Size()}, nil
}

// DiskUsage implements runtime.Runtime.
func (r *Runtime) DiskUsage(id string) (used, size int64, err error) {
	b, err := os.ReadFile(r.disk(id))
	if err != nil {
		return 0, 0, errdefs.NotFound("disk of sandbox", id)
	}
	size, err = strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the disk of %s: %w", id, err)
	}
	// Nothing is written to a fake disk.
	return 0, size, nil
}

// Leftovers implements runtime.Runtime: sandboxes with a disk or a guest.
func (r *Runtime) Leftovers() ([]string, error) {
	seen := map[string]bool{}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".disk"); ok {
			seen[id] = true
		}
	}
	r.host.mu.Lock()
	for id, g := range r.host.guests {
		if g.dir == r.dir {
			seen[id] = true
		}
	}
	r.host.mu.Unlock()
	out := make([]string, 0, len(seen))
	for id := range seen {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// Close implements runtime.Runtime; running guests stay.
func (r *Runtime) Close() error { return nil }

// Traces lists what is left of sandbox id: "guest" while it runs, "disk"
// while its disk exists.
func (r *Runtime) Traces(id string) []string {
	var out []string
	if r.host.Running(id) {
		out = append(out, "guest")
	}
	if _, err := os.Stat(r.disk(id)); err == nil {
		out = append(out, "disk "+r.disk(id))
	}
	return out
}

// Instance is a fake sandbox's guest.
type Instance struct {
	r    *Runtime
	g    *guest
	base uint32
}

var (
	_ runtime.Instance   = (*Instance)(nil)
	_ runtime.Activating = (*Instance)(nil)
)

func (r *Runtime) instance(g *guest, base uint32) *Instance {
	return &Instance{r: r, g: g, base: base}
}

// ID implements runtime.Instance.
func (in *Instance) ID() string { return in.g.id }

// State implements runtime.Instance.
func (in *Instance) State() []byte {
	b, _ := json.Marshal(state{UIDBase: in.base})
	return b
}

// Dial implements runtime.Instance: one end of a pipe whose other end
// nobody serves; it closes when the guest ends.
func (in *Instance) Dial(ctx context.Context) (net.Conn, error) {
	h := in.r.host
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.guests[in.g.id] != in.g {
		return nil, fmt.Errorf("dialling %s: %w", in.g.id, net.ErrClosed)
	}
	c, peer := net.Pipe()
	in.g.conns = append(in.g.conns, peer)
	return c, nil
}

// Done implements runtime.Instance.
func (in *Instance) Done() <-chan struct{} { return in.g.done }

// Kill implements runtime.Instance.
func (in *Instance) Kill() error {
	if err := in.r.fail("kill", in.g.id); err != nil {
		return err
	}
	h := in.r.host
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.guests[in.g.id] == in.g {
		h.endLocked(in.g.id)
	}
	return nil
}

// Freeze implements runtime.Instance.
func (in *Instance) Freeze(ctx context.Context) error {
	if err := in.r.fail("freeze", in.g.id); err != nil {
		return err
	}
	return in.set(func(g *guest) { g.frozen = true })
}

// Thaw implements runtime.Instance.
func (in *Instance) Thaw() error {
	if err := in.r.fail("thaw", in.g.id); err != nil {
		return err
	}
	return in.set(func(g *guest) { g.frozen = false })
}

// Update implements runtime.Instance.
func (in *Instance) Update(res api.Resources) error {
	if err := in.r.fail("update", in.g.id); err != nil {
		return err
	}
	return in.set(func(g *guest) {
		g.limits.CPUs, g.limits.MemoryBytes, g.limits.Pids = res.CPUs, res.MemoryBytes, res.Pids
	})
}

func (in *Instance) set(f func(*guest)) error {
	h := in.r.host
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.guests[in.g.id] != in.g {
		return errdefs.Conflict("the guest of %s has ended", in.g.id)
	}
	f(in.g)
	return nil
}

// Info implements runtime.Instance.
func (in *Instance) Info() api.RuntimeInfo {
	return api.RuntimeInfo{Name: "fake", UIDBase: in.base}
}

// Activate implements runtime.Activating: a fake guest is up at once.
func (in *Instance) Activate() {}

// StartErr implements runtime.Activating.
func (in *Instance) StartErr() error { return nil }
