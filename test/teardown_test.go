package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// A removal answers once it is recorded and the sandbox's guest killed;
// the rest of the teardown follows in the background (docs/ARCHITECTURE.md,
// "State and restarts"). These tests check that nothing is lost or reused
// on the way.

// TestDeleteThenCreate: a sandbox created right after another's removal
// answered works, never shares an id or a uid range with a sandbox whose
// traces are still on the host, and the removed one's processes no longer
// run once its removal has answered.
func TestDeleteThenCreate(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	ctx := t.Context()
	c := d.Client()
	prev := d.get(d.Create(api.CreateRequest{}))
	var removed []*api.Sandbox
	for i := range 25 {
		if err := c.Delete(ctx, prev.ID, true); err != nil {
			t.Fatalf("round %d: delete: %v", i, err)
		}
		if !killed(prev) {
			t.Errorf("round %d: the removed sandbox's guest %d is neither gone nor being killed after the answer", i, prev.Runtime.HostPID)
		}
		removed = append(removed, prev)
		sb := d.get(d.Create(api.CreateRequest{}))
		for j, old := range removed {
			if sb.ID == old.ID {
				t.Fatalf("round %d: id %s handed out again", i, sb.ID)
			}
			// Those removed rounds ago are long clean (checked at the
			// end); looking at each costs a second when uids match.
			if j >= len(removed)-3 && sb.Runtime.UIDBase == old.Runtime.UIDBase {
				if left := tracesBesides(d, old, sb); len(left) > 0 {
					t.Errorf("round %d: uid range %d handed to %s while %s still has %v", i, sb.Runtime.UIDBase, sb.ID, old.ID, left)
				}
			}
		}
		if out := d.Sh(sb.ID, "echo hi"); out != "hi\n" {
			t.Fatalf("round %d: echo hi printed %q", i, out)
		}
		if _, err := c.Get(ctx, prev.ID); !client.IsNotFound(err) {
			t.Errorf("round %d: Get of the removed %s: %v, want not found", i, prev.ID, err)
		}
		prev = sb
	}
	if err := c.Delete(ctx, prev.ID, true); err != nil {
		t.Fatal(err)
	}
	for _, sb := range append(removed, prev) {
		if left := d.traces(sb); len(left) > 0 {
			t.Errorf("%s left %v", sb.ID, left)
		}
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Errorf("the daemon keeps %v", left)
	}
}

