package guest

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/guestapi"
)

// TestForwardSignals: a signal PID 1 gets (sent here on the channel that
// notifySignals gives serve) reaches every running process, which dies of
// it; the channel is the guest's from its start, not made when it serves.
func TestForwardSignals(t *testing.T) {
	s, c := procClient(t)
	pid, err := c.Start(context.Background(), &guestapi.StartRequest{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.lookup(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(-p.pid, unix.SIGKILL) })

	ch := make(chan os.Signal, 1)
	defer close(ch)
	go s.forwardSignals(ch)
	ch <- unix.SIGUSR1
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the forwarded SIGUSR1 did not end sleep in 10 s")
	}
	p.mu.Lock()
	ws := *p.status
	p.mu.Unlock()
	if !ws.Signaled() || ws.Signal() != unix.SIGUSR1 {
		t.Errorf("sleep ended with %v, want killed by SIGUSR1", ws)
	}
}
