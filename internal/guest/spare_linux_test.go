package guest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// TestSpareOutputPipes: a process's stdout and stderr pipes are made ahead
// (after the exec before it), and each still gets its own stream; the
// spare is one pair, not one per exec.
func TestSpareOutputPipes(t *testing.T) {
	s, c := procClient(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	run := func(i int) {
		r := runAttachedAll(t, c, "sh", "-c", "echo out; echo err >&2")
		r.conn.Release()
		r.conn.Close()
		if r.stdout != "out\n" || r.stderr != "err\n" {
			t.Errorf("exec %d: stdout %q, stderr %q; want \"out\\n\", \"err\\n\"", i, r.stdout, r.stderr)
		}
	}

	// An attached start's spare is made after its exit frame is sent, so
	// the client can have its answer a moment before the spare exists.
	putSpare := func(out *outPipes) {
		s.spareMu.Lock()
		s.spare = out
		s.spareMu.Unlock()
	}
	waitSpare := func() *outPipes {
		deadline := time.Now().Add(5 * time.Second)
		for {
			if sp := s.takeOutPipes(); sp != nil || time.Now().After(deadline) {
				return sp
			}
			time.Sleep(time.Millisecond)
		}
	}

	run(0)
	spare := waitSpare()
	if spare == nil {
		t.Fatal("no spare stdout and stderr after an exec")
	}
	putSpare(spare) // put back: the next exec takes it
	run(1)
	if next := waitSpare(); next == nil || next == spare {
		t.Errorf("the second exec did not take the spare and make another (spare %p, now %p)", spare, next)
	} else {
		putSpare(next)
	}
	before := fds()
	for i := 2; i < 22; i++ {
		run(i)
	}
	// Pumps close their ends as they finish: allow them a moment.
	deadline := time.Now().Add(5 * time.Second)
	for fds() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := fds(); n > before {
		t.Errorf("%d open descriptors after 20 more execs, %d before", n, before)
	}
	// A detached start has no exit frame to wait for: it takes the spare
	// and makes the next one before it answers.
	taken := waitSpare()
	putSpare(taken)
	pid, err := c.Start(context.Background(), &guestapi.StartRequest{Cmd: []string{"true"}})
	if err != nil || pid <= 0 {
		t.Fatalf("detached start: pid %d, %v", pid, err)
	}
	if now := s.takeOutPipes(); now == nil || now == taken {
		t.Errorf("a detached start did not take the spare and make another (spare %p, now %p)", taken, now)
	} else {
		now.close()
	}
}

// TestOutputAtExit: everything a process wrote before it exited is in its
// stream, however much the pipe still held at the exit; and a background
// child that keeps the pipe open does not hold the stream open.
func TestOutputAtExit(t *testing.T) {
	_, c := procClient(t)

	// 3 MiB is more than the pipe holds: the last of it is read after
	// the exit, by finish rather than the pump.
	out, st, conn := runAttached(t, c, "sh", "-c", "head -c 3145728 /dev/zero | tr '\\0' x; echo; echo done")
	conn.Close()
	if st.ExitCode != 0 || len(out) != 3145728+len("\ndone\n") || !strings.HasSuffix(out, "x\ndone\n") {
		t.Errorf("3 MiB then exit: exit %d, %d bytes ending %q", st.ExitCode, len(out), out[max(0, len(out)-8):])
	}

	start := time.Now()
	r := runAttachedAll(t, c, "sh", "-c", "echo before; sleep 30 & echo after")
	r.conn.Close()
	// The sleep is in the shell's process group (the shell had a session
	// of its own): end it.
	unix.Kill(-r.pid, unix.SIGKILL)
	if d := time.Since(start); d > 10*time.Second || r.stdout != "before\nafter\n" || r.status.ExitCode != 0 {
		t.Errorf("a background child holding stdout: %q, exit %d after %v", r.stdout, r.status.ExitCode, d)
	}
}

// TestDrainOutputs: at the exit, finish reads what is left in each output
// itself, in order and typed, and stops the pump, which is still waiting
// on a pipe that a background child holds open.
func TestDrainOutputs(t *testing.T) {
	s := &server{}
	var ours [2]*os.File
	var theirs [2]*os.File
	for i := range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		ours[i], theirs[i] = r, w
		t.Cleanup(func() { w.Close(); r.Close() })
	}
	p := &process{out: newRing(1 << 20), outputs: ours[:]}
	theirs[0].WriteString("out")
	theirs[1].WriteString("err")
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		s.pump(p, ours[1], wire.Stderr) // reads "err", then waits: the pipe stays open
	}()
	deadline := time.Now().Add(5 * time.Second)
	for end, _ := p.out.stats(); end < 3 && time.Now().Before(deadline); end, _ = p.out.stats() {
		time.Sleep(time.Millisecond)
	}
	theirs[1].WriteString("!") // may go either way: the pump or the drain
	theirs[0].WriteString(" more")
	s.drainOutputs(p)
	select {
	case <-pumped:
	case <-time.After(5 * time.Second):
		t.Fatal("the pump did not stop after the drain")
	}
	theirs[1].WriteString("late") // after the drain: not the process's
	p.out.close(api.ExitStatus{})
	var stdout, stderr []byte
	c := p.out.attach(0)
	for {
		chunks, _, ex := p.out.next(c, nil, nil)
		for _, ch := range chunks {
			if ch.typ == wire.Stdout {
				stdout = append(stdout, ch.data...)
			} else {
				stderr = append(stderr, ch.data...)
			}
			p.out.advance(c, ch.off+int64(len(ch.data)))
		}
		if ex != nil {
			break
		}
	}
	if string(stdout) != "out more" || string(stderr) != "err!" {
		t.Errorf("stdout %q, stderr %q; want \"out more\", \"err!\"", stdout, stderr)
	}
}

// TestWarmUpLeavesNoFDs: the warm-up's throwaway server leaves none of
// its descriptors behind (its spare pipes among them).
func TestWarmUpLeavesNoFDs(t *testing.T) {
	s := procServer(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	devNull() // opened once and kept, by design
	before := fds()
	if err := warmUp(s.sp); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for fds() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := fds(); n > before {
		t.Errorf("%d open descriptors after the warm-up, %d before", n, before)
	}
}

// TestWarmUpProgramRuns: the warm-up's command, run by its
// /proc/self/fd path as the spawner runs it, exits 0, and its memfd can
// no longer be written.
func TestWarmUpProgramRuns(t *testing.T) {
	f := exitProgram()
	if f == nil {
		t.Skip("no exit program for this architecture")
	}
	defer f.Close()
	if out, err := exec.Command(fmt.Sprintf("/proc/self/fd/%d", f.Fd())).CombinedOutput(); err != nil {
		t.Fatalf("running the warm-up program: %v (%q)", err, out)
	}
	if _, err := f.WriteAt([]byte{0}, 0); err == nil {
		t.Error("the warm-up program's memfd is writable")
	}
}
