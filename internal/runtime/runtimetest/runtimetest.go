// Package runtimetest is the conformance suite of runtime.Runtime, in the
// manner of containerd's snapshotter testsuite: every isolation tier
// (native, the fake, gVisor to come) runs Run from its own tests, with a
// Harness that reads the host the way only that tier knows.
package runtimetest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// Harness is what the suite needs of the runtime under test.
type Harness struct {
	// New returns a runtime keeping its state under dir. The suite calls
	// it again with the same dir, after closing the first, for a
	// restarted daemon.
	New func(t *testing.T, dir string) runtime.Runtime
	// Spec returns a spec the runtime can start (its image, say); the
	// suite sets its ID and Resources.
	Spec func(t *testing.T) runtime.Spec
	// Limits reads the limits in force on sandbox id from the host.
	Limits func(t *testing.T, id string) api.Resources
	// Frozen reads from the host whether sandbox id's processes are
	// frozen.
	Frozen func(t *testing.T, id string) bool
	// Traces lists what the host still holds of sandbox id (a cgroup, a
	// mount, a process, a disk), to check that removal leaves nothing.
	Traces func(t *testing.T, id string) []string
}

// Limits the suite starts sandboxes with, and changes them to.
var (
	startLimits = api.Resources{CPUs: 1, MemoryBytes: 256 << 20, Pids: 200, DiskBytes: 256 << 20}
	newLimits   = api.Resources{CPUs: 0.5, MemoryBytes: 128 << 20, Pids: 100}
)

// Run runs the suite against h's runtime.
func Run(t *testing.T, h Harness) {
	t.Run("Start", func(t *testing.T) { testStart(t, h) })
	t.Run("FindAfterRestart", func(t *testing.T) { testRestart(t, h) })
	t.Run("GoneAfterRestart", func(t *testing.T) { testGoneAfterRestart(t, h) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, h) })
	t.Run("FreezeThaw", func(t *testing.T) { testFreeze(t, h) })
	t.Run("StopKeepsDisk", func(t *testing.T) { testStop(t, h) })
	t.Run("Snapshot", func(t *testing.T) { testSnapshot(t, h) })
	t.Run("RemoveEveryTrace", func(t *testing.T) { testRemove(t, h) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, h) })
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newRuntime makes h's runtime over dir, closed at the test's end.
func newRuntime(t *testing.T, h Harness, dir string) runtime.Runtime {
	t.Helper()
	rt := h.New(t, dir)
	t.Cleanup(func() { rt.Close() })
	return rt
}

// start starts a sandbox with startLimits, up and callable, removed at
// the test's end.
func start(t *testing.T, h Harness, rt runtime.Runtime) runtime.Instance {
	t.Helper()
	return startOwned(t, h, &rt)
}

// startOwned is start for a sandbox that *owner, the runtime of the
// day, removes at the test's end (a test of restarts replaces it).
func startOwned(t *testing.T, h Harness, owner *runtime.Runtime) runtime.Instance {
	t.Helper()
	rt := *owner
	spec := h.Spec(t)
	spec.ID = runtime.NewID()
	spec.Resources = startLimits
	inst, err := rt.Start(ctxOf(t), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := (*owner).Remove(context.Background(), spec.ID); err != nil {
			t.Errorf("removing %s: %v", spec.ID, err)
		}
	})
	if a, ok := inst.(runtime.Activating); ok {
		a.Activate()
		if err := a.StartErr(); err != nil {
			t.Fatalf("activating: %v", err)
		}
	}
	if inst.ID() != spec.ID {
		t.Fatalf("started %q, asked for %q", inst.ID(), spec.ID)
	}
	// Dial waits until the sandbox is up, its limits in force.
	dial(t, inst)
	return inst
}

// dial checks that inst's guest takes a connection.
func dial(t *testing.T, inst runtime.Instance) {
	t.Helper()
	conn, err := inst.Dial(ctxOf(t))
	if err != nil {
		t.Fatalf("Dial %s: %v", inst.ID(), err)
	}
	conn.Close()
}

func running(inst runtime.Instance) bool {
	select {
	case <-inst.Done():
		return false
	default:
		return true
	}
}

// waitDone waits for inst's guest to end.
func waitDone(t *testing.T, inst runtime.Instance) {
	t.Helper()
	select {
	case <-inst.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the guest of %s did not end", inst.ID())
	}
}

func leftover(t *testing.T, rt runtime.Runtime, id string) bool {
	t.Helper()
	left, err := rt.Leftovers()
	if err != nil {
		t.Fatalf("Leftovers: %v", err)
	}
	return slices.Contains(left, id)
}

