package disk

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Backing. With an overcommit of 1 a disk gets its blocks when it is
// handed out, not while it waits in the pool: ready disks promised to
// nobody would otherwise hold their whole size of the host's disk (4
// ready disks of 10 GiB: 40 GiB) and starve everyone else on it. reserve
// admits a disk with the free space covering it and every disk not yet
// backed (they count as promised while their image has holes), and the
// backer allocates its image behind the hand-out: a 10 GiB fallocate and
// the host's blocks under it on the XFS image cost 3-100 ms, more than
// the rest of a create. A disk removed before its turn is skipped.
//
// What is not covered: space a neighbour takes on the host between the
// hand-out and the backing (milliseconds, one disk at a time behind
// creates). A disk the backer cannot back stays thin: it is logged and
// counted in Space.Short, as with an overcommit above 1.

// backer allocates the images of handed-out disks, one at a time, at the
// refill's low priority.
type backer struct {
	pool *Pool

	mu      sync.Mutex
	queue   []*os.File
	running bool
	done    sync.Cond // broadcast when the queue empties, with mu
}

// add queues the image f (its open file: it may be renamed meanwhile) to
// be allocated; the backer closes it.
func (b *backer) add(f *os.File) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, f)
	if !b.running {
		b.running = true
		go b.work()
	}
}

func (b *backer) work() {
	lowerPriority()
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.queue = nil // nor the files it held (as reaper.work)
			b.running = false
			b.done.Broadcast()
			b.mu.Unlock()
			return
		}
		f := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		b.mu.Unlock()
		if err := b.pool.back(f); err != nil {
			b.pool.log.Warn("backing disk: it stays thin", "image", f.Name(), "err", err)
		}
		f.Close()
	}
}

// wait returns once every queued image is allocated.
func (b *backer) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.running {
		b.done.Wait()
	}
}

// backLater queues the image img for the backer if it lacks blocks.
func (p *Pool) backLater(img string) {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		p.log.Warn("backing disk", "image", img, "err", err)
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Blocks*512 >= st.Size {
		f.Close()
		return
	}
	p.backer.add(f)
}

// back allocates the image f if it is still a handed-out disk's.
func (p *Pool) back(f *os.File) error {
	path, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return fmt.Errorf("locating disk image: %w", err)
	}
	if !strings.HasPrefix(path, p.volDir+"/") {
		return nil // removed since
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("inspecting disk image: %w", err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, st.Size); err != nil {
		return fmt.Errorf("allocating disk image: %w", err)
	}
	if s := p.cfg.Substrate; s != nil && s.mode == SubstrateXFSImage {
		if err := s.back(f); err != nil {
			return err
		}
	}
	return nil
}