// killed reports whether sb's guest is gone, a zombie, or has a SIGKILL
// pending (it dies on its way back to user space: nothing of its own runs
// again).
func killed(sb *api.Sandbox) bool {
	pid := sb.Runtime.HostPID
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true
	}
	if uid, err := procUID(pid); err != nil || uid != sb.Runtime.UIDBase {
		return true // another process now
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "Z") || strings.HasPrefix(v, "X") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(v, 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// tracesBesides is what the host still has of old, leaving out what
// belongs to sb, which may have been given old's uid range (legitimately,
// once old was clean).
func tracesBesides(d *Daemon, old, sb *api.Sandbox) []string {
	var left []string
	for _, l := range d.tracesOnce(old) {
		if !strings.Contains(l, sb.ID) {
			left = append(left, l)
		}
	}
	return left
}

// TestKillDuringDeletes: kill -9 of the daemon while 50 removals run.
// After the restart, every removal that answered stays done, the others
// can be done again, and once they are, nothing of any of the sandboxes
// is left; meanwhile no sandbox made after the restart gets a uid range
// of one whose traces are still on the host.
func TestKillDuringDeletes(t *testing.T) {
	t.Parallel()
	const n = 50
	d := newDaemon(t)
	ctx := t.Context()
	var sbs []*api.Sandbox
	for range n {
		// Small disks: fifty default ones are more than a shared host promises.
		sbs = append(sbs, d.get(d.Create(api.CreateRequest{Resources: api.Resources{DiskBytes: 64 << 20}})))
	}
	c := d.Client()
	answered := make([]bool, n)
	var wg sync.WaitGroup
	start, first := make(chan struct{}), make(chan struct{})
	var firstOnce sync.Once
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answered[i] = c.Delete(ctx, sb.ID, true) == nil
			if answered[i] {
				firstOnce.Do(func() { close(first) })
			}
		}()
	}
	var guests []int
	for _, sb := range sbs {
		guests = append(guests, sb.Runtime.HostPID)
	}
	kill := d.killer(guests)
	close(start)
	// Killed at the first answer: the teardowns behind the answers have
	// begun, and most removals are still on their way (a fixed pause
	// could, on a loaded host, end after every answered teardown).
	select {
	case <-first:
	case <-time.After(10 * time.Second):
	}
	kill()
	wg.Wait()
	// The answered removals whose teardown the killed daemon did not
	// finish (its last step logs "teardown phases" with "unrecorded"):
	// the restarted daemon must take those up.
	killedLog := d.Log()
	done, unfinished := 0, 0
	for i, a := range answered {
		if !a {
			continue
		}
		done++
		if !regexp.MustCompile(`"teardown phases" (.* )?sandbox=` + regexp.QuoteMeta(sbs[i].ID) + ` .*unrecorded=`).MatchString(killedLog) {
			unfinished++
		}
	}
	t.Logf("%d of %d removals answered before the kill, %d of them not torn down", done, n, unfinished)
	d.Start()
	if unfinished > 0 && !strings.Contains(d.Log(), "finishing the teardown of a removed sandbox") {
		t.Errorf("the restarted daemon took up no teardown:\n%s", d.Log())
	}

	// New sandboxes while the restarted daemon finishes the teardowns.
	var fresh []*api.Sandbox
	for range 5 {
		fresh = append(fresh, d.get(d.Create(api.CreateRequest{})))
	}
	for _, f := range fresh {
		for _, old := range sbs {
			if f.ID == old.ID {
				t.Errorf("id %s handed out again after the restart", f.ID)
			}
			if f.Runtime.UIDBase == old.Runtime.UIDBase {
				if left := tracesBesides(d, old, f); len(left) > 0 {
					t.Errorf("uid range %d handed to %s while %s still has %v", f.Runtime.UIDBase, f.ID, old.ID, left)
				}
			}
		}
	}
	for i, sb := range sbs {
		_, err := c.Get(ctx, sb.ID)
		switch {
		case answered[i] && !client.IsNotFound(err):
			t.Errorf("%s: removal answered before the kill, but after the restart Get says %v", sb.ID, err)
		case err == nil:
			if err := c.Delete(ctx, sb.ID, true); err != nil {
				t.Errorf("%s: removal after the restart: %v", sb.ID, err)
			}
		case !client.IsNotFound(err):
			t.Errorf("%s: Get after the restart: %v", sb.ID, err)
		}
	}
	for _, f := range fresh {
		if err := c.Delete(ctx, f.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, sb := range append(sbs, fresh...) {
		if left := d.traces(sb); len(left) > 0 {
			t.Errorf("%s left %v", sb.ID, left)
		}
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Errorf("the daemon keeps %v", left)
	}
	if list, err := c.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("sandboxes listed after removing all: %v %v", list, err)
	}
	// No record is left either: a restart finds nothing to tear down or
	// re-attach.
	d.Stop()
	d.Start()
	if list, err := c.List(ctx, client.ListOptions{}); err != nil || len(list) != 0 {
		t.Errorf("sandboxes listed after another restart: %v %v", list, err)
	}
	if strings.Contains(d.Log(), "tearing down") || strings.Contains(d.Log(), "re-attached") {
		t.Errorf("the second restart found records:\n%s", d.Log())
	}
}