func testStart(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	if rt.Name() == "" {
		t.Error("the runtime has no name")
	}
	inst := start(t, h, rt)
	dial(t, inst)
	if !running(inst) {
		t.Fatal("Done is closed on a started sandbox")
	}
	if inst.Info().Name != rt.Name() {
		t.Errorf("Info names runtime %q, the runtime is %q", inst.Info().Name, rt.Name())
	}
	if len(inst.State()) == 0 {
		t.Error("State is empty: nothing to restore from")
	}
	if !leftover(t, rt, inst.ID()) {
		t.Error("Leftovers misses a running sandbox")
	}
	if _, err := rt.Start(ctxOf(t), runtime.Spec{ID: inst.ID(), Image: h.Spec(t).Image, Resources: startLimits}); err == nil {
		t.Error("a second Start of a running sandbox's id succeeded")
	}
	if !running(inst) {
		t.Fatal("a refused second Start ended the first")
	}
}

func testRestart(t *testing.T, h Harness) {
	dir := t.TempDir()
	rt := h.New(t, dir)
	inst := startOwned(t, h, &rt)
	id, state := inst.ID(), inst.State()
	if err := rt.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rt2 := newRuntime(t, h, dir)
	rt = rt2
	if !leftover(t, rt2, id) {
		t.Error("a new runtime's Leftovers misses the running sandbox")
	}
	again, err := rt2.Restore(ctxOf(t), id, runtime.RestoreSpec{State: state, Resources: startLimits})
	if err != nil {
		t.Fatalf("Restore after a restart: %v", err)
	}
	if again.ID() != id {
		t.Fatalf("restored %q, want %q", again.ID(), id)
	}
	dial(t, again)
	if !running(again) {
		t.Fatal("the restored sandbox's Done is closed")
	}
	if got := h.Limits(t, id); !limitsEqual(got, startLimits) {
		t.Errorf("limits after a restart %+v, want %+v", got, startLimits)
	}
	if err := again.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitDone(t, again)
}

func testGoneAfterRestart(t *testing.T, h Harness) {
	dir := t.TempDir()
	rt := h.New(t, dir)
	inst := startOwned(t, h, &rt)
	id, state := inst.ID(), inst.State()
	if err := inst.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitDone(t, inst)
	rt.Close()
	rt2 := newRuntime(t, h, dir)
	rt = rt2
	if _, err := rt2.Restore(ctxOf(t), id, runtime.RestoreSpec{State: state, Resources: startLimits}); err == nil {
		t.Fatal("Restore found a sandbox whose guest was killed")
	}
	// What is left (its disk) is the caller's to stop or remove.
	if err := rt2.Stop(ctxOf(t), id); err != nil {
		t.Fatalf("Stop of a dead sandbox: %v", err)
	}
}

func testLimits(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	inst := start(t, h, rt)
	if got := h.Limits(t, inst.ID()); !limitsEqual(got, startLimits) {
		t.Errorf("limits in force %+v, asked for %+v", got, startLimits)
	}
	if err := inst.Update(newLimits); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got := h.Limits(t, inst.ID()); !limitsEqual(got, newLimits) {
		t.Errorf("limits after Update %+v, want %+v", got, newLimits)
	}
	// A zero field lifts the limit.
	want := api.Resources{Pids: 150}
	if err := inst.Update(want); err != nil {
		t.Fatalf("Update of pids only: %v", err)
	}
	if got := h.Limits(t, inst.ID()); !limitsEqual(got, want) {
		t.Errorf("limits after a pids-only Update %+v, want %+v", got, want)
	}
}

// limitsEqual compares the limits a runtime enforces (not the disk).
func limitsEqual(a, b api.Resources) bool {
	return a.CPUs == b.CPUs && a.MemoryBytes == b.MemoryBytes && a.Pids == b.Pids
}

func testFreeze(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	inst := start(t, h, rt)
	if h.Frozen(t, inst.ID()) {
		t.Fatal("frozen before Freeze")
	}
	if err := inst.Freeze(ctxOf(t)); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if !h.Frozen(t, inst.ID()) {
		t.Fatal("not frozen after Freeze")
	}
	if err := inst.Thaw(); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	if h.Frozen(t, inst.ID()) {
		t.Fatal("still frozen after Thaw")
	}
	dial(t, inst)
	// A frozen sandbox can be killed (thawed first if the tier needs it)
	// and a restart of the runtime keeps it frozen when asked to.
	if err := inst.Freeze(ctxOf(t)); err != nil {
		t.Fatalf("Freeze again: %v", err)
	}
	if err := rt.Stop(ctxOf(t), inst.ID()); err != nil {
		t.Fatalf("Stop of a frozen sandbox: %v", err)
	}
	waitDone(t, inst)
	// Kill ends a frozen sandbox too, also after a freeze and a thaw (a
	// delete's kill): what a freeze holds is thawed first where the tier
	// needs it.
	other := start(t, h, rt)
	for _, step := range []func(context.Context) error{other.Freeze, func(context.Context) error { return other.Thaw() }, other.Freeze} {
		if err := step(ctxOf(t)); err != nil {
			t.Fatalf("freezing and thawing: %v", err)
		}
	}
	if err := other.Kill(); err != nil {
		t.Fatalf("Kill of a frozen sandbox: %v", err)
	}
	waitDone(t, other)
	if err := rt.Remove(ctxOf(t), other.ID()); err != nil {
		t.Fatalf("Remove: %v", err)
	}
}

