package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime/fake"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/store"
)

// These tests run the manager's lifecycle on the fake runtime: no root,
// no guest, and they run under -race.

// testbed is a manager over a fake runtime, with what a restart needs to
// make another over the same host and directories.
type testbed struct {
	t      *testing.T
	host   *fake.Host
	dir    string
	images *image.Store
	st     *store.Store
	rt     *fake.Runtime
	m      *Manager
	egress Egress // nil: none
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// images is one image store for every testbed: the host image is built
// once (a copy of parts of /etc, hashed), not per test.
var images struct {
	store *image.Store
	err   error
}

// TestMain removes the shared image store.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "paddock-sandbox-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	images.store, images.err = image.NewStore(dir, quiet)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newTestbed(t *testing.T) *testbed {
	t.Helper()
	if images.err != nil {
		t.Fatal(images.err)
	}
	tb := &testbed{t: t, host: fake.NewHost(), dir: t.TempDir(), images: images.store}
	tb.start()
	t.Cleanup(tb.stop)
	return tb
}

// start makes the daemon's part: a store, a manager and a runtime over
// the testbed's host, reconciled.
func (tb *testbed) start() {
	t := tb.t
	t.Helper()
	st, err := store.Open(filepath.Join(tb.dir, "paddock.db"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(Config{Images: tb.images, Store: st, UIDStart: 1 << 20, MaxSandboxes: 16, Egress: tb.egress, Logger: quiet})
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(tb.host, filepath.Join(tb.dir, "run"), m)
	if err != nil {
		t.Fatal(err)
	}
	m.SetRuntime(rt)
	if err := m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	tb.st, tb.rt, tb.m = st, rt, m
}

// stop ends the daemon's part; the host's guests go on.
func (tb *testbed) stop() {
	if tb.m == nil {
		return
	}
	tb.m.Close()
	tb.st.Close()
	tb.m = nil
}

func (tb *testbed) create() api.Sandbox {
	tb.t.Helper()
	sb, err := tb.m.Create(context.Background(), api.CreateRequest{Resources: api.Resources{CPUs: 1, MemoryBytes: 256 << 20, Pids: 100}})
	if err != nil {
		tb.t.Fatalf("Create: %v", err)
	}
	return sb
}

func (tb *testbed) get(id string) api.Sandbox {
	tb.t.Helper()
	sb, err := tb.m.Get(context.Background(), id)
	if err != nil {
		tb.t.Fatalf("Get %s: %v", id, err)
	}
	return sb
}

// waitState waits for the watcher to record a state.
func (tb *testbed) waitState(id string, want api.State) {
	tb.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tb.get(id).State != want {
		if time.Now().After(deadline) {
			tb.t.Fatalf("%s stayed %s, want %s", id, tb.get(id).State, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkHost checks that the host agrees with the recorded state: a guest
// runs exactly while the sandbox is running or frozen, frozen exactly
// while it is frozen.
func (tb *testbed) checkHost(sb api.Sandbox) {
	tb.t.Helper()
	runs := sb.State == api.StateRunning || sb.State == api.StateFrozen
	if got := tb.host.Running(sb.ID); got != runs {
		tb.t.Errorf("%s is %s, but its guest running is %v", sb.ID, sb.State, got)
	}
	if got := tb.host.Frozen(sb.ID); got != (sb.State == api.StateFrozen) {
		tb.t.Errorf("%s is %s, but its guest frozen is %v", sb.ID, sb.State, got)
	}
}

// into brings a new sandbox into state st through the API (or, for
// failed, by killing its guest behind the manager's back).
func (tb *testbed) into(st api.State) api.Sandbox {
	tb.t.Helper()
	sb := tb.create()
	ctx := context.Background()
	var err error
	switch st {
	case api.StateRunning:
	case api.StateFrozen:
		_, err = tb.m.Freeze(ctx, sb.ID)
	case api.StatePaused:
		_, err = tb.m.Pause(ctx, sb.ID)
	case api.StateStopped:
		_, err = tb.m.Stop(ctx, sb.ID)
	case api.StateFailed:
		tb.host.Kill(sb.ID)
		tb.waitState(sb.ID, api.StateFailed)
	default:
		tb.t.Fatalf("no way into %s", st)
	}
	if err != nil {
		tb.t.Fatalf("bringing %s into %s: %v", sb.ID, st, err)
	}
	sb = tb.get(sb.ID)
	if sb.State != st {
		tb.t.Fatalf("%s is %s, want %s", sb.ID, sb.State, st)
	}
	return sb
}

// calls are the API's lifecycle calls, by the action they are in the
// table.
var calls = map[action]func(m *Manager, id string) error{
	actStop: func(m *Manager, id string) error { _, err := m.Stop(context.Background(), id); return err },
	actRemove: func(m *Manager, id string) error {
		return m.Remove(context.Background(), id, false)
	},
	actForceRemove: func(m *Manager, id string) error {
		return m.Remove(context.Background(), id, true)
	},
	actPause:  func(m *Manager, id string) error { _, err := m.Pause(context.Background(), id); return err },
	actResume: func(m *Manager, id string) error { _, err := m.Resume(context.Background(), id); return err },
	actFreeze: func(m *Manager, id string) error { _, err := m.Freeze(context.Background(), id); return err },
	actThaw:   func(m *Manager, id string) error { _, err := m.Thaw(context.Background(), id); return err },
	actUpdate: func(m *Manager, id string) error {
		_, err := m.Update(context.Background(), id, api.UpdateRequest{Resources: api.Resources{Pids: 123}})
		return err
	},
}

// TestLifecycleFollowsTable drives a sandbox in each state through each
// call and checks the outcome against the table, and the host against
// the outcome.
func TestLifecycleFollowsTable(t *testing.T) {
	for _, from := range []api.State{api.StateRunning, api.StateFrozen, api.StatePaused, api.StateStopped, api.StateFailed} {
		for act, call := range calls {
			t.Run(fmt.Sprintf("%s/%s", from, act), func(t *testing.T) {
				tb := newTestbed(t)
				sb := tb.into(from)
				err := call(tb.m, sb.ID)
				mv, allowed := lifecycle[from][act]
				if !allowed {
					if !errors.Is(err, errdefs.ErrConflict) {
						t.Fatalf("%s of a %s sandbox: %v, want a conflict", act, from, err)
					}
					after := tb.get(sb.ID)
					if after.State != from {
						t.Fatalf("a refused %s moved %s to %s", act, from, after.State)
					}
					tb.checkHost(after)
					return
				}
				if err != nil {
					t.Fatalf("%s of a %s sandbox: %v", act, from, err)
				}
				if mv.to == stateRemoving {
					if _, err := tb.m.Get(context.Background(), sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
						t.Fatalf("after %s, Get: %v, want not found", act, err)
					}
					if err := tb.m.Settle(context.Background()); err != nil {
						t.Fatal(err)
					}
					if left := tb.rt.Traces(sb.ID); len(left) > 0 {
						t.Fatalf("after %s, the host still has %v", act, left)
					}
					return
				}
				after := tb.get(sb.ID)
				if after.State != mv.to {
					t.Fatalf("%s of a %s sandbox left it %s, the table says %s", act, from, after.State, mv.to)
				}
				tb.checkHost(after)
				if act == actUpdate {
					if after.Resources.Pids != 123 {
						t.Fatalf("pids recorded %d after the update", after.Resources.Pids)
					}
					if res, ok := tb.host.Limits(sb.ID); ok && res.Pids != 123 {
						t.Fatalf("pids in force %d after a live update", res.Pids)
					}
				}
			})
		}
	}
}

// TestGuestExitFails: a guest that dies is recorded failed, with why,
// and a resume starts it again on its disk with its uid range.
func TestGuestExitFails(t *testing.T) {
	tb := newTestbed(t)
	sb := tb.create()
	tb.host.Kill(sb.ID)
	tb.waitState(sb.ID, api.StateFailed)
	failed := tb.get(sb.ID)
	if failed.Error == "" {
		t.Error("a failed sandbox says nothing of why")
	}
	tb.checkHost(failed)
	if _, err := tb.m.Guest(context.Background(), sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Guest of a failed sandbox: %v, want a conflict", err)
	}
	back, err := tb.m.Resume(context.Background(), sb.ID)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if back.State != api.StateRunning || back.Error != "" {
		t.Fatalf("resumed: %s %q", back.State, back.Error)
	}
	if back.Runtime.UIDBase != sb.Runtime.UIDBase {
		t.Errorf("uid range %d after the resume, %d before", back.Runtime.UIDBase, sb.Runtime.UIDBase)
	}
	tb.checkHost(back)
}

// TestRestartReconciles: a new manager over the same store and host
// re-attaches to running and frozen sandboxes, keeps the others as they
// were, marks stopped one whose guest died meanwhile, and removes a
// half-made create and what no record names.
func TestRestartReconciles(t *testing.T) {
	tb := newTestbed(t)
	ctx := context.Background()
	byState := map[api.State]string{}
	for _, st := range []api.State{api.StateRunning, api.StateFrozen, api.StatePaused, api.StateStopped, api.StateFailed} {
		byState[st] = tb.into(st).ID
	}
	lost := tb.create().ID
	// A create cut short (recorded, never running) and a guest nobody
	// recorded.
	const halfMade = "halfmade0001"
	if err := tb.st.Put(bucket, halfMade, record{Sandbox: api.Sandbox{ID: halfMade, State: api.StateCreating}}); err != nil {
		t.Fatal(err)
	}
	stray, err := tb.rt.Start(ctx, tb.m.spec(&record{}, mustImage(t, tb.images)))
	if err != nil {
		t.Fatal(err)
	}

	tb.stop()
	tb.host.Kill(lost) // while the daemon is down
	tb.start()

	for st, id := range byState {
		sb := tb.get(id)
		if sb.State != st {
			t.Errorf("%s was %s, is %s after the restart", id, st, sb.State)
		}
		tb.checkHost(sb)
	}
	sb := tb.get(lost)
	if sb.State != lifecycle[api.StateRunning][actLost].to || sb.Error == "" {
		t.Errorf("a sandbox whose guest died while the daemon was down is %s (%q)", sb.State, sb.Error)
	}
	tb.checkHost(sb)
	if _, err := tb.m.Get(ctx, halfMade); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the half-made create: %v, want not found", err)
	}
	if left := tb.rt.Traces(stray.ID()); len(left) > 0 {
		t.Errorf("the unrecorded sandbox left %v", left)
	}
	// The re-attached ones answer to the manager.
	if _, err := tb.m.Thaw(ctx, byState[api.StateFrozen]); err != nil {
		t.Errorf("Thaw after a restart: %v", err)
	}
	if _, err := tb.m.Freeze(ctx, byState[api.StateRunning]); err != nil {
		t.Errorf("Freeze after a restart: %v", err)
	}
	for _, id := range []string{byState[api.StateFrozen], byState[api.StateRunning]} {
		tb.checkHost(tb.get(id))
	}
	// And a guest that dies now is noticed.
	id := byState[api.StateFrozen]
	tb.host.Kill(id)
	tb.waitState(id, api.StateFailed)
}

func mustImage(t *testing.T, images *image.Store) *image.Image {
	t.Helper()
	img, err := images.Get(image.HostImage)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRuntimeErrors: a runtime that fails leaves the sandbox as it was,
// in the record and on the host.
func TestRuntimeErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	failOn := func(tb *testbed, op string) {
		tb.rt.Fail = func(o, id string) error {
			if o == op {
				return boom
			}
			return nil
		}
	}
	t.Run("start", func(t *testing.T) {
		tb := newTestbed(t)
		failOn(tb, "start")
		for range tb.m.cfg.MaxSandboxes + 1 { // no uid range leaks
			if _, err := tb.m.Create(ctx, api.CreateRequest{}); !errors.Is(err, boom) {
				t.Fatalf("Create: %v, want %v", err, boom)
			}
		}
		if list := tb.m.List(ctx, Filter{}); len(list) != 0 {
			t.Fatalf("a failed create left %v", list)
		}
		tb.rt.Fail = nil
		tb.create()
	})
	for _, tc := range []struct {
		op   string
		from api.State
		call func(m *Manager, id string) error
	}{
		{"kill", api.StateRunning, calls[actStop]},
		{"kill", api.StateRunning, calls[actPause]},
		{"freeze", api.StateRunning, calls[actFreeze]},
		{"thaw", api.StateFrozen, calls[actThaw]},
		{"update", api.StateRunning, calls[actUpdate]},
		{"start", api.StatePaused, calls[actResume]},
	} {
		t.Run(tc.op+" from "+string(tc.from), func(t *testing.T) {
			tb := newTestbed(t)
			sb := tb.into(tc.from)
			failOn(tb, tc.op)
			if err := tc.call(tb.m, sb.ID); !errors.Is(err, boom) {
				t.Fatalf("%v, want %v", err, boom)
			}
			after := tb.get(sb.ID)
			if after.State != tc.from {
				t.Fatalf("a failed %s left the sandbox %s, was %s", tc.op, after.State, tc.from)
			}
			if after.Resources != sb.Resources {
				t.Fatalf("a failed %s changed the limits to %+v", tc.op, after.Resources)
			}
			tb.checkHost(after)
		})
	}
}

// TestConcurrentCalls: lifecycle calls racing on the same sandboxes end
// with records and host in agreement, and leave nothing once removed.
func TestConcurrentCalls(t *testing.T) {
	tb := newTestbed(t)
	ctx := context.Background()
	var ids []string
	for range 3 {
		ids = append(ids, tb.create().ID)
	}
	acts := []action{actStop, actPause, actResume, actFreeze, actThaw, actUpdate, actResume}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				id := ids[(w+i)%len(ids)]
				err := calls[acts[(w*7+i)%len(acts)]](tb.m, id)
				if err != nil && !errors.Is(err, errdefs.ErrConflict) {
					t.Errorf("%s: %v", id, err)
				}
				tb.m.List(ctx, Filter{})
				if _, err := tb.m.Get(ctx, id); err != nil {
					t.Errorf("Get %s: %v", id, err)
				}
			}
		}()
	}
	// Creates and removals of others meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 10 {
			sb, err := tb.m.Create(ctx, api.CreateRequest{})
			if err != nil {
				t.Errorf("Create: %v", err)
				return
			}
			if err := tb.m.Remove(ctx, sb.ID, true); err != nil {
				t.Errorf("Remove: %v", err)
			}
		}
	}()
	wg.Wait()
	for _, id := range ids {
		tb.checkHost(tb.get(id))
	}
	var removers sync.WaitGroup
	for _, id := range ids {
		for range 2 { // two removals of one sandbox: one wins
			removers.Add(1)
			go func() {
				defer removers.Done()
				if err := tb.m.Remove(ctx, id, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("Remove %s: %v", id, err)
				}
			}()
		}
	}
	removers.Wait()
	if list := tb.m.List(ctx, Filter{}); len(list) != 0 {
		t.Errorf("left after removing all: %v", list)
	}
	if err := tb.m.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if left, _ := tb.rt.Leftovers(); len(left) != 0 {
		t.Errorf("the host still has %v", left)
	}
}
