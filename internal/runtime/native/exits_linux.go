package native

import (
	"fmt"
	"os"
	"sync"

	"github.com/paddock-dev/paddock/internal/fdnotify"
)

// exits waits for the exits of every guest in one goroutine: their
// pidfds are in one fdnotify set, so a guest that runs for hours costs
// the daemon no goroutine. With one goroutine per guest parked on its
// pidfd, a thousand idle sandboxes kept a thousand goroutines and
// netpoller descriptors, which the Go runtime never frees, and the
// daemon stayed larger after they were removed (issue 21).
var exits = sync.OnceValues(fdnotify.New)

// watchExit runs exited, in a goroutine of its own, once the process of
// pidfd has exited (at once if it has). The returned watch is stopped by
// exited before it closes pidfd, which must stay open until then.
func watchExit(pidfd *os.File, exited func()) (*fdnotify.Watch, error) {
	n, err := exits()
	if err != nil {
		return nil, fmt.Errorf("watching guests' exits: %w", err)
	}
	w, err := n.WatchFile(pidfd)
	if err != nil {
		return nil, fmt.Errorf("watching the guest's exit: %w", err)
	}
	if err := w.Arm(exited); err != nil {
		w.Stop()
		return nil, fmt.Errorf("watching the guest's exit: %w", err)
	}
	return w, nil
}
