package guest

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"paddock/wire"
)

// TestSpareOutputPipes: a process's stdout and stderr pipes are made while
// the one before it started, and each still gets its own stream; the
// spare is one pair, not one per exec.
func TestSpareOutputPipes(t *testing.T) {
	s := procServer(t)
	var dials atomic.Int32
	c := NewClient(pairDialer(t, &dials, s.handle))
	t.Cleanup(c.Close)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	run := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, conn, err := c.Call(ctx, Request{Op: OpStart, Start: &StartRequest{
			Cmd: []string{"sh", "-c", "echo out; echo err >&2"}, Attach: true}})
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		var out, errOut strings.Builder
		for done := false; !done; {
			f, err := conn.Frames.Read()
			if err != nil {
				t.Fatalf("exec %d: %v", i, err)
			}
			switch f.Type {
			case wire.Stdout:
				out.Write(f.Payload)
			case wire.Stderr:
				errOut.Write(f.Payload)
			case wire.Exit:
				done = true
			}
		}
		conn.Release()
		conn.Close()
		if out.String() != "out\n" || errOut.String() != "err\n" {
			t.Errorf("exec %d: stdout %q, stderr %q; want \"out\\n\", \"err\\n\"", i, out.String(), errOut.String())
		}
	}

	run(0)
	spare := s.takeOutPipes()
	if spare == nil {
		t.Fatal("no spare stdout and stderr after an exec")
	}
	s.spare = spare // put back: the next exec takes it
	run(1)
	if next := s.takeOutPipes(); next == nil || next == spare {
		t.Errorf("the second exec did not take the spare and make another (spare %p, now %p)", spare, next)
	} else {
		s.spare = next
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
}
