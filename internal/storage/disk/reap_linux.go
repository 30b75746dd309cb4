package disk

import (
	"context"
	"log/slog"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// maxReapers bounds the volumes removed at once. A removal is mostly
// waiting: the unmount commits the volume's journal and flushes it through
// both loop devices, 5 to 50 ms of I/O on a busy host for well under one
// of CPU, and concurrent flushes share the substrate's log forces. At 200
// removals a second that is up to 10 under way.
const maxReapers = 16

// refillNice is the scheduling priority of the threads that make volumes
// ahead of time, as the runtime's forker's: below the sandboxes, so a
// refill never takes the CPU they need, but not so low that a busy host
// starves it and every create makes its volume on the spot.
const refillNice = 10

// ioprioLow is IOPRIO_CLASS_BE at its lowest level, 7, for the refill's
// I/O.
const ioprioLow = 2<<13 | 7

// lowerPriority moves the calling goroutine to a thread of its own at
// refillNice and the lowest best-effort I/O priority. The thread is never
// unlocked: it exits with the goroutine, taking its priority with it.
func lowerPriority() {
	runtime.LockOSThread()
	unix.Setpriority(unix.PRIO_PROCESS, 0, refillNice) // 0: this thread
	unix.Syscall(unix.SYS_IOPRIO_SET, 1, 0, ioprioLow) // IOPRIO_WHO_PROCESS, this thread
}

// reaper tears volume directories down in the background, so that Remove
// costs its caller one rename. A directory handed to it is already out of
// every caller's reach (in trash, or a pool entry nobody will take), and
// its name is never used again, so nothing can be given out before it is
// clean: its loop device frees itself only once unmounted (autoclear), and
// a crash leaves it for the next NewPool's sweep.
type reaper struct {
	log *slog.Logger

	mu      sync.Mutex
	queue   []reapJob
	running int
	closed  bool
	wg      sync.WaitGroup
}

// reapJob is a directory to tear down, unless keep (if set) takes it
// back.
type reapJob struct {
	dir  string
	keep func(dir string) bool
}

// remove queues dir's teardown; after close it tears dir down before
// returning.
func (r *reaper) remove(dir string) { r.queueJob(reapJob{dir: dir}) }

// recycle queues dir for keep, and its teardown if keep does not take it.
func (r *reaper) recycle(dir string, keep func(dir string) bool) {
	r.queueJob(reapJob{dir: dir, keep: keep})
}

func (r *reaper) queueJob(j reapJob) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.do(j)
		return
	}
	r.queue = append(r.queue, j)
	if r.running < maxReapers {
		r.running++
		r.wg.Add(1)
		go r.work()
	}
	r.mu.Unlock()
}

// pending is how many teardowns are queued or under way.
func (r *reaper) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue) + r.running
}

func (r *reaper) work() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			// A burst's backing array goes with it: popped jobs
			// left in it would keep their directories' names (each
			// a removed sandbox's) alive (issue 21).
			r.queue = nil
			r.running--
			r.mu.Unlock()
			return
		}
		j := r.queue[0]
		r.queue[0] = reapJob{}
		r.queue = r.queue[1:]
		r.mu.Unlock()
		r.do(j)
	}
}

func (r *reaper) do(j reapJob) {
	if j.keep == nil || !j.keep(j.dir) {
		r.teardown(j.dir)
	}
}

func (r *reaper) teardown(dir string) {
	if err := teardown(context.Background(), dir, r.log); err != nil {
		r.log.Warn("removing disk", "path", dir, "err", err)
	}
}

// wait returns when every removal queued so far is done.
func (r *reaper) wait() { r.wg.Wait() }

// close waits for the removals under way; later ones run in the caller.
func (r *reaper) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}
