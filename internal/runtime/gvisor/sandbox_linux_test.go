package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
)

// TestSandboxHandOver: while a Sandbox's sentry is replaced (leave, the
// old one's exit, arrive), its Done does not fire and nothing hears of an
// exit; then it watches the new process (State, Info, Kill), whose exit
// ends it once. A replacement that fails (end) ends it too.
func TestSandboxHandOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a cgroup)")
	}
	parent := fmt.Sprintf("paddock-gvisor-test-%d", rand.IntN(1<<30))
	cgroups, err := cgroup.NewManager(parent, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroups.Remove(); err != nil {
			t.Errorf("removing cgroup parent %s: %v", parent, err)
		}
	})
	cg, err := cgroups.Create("sb", cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Delete(context.Background()) })
	// sentry starts a stand-in sentry (our child, reaped as it exits).
	sentry := func() int {
		t.Helper()
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill() })
		go cmd.Wait()
		return cmd.Process.Pid
	}
	ended := func(sb *Sandbox) bool {
		select {
		case <-sb.done:
			return true
		default:
			return false
		}
	}
	r := &Runtime{live: map[string]*Sandbox{}}
	newSandbox := func() (*Sandbox, *atomic.Int32) {
		sb, err := r.watch("sb", sentry(), cg)
		if err != nil {
			t.Fatal(err)
		}
		var exits atomic.Int32
		sb.OnExit(func() { exits.Add(1) })
		return sb, &exits
	}

	sb, exits := newSandbox()
	first := sb.Info().HostPID
	left, err := sb.leave()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.leave(); err == nil {
		t.Fatal("a second leave during a hand-over succeeded")
	}
	if err := sb.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-left:
	case <-time.After(10 * time.Second):
		t.Fatal("the old process's exit was not seen")
	}
	time.Sleep(50 * time.Millisecond)
	if ended(sb) || exits.Load() != 0 {
		t.Fatalf("the hand-over ended the sandbox: done %v, exits %d", ended(sb), exits.Load())
	}
	if !sb.awaiting() {
		t.Fatal("the sandbox does not await its new sentry")
	}
	// restoreRun's watch of the new sentry finds the sandbox awaiting it.
	second := sentry()
	if got, err := r.watch("sb", second, cg); err != nil || got != sb {
		t.Fatalf("watch of the new sentry: %p, %v; want the sandbox %p", got, err, sb)
	}
	if sb.awaiting() {
		t.Fatal("the sandbox awaits a sentry after its arrival")
	}
	var st state
	if err := json.Unmarshal(sb.State(), &st); err != nil || st.PID != second || sb.Info().HostPID != second || second == first {
		t.Fatalf("after the hand-over: state %+v (%v), host pid %d; want %d", st, err, sb.Info().HostPID, second)
	}
	if err := sb.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the new process's exit did not end the sandbox")
	}
	time.Sleep(50 * time.Millisecond)
	if n := exits.Load(); n != 1 {
		t.Fatalf("%d exits heard, want 1", n)
	}
	if _, err := sb.leave(); err == nil {
		t.Fatal("leave of an ended sandbox succeeded")
	}
	r.mu.Lock()
	_, listed := r.live["sb"]
	r.mu.Unlock()
	if listed {
		t.Fatal("an ended sandbox is still listed as live")
	}

	// A replacement that does not arrive.
	sb, exits = newSandbox()
	left, err = sb.leave()
	if err != nil {
		t.Fatal(err)
	}
	sb.Kill()
	<-left
	sb.end()
	if !ended(sb) {
		t.Fatal("end did not end the sandbox")
	}
	time.Sleep(50 * time.Millisecond)
	if n := exits.Load(); n != 1 {
		t.Fatalf("%d exits heard after end, want 1", n)
	}
}
