package guest

import (
	"bytes"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
)

func collect(t *testing.T, r *ring, off int64) (out []byte, lost int64, exit *api.ExitStatus) {
	t.Helper()
	c := r.attach(off)
	defer r.detach(c)
	for {
		chunks, l, ex := r.next(c, nil, nil)
		lost += l
		for _, ch := range chunks {
			out = append(out, ch.data...)
			r.advance(c, ch.off+int64(len(ch.data)))
		}
		if ex != nil {
			return out, lost, ex
		}
	}
}

func TestRingReplayFromOffsets(t *testing.T) {
	r := newRing(1 << 20)
	r.append(wire.Stdout, []byte("hello "))
	r.append(wire.Stderr, []byte("world"))
	r.close(api.ExitStatus{ExitCode: 3})
	for _, tc := range []struct {
		off  int64
		want string
	}{{0, "hello world"}, {6, "world"}, {8, "rld"}, {11, ""}, {99, ""}} {
		got, lost, ex := collect(t, r, tc.off)
		if string(got) != tc.want || lost != 0 || ex.ExitCode != 3 {
			t.Errorf("from %d: got %q lost %d exit %+v, want %q", tc.off, got, lost, ex, tc.want)
		}
	}
}

func TestRingDropsOldestWithoutReaders(t *testing.T) {
	r := newRing(10)
	for i := 0; i < 5; i++ {
		r.append(wire.Stdout, []byte("abcd"))
	}
	r.close(api.ExitStatus{})
	end, dropped := r.stats()
	if end != 20 || dropped < 10 {
		t.Fatalf("end %d dropped %d, want 20 and at least 10", end, dropped)
	}
	got, lost, _ := collect(t, r, 0)
	if int64(len(got))+lost != 20 || lost != dropped {
		t.Fatalf("replay from 0: %d bytes, %d lost (dropped %d)", len(got), lost, dropped)
	}
	if !bytes.HasSuffix([]byte("abcdabcdabcdabcdabcd"), got) {
		t.Fatalf("replay %q is not the tail of the output", got)
	}
}

func TestRingBackpressureForAttachedReader(t *testing.T) {
	r := newRing(8)
	c := r.attach(0)
	r.append(wire.Stdout, []byte("12345678"))
	done := make(chan struct{})
	go func() {
		r.append(wire.Stdout, []byte("9")) // would evict unread bytes
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("append evicted bytes an attached reader had not read")
	case <-time.After(50 * time.Millisecond):
	}
	chunks, lost, _ := r.next(c, nil, nil)
	if lost != 0 || len(chunks) != 1 || string(chunks[0].data) != "12345678" {
		t.Fatalf("next = %v lost %d", chunks, lost)
	}
	r.advance(c, 8)
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("append still blocked after the reader caught up")
	}
	r.detach(c)
}

func TestRingNextCancels(t *testing.T) {
	r := newRing(8)
	c := r.attach(0)
	cancel := make(chan struct{})
	res := make(chan bool)
	go func() {
		chunks, lost, ex := r.next(c, cancel, nil)
		res <- chunks == nil && lost == 0 && ex == nil
	}()
	time.Sleep(20 * time.Millisecond)
	close(cancel)
	r.wake()
	select {
	case ok := <-res:
		if !ok {
			t.Fatal("cancelled next returned data")
		}
	case <-time.After(time.Second):
		t.Fatal("next did not return after cancel")
	}
}

func TestParseSignal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{{"TERM", 15, true}, {"SIGKILL", 9, true}, {"int", 2, true}, {"9", 9, true}, {"0", 0, false}, {"65", 0, false}, {"NOPE", 0, false}} {
		got, err := parseSignal(tc.in)
		if (err == nil) != tc.ok || (tc.ok && int(got) != tc.want) {
			t.Errorf("parseSignal(%q) = %d, %v", tc.in, got, err)
		}
	}
}

func TestMergeEnvAndLookPath(t *testing.T) {
	env := mergeEnv([]string{"A=1", "PATH=/bin"}, []string{"A=2", "B=3"})
	if got := envValue(env, "A"); got != "2" || len(env) != 3 {
		t.Fatalf("mergeEnv = %v", env)
	}
	if _, err := lookPath("sh", "/nonexistent:/bin:/usr/bin", "/"); err != nil {
		t.Fatalf("lookPath(sh): %v", err)
	}
	if _, err := lookPath("no-such-command-xyz", "/bin:/usr/bin", "/"); err == nil {
		t.Fatal("lookPath of a missing command succeeded")
	}
	if _, err := lookPath("/etc/passwd", "", "/"); err == nil {
		t.Fatal("lookPath of a non-executable file succeeded")
	}
}