func testStop(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	inst := start(t, h, rt)
	id := inst.ID()
	if err := rt.Stop(ctxOf(t), id); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	waitDone(t, inst)
	if !leftover(t, rt, id) {
		t.Fatal("Stop dropped the sandbox's disk from Leftovers")
	}
	if _, size, err := rt.DiskUsage(id); err != nil || size <= 0 {
		t.Fatalf("DiskUsage of a stopped sandbox: size %d, %v", size, err)
	}
	// It starts again on the same disk.
	spec := h.Spec(t)
	spec.ID = id
	spec.Resources = startLimits
	spec.UIDBase = inst.Info().UIDBase
	again, err := rt.Start(ctxOf(t), spec)
	if err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	if a, ok := again.(runtime.Activating); ok {
		a.Activate()
	}
	dial(t, again)
	if err := again.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitDone(t, again)
}

func testSnapshot(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	inst := start(t, h, rt)
	dst := filepath.Join(t.TempDir(), "capture")
	paused := false
	c, err := rt.Snapshot(ctxOf(t), inst.ID(), dst, func() (func(), error) {
		if err := inst.Freeze(ctxOf(t)); err != nil {
			return nil, err
		}
		paused = true
		return func() { inst.Thaw() }, nil
	})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if !paused {
		t.Error("Snapshot did not pause the running sandbox")
	}
	if h.Frozen(t, inst.ID()) {
		t.Error("the sandbox stayed frozen after its snapshot")
	}
	if _, err := os.Stat(dst); err != nil {
		t.Fatalf("no capture at %s: %v", dst, err)
	}
	if c.Total < c.Frozen {
		t.Errorf("capture took %v in all but froze for %v", c.Total, c.Frozen)
	}
	// A sandbox made from the capture starts.
	spec := h.Spec(t)
	spec.ID = runtime.NewID()
	spec.Resources = startLimits
	spec.DiskFrom = dst
	fork, err := rt.Start(ctxOf(t), spec)
	if err != nil {
		t.Fatalf("Start from a capture: %v", err)
	}
	t.Cleanup(func() { rt.Remove(context.Background(), spec.ID) })
	if a, ok := fork.(runtime.Activating); ok {
		a.Activate()
	}
	dial(t, fork)
}

func testRemove(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	var insts []runtime.Instance
	for range 2 {
		insts = append(insts, start(t, h, rt))
	}
	// One running, one stopped: both go without a trace.
	if err := rt.Stop(ctxOf(t), insts[1].ID()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, inst := range insts {
		id := inst.ID()
		if len(h.Traces(t, id)) == 0 {
			t.Fatalf("the harness sees no trace of a sandbox that was started")
		}
		if err := rt.Remove(ctxOf(t), id); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		waitDone(t, inst)
		if left := h.Traces(t, id); len(left) > 0 {
			t.Errorf("Remove left %v", left)
		}
		if leftover(t, rt, id) {
			t.Errorf("Leftovers still lists %s", id)
		}
		if err := rt.Remove(ctxOf(t), id); err != nil {
			t.Errorf("a second Remove: %v", err)
		}
	}
	if _, _, err := rt.DiskUsage(insts[0].ID()); err == nil {
		t.Error("DiskUsage answers for a removed sandbox")
	}
}

// testConcurrent starts and removes sandboxes at the same time: each gets
// its own guest, and all go without a trace.
func testConcurrent(t *testing.T, h Harness) {
	rt := newRuntime(t, h, t.TempDir())
	const n = 3
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		spec := h.Spec(t)
		spec.ID = runtime.NewID()
		spec.Resources = startLimits
		ids[i] = spec.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst, err := rt.Start(ctxOf(t), spec)
			if err == nil {
				if a, ok := inst.(runtime.Activating); ok {
					a.Activate()
				}
				var conn net.Conn
				if conn, err = inst.Dial(ctxOf(t)); err == nil {
					conn.Close()
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("starting %s beside others: %v", ids[i], err)
		}
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = rt.Remove(ctxOf(t), ids[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("removing %s beside others: %v", ids[i], err)
		}
		if left := h.Traces(t, ids[i]); len(left) > 0 {
			t.Errorf("removing %s beside others left %v", ids[i], left)
		}
	}
}
