package native

import (
	"os"
	goruntime "runtime"
	"testing"
	"time"
)

// TestForkerOutlivesItsStarter: the forker's death signal follows the
// thread that started it, and the daemon ends threads (a goroutine that
// returns locked to its thread: namespace work, the memory trim). A
// forker started from a thread that then ends keeps running; one that is
// killed is seen dead at once, not taken for alive while a zombie.
func TestForkerOutlivesItsStarter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the forker runs in a mount namespace of its own)")
	}
	exe, err := sealedSelf(guestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	got := make(chan *forker, 1)
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // returns locked: this thread ends
		f, err := startForker(exe)
		if err != nil {
			errc <- err
			return
		}
		got <- f
	}()
	var f *forker
	select {
	case err := <-errc:
		t.Fatal(err)
	case f = <-got:
	}
	t.Cleanup(f.close)
	// The starting goroutine's thread has ended; a death signal tied to
	// it would have come by now.
	time.Sleep(200 * time.Millisecond)
	if !f.alive() {
		t.Fatal("the forker died with the thread that started it")
	}
	f.cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for f.alive() {
		if time.Now().After(deadline) {
			t.Fatal("a killed forker is still taken for alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