// TestTeardownFailsThenRecovers: a removal whose teardown fails (its run
// directory holds a mount, so it cannot be removed) still answers, and
// the sandbox is gone from the API; the failure is logged and retried,
// across a kill -9 of the daemon too, and once the mount is gone the
// teardown completes.
func TestTeardownFailsThenRecovers(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	ctx := t.Context()
	sb := d.get(d.Create(api.CreateRequest{}))
	busy := filepath.Join(d.RunDir, "sandboxes", sb.ID, "busy")
	if err := os.Mkdir(busy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("paddock-test", busy, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	unmounted := false
	unmount := func() {
		if !unmounted {
			unmounted = true
			if err := syscall.Unmount(busy, 0); err != nil {
				t.Errorf("unmounting %s: %v", busy, err)
			}
		}
	}
	t.Cleanup(unmount)
	c := d.Client()
	if err := c.Delete(ctx, sb.ID, true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.Get(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("Get after delete: %v, want not found", err)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(d.Log(), "tearing down a removed sandbox; retrying") }) {
		t.Fatalf("the failing teardown was not reported:\n%s", d.Log())
	}
	if !killed(sb) {
		t.Errorf("the guest of a sandbox whose teardown fails still runs")
	}
	// Across a restart: the record keeps the removal.
	d.Kill9()
	d.Start()
	if _, err := c.Get(ctx, sb.ID); !client.IsNotFound(err) {
		t.Errorf("Get after the restart: %v, want not found", err)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return strings.Contains(d.Log(), "tearing down a removed sandbox; retrying") }) {
		t.Fatalf("the restarted daemon did not take the teardown up:\n%s", d.Log())
	}
	unmount()
	if left := d.traces(sb); len(left) > 0 {
		// The retries back off: 1 s, 2 s, 4 s.
		if !waitFor(10*time.Second, 100*time.Millisecond, func() bool { return len(d.tracesOnce(sb)) == 0 }) {
			t.Errorf("after the mount went, the teardown left %v", d.tracesOnce(sb))
		}
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Errorf("the daemon keeps %v", left)
	}
}

// TestCreateDisconnects: clients that give up on a create at various
// moments leave no orphan: each create either finished (the sandbox is
// listed, works and can be removed) or left nothing.
func TestCreateDisconnects(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	delays := []time.Duration{0, 100 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond}
	var wg sync.WaitGroup
	for i, delay := range delays {
		for _, disk := range []int64{0, 48 << 20} { // a warm guest's, and one bound now
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), delay)
				defer cancel()
				// Any error: the client gave up (or did not get as far
				// as the daemon).
				c.Create(ctx, api.CreateRequest{Resources: api.Resources{DiskBytes: disk}, Labels: map[string]string{"n": fmt.Sprint(i)}})
			}()
		}
	}
	wg.Wait()
	// Creates the daemon went on with finish meanwhile.
	time.Sleep(2 * time.Second)
	list, err := c.List(t.Context(), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d creates given up on finished anyway", len(list), 2*len(delays))
	for _, sb := range list {
		if sb.State != api.StateRunning {
			t.Errorf("%s is %s", sb.ID, sb.State)
			continue
		}
		if out := d.Sh(sb.ID, "echo ok"); out != "ok\n" {
			t.Errorf("%s: %q", sb.ID, out)
		}
		if err := c.Delete(t.Context(), sb.ID, true); err != nil {
			t.Errorf("removing %s: %v", sb.ID, err)
		}
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Errorf("creates given up on left %v", left)
	}
}

// TestOverloadLeavesNothing: creates past admission are refused with 503
// naming the resource, at once and many together, and leave nothing half
// made; removals give the capacity back at once.
func TestOverloadLeavesNothing(t *testing.T) {
	t.Parallel()
	d := newDaemon(t, "--admission-memory", "2g", "--memory-overcommit", "1")
	const mem = 256 << 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []string
	refused := 0
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := d.do("POST", "/v1/sandboxes", fmt.Sprintf(`{"resources":{"memory_bytes":%d}}`, mem))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case a.Status == 201:
				var sb api.Sandbox
				if err := json.Unmarshal(a.Body, &sb); err != nil {
					t.Errorf("create answer: %v", err)
					return
				}
				made = append(made, sb.ID)
			case a.Status == 503 && strings.Contains(a.apiError(t).Message, "memory"):
				refused++
			default:
				t.Errorf("create: %d %s", a.Status, a.Body)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d made, %d refused", len(made), refused)
	if refused == 0 {
		t.Fatal("nothing was refused past admission")
	}
	list, err := d.Client().List(t.Context(), client.ListOptions{})
	if err != nil || len(list) != len(made) {
		t.Fatalf("listed %d sandboxes, %d creates answered 201 (%v)", len(list), len(made), err)
	}
	// A removal gives its share back at once: a create right after it
	// is admitted.
	if err := d.Client().Delete(t.Context(), made[0], true); err != nil {
		t.Fatal(err)
	}
	a := d.do("POST", "/v1/sandboxes", fmt.Sprintf(`{"resources":{"memory_bytes":%d}}`, mem))
	if a.Status != 201 {
		t.Errorf("create right after a removal freed its share: %d %s", a.Status, a.Body)
	}
	list, _ = d.Client().List(t.Context(), client.ListOptions{})
	for _, sb := range list {
		if err := d.Client().Delete(t.Context(), sb.ID, true); err != nil {
			t.Error(err)
		}
	}
	if left := d.daemonTraces(); len(left) > 0 {
		t.Errorf("left after an overload: %v", left)
	}
}
