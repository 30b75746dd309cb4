package fdnotify

import (
	"errors"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// pair returns the two ends of a unix stream connection.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		done <- c
	}()
	a, err = net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-done
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func newNotifier(t *testing.T) *Notifier {
	t.Helper()
	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func fired(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

func TestArmFiresOnInputOnce(t *testing.T) {
	n := newNotifier(t)
	a, b := pair(t)
	w, err := n.Watch(a)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 4)
	if err := w.Arm(func() { ch <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("fired with no input")
	}
	if w.Pending() != 0 {
		t.Fatalf("Pending = %d with no input", w.Pending())
	}
	b.Write([]byte("hi"))
	if !fired(ch, 5*time.Second) {
		t.Fatal("did not fire on input")
	}
	if got := w.Pending(); got != 2 {
		t.Fatalf("Pending = %d, want 2", got)
	}
	// One-shot: more input does not fire it again until re-armed.
	b.Write([]byte("more"))
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("fired twice on one Arm")
	}
	// Re-armed with input unread, it fires at once.
	if err := w.Arm(func() { ch <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if !fired(ch, 5*time.Second) {
		t.Fatal("re-armed with input waiting did not fire")
	}
	buf := make([]byte, 16)
	if k, _ := a.Read(buf); k != 6 {
		t.Fatalf("read %d bytes, want 6", k)
	}
	if err := w.Arm(func() { ch <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("fired after the input was read")
	}
	// The peer's close is input too: the reader sees the end.
	b.Close()
	if !fired(ch, 5*time.Second) {
		t.Fatal("did not fire when the peer closed")
	}
}

func TestManyConnectionsNoGoroutineEach(t *testing.T) {
	n := newNotifier(t)
	const k = 200
	before := runtime.NumGoroutine()
	peers := make([]net.Conn, k)
	ch := make(chan int, k)
	for i := range k {
		a, b := pair(t)
		peers[i] = b
		w, err := n.Watch(a)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Arm(func() { ch <- i }); err != nil {
			t.Fatal(err)
		}
	}
	if g := runtime.NumGoroutine(); g > before+5 {
		t.Fatalf("%d goroutines for %d armed watches (%d before)", g, k, before)
	}
	for i := k - 1; i >= 0; i-- {
		peers[i].Write([]byte{1})
	}
	seen := map[int]bool{}
	for range k {
		select {
		case i := <-ch:
			if seen[i] {
				t.Fatalf("watch %d fired twice", i)
			}
			seen[i] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d watches fired", len(seen), k)
		}
	}
}

func TestStopAndClose(t *testing.T) {
	n := newNotifier(t)
	a, b := pair(t)
	w, err := n.Watch(a)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{}, 1)
	if err := w.Arm(func() { ch <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	w.Stop()
	b.Write([]byte("x"))
	if fired(ch, 50*time.Millisecond) {
		t.Fatal("fired after Stop")
	}
	// A closed connection cannot be armed.
	a2, _ := pair(t)
	w2, err := n.Watch(a2)
	if err != nil {
		t.Fatal(err)
	}
	a2.Close()
	if err := w2.Arm(func() {}); err == nil {
		t.Fatal("armed a closed connection")
	}
	// A connection with no descriptor is refused.
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if _, err := n.Watch(p); !errors.Is(err, ErrNoDescriptor) {
		t.Fatalf("Watch(net.Pipe) = %v, want ErrNoDescriptor", err)
	}
	n.Close()
	a3, _ := pair(t)
	if _, err := n.Watch(a3); err == nil {
		t.Fatal("watched on a closed Notifier")
	}
}
