package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

const (
	// Refill backs off from refillBackoffMin to refillBackoffMax while
	// making volumes fails (host disk full, no loop devices, ...).
	refillBackoffMin = 250 * time.Millisecond
	refillBackoffMax = 30 * time.Second

	// refillWorkers is how many volumes the refill makes at once.
	refillWorkers = 4

	// spaceRetry is how often a refill held back by the storage's free
	// space (claim) looks again.
	spaceRetry = time.Second
)

var errClosed = fmt.Errorf("%w: disk pool is closed", errdefs.ErrUnavailable)

// Pool hands out volumes, keeping Config.PoolSize ready ones of the default
// size. Only one Pool (one process) may own a Dir at a time.
type Pool struct {
	cfg  Config
	log  *slog.Logger
	lock *durable.Lock // on Dir

	poolDir, volDir, trashDir string

	seq atomic.Uint64 // names pool and trash entries

	mu     sync.Mutex
	ready  []*entry
	closed bool
	// clones are ready clones of snapshot images by path, recent the
	// sources AcquireFrom used lately (oldest first), cloning the sources
	// whose clone is being made (clones_linux.go).
	clones  map[string]*readyClone
	recent  []string
	cloning map[string]bool
	cloneWG sync.WaitGroup
	// seeds are the snapshot images used to make volumes by path
	// (seed_linux.go).
	seeds map[string]*seed

	// volMu serialises Open's re-mount with other Opens and with Remove's
	// rename, so a volume is never mounted twice nor re-mounted in trash.
	// It also guards snapping: the ids Snapshot is capturing, each with a
	// channel closed when it is done, which Remove waits for.
	volMu    sync.Mutex
	snapping map[string]chan struct{}

	// copyOpts say how Snapshot and AcquireFrom clone images.
	copyOpts cloneOptions

	pristines *pristines // the images new volumes are cloned from

	// making counts the volumes refill workers are making (guarded by
	// mu): with ready, what the pool will soon hold.
	making int
	// recycling counts the removed volumes being wiped to go back to
	// the pool (recycle_linux.go), which the refill counts on too.
	recycling int
	// lastMade is when the refill last made a volume and surge how
	// many ready volumes beyond recycleFactor times PoolSize the pool
	// keeps of those given back (wantsOrSurges); both guarded by mu.
	lastMade time.Time
	surge    int
	wake     chan struct{} // pokes refill; buffered 1
	cancel   context.CancelFunc
	refillWG sync.WaitGroup

	reaper reaper // removes volumes off the callers' paths
	backer backer // allocates handed-out volumes behind the hand-out
}

// entry is a mounted volume in Dir/pool.
type entry struct {
	dir    string
	device string
	size   int64
}

// NewPool takes ownership of cfg.Dir: it creates it, sweeps the pool and
// trash entries an earlier process left (handed-out volumes are kept for
// Open) and starts refilling the pool in the background.
func NewPool(cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	mkfs, err := findMkfs(cfg.Mkfs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("making disk dir: %w", err)
	}
	// Loop devices report canonical backing paths; compare against those.
	if cfg.Dir, err = filepath.EvalSymlinks(cfg.Dir); err != nil {
		return nil, fmt.Errorf("resolving disk dir: %w", err)
	}
	if s := cfg.Substrate; s != nil && cfg.Dir != s.Dir() && !strings.HasPrefix(cfg.Dir, s.Dir()+"/") {
		return nil, errdefs.Invalid("dir", "%s is not on the substrate %s", cfg.Dir, s.Dir())
	}
	p := &Pool{
		cfg:      cfg,
		log:      cfg.Logger,
		poolDir:  filepath.Join(cfg.Dir, "pool"),
		volDir:   filepath.Join(cfg.Dir, "vol"),
		trashDir: filepath.Join(cfg.Dir, "trash"),
		snapping: make(map[string]chan struct{}),
		clones:   map[string]*readyClone{},
		cloning:  map[string]bool{},
		seeds:    map[string]*seed{},
		copyOpts: cloneOptions{copyOnly: cfg.Substrate != nil && !cfg.Substrate.Reflink()},
		wake:     make(chan struct{}, 1),
	}
	p.reaper.log = cfg.Logger
	p.backer.pool = p
	p.backer.done.L = &p.backer.mu
	// vol is searchable by all so a sandbox's user can reach its own
	// mountpoint by path; pool and trash are root's alone.
	for dir, mode := range map[string]os.FileMode{p.poolDir: 0o700, p.trashDir: 0o700, p.volDir: 0o711} {
		if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("making disk dir: %w", err)
		}
	}
	if p.lock, err = durable.LockDir(cfg.Dir); err != nil {
		return nil, err
	}
	p.sweep()
	p.thawStale()
	if p.pristines, err = openPristines(filepath.Join(cfg.Dir, pristineDir), mkfs); err != nil {
		p.lock.Unlock()
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	if cfg.PoolSize > 0 {
		p.refillWG.Add(1)
		go p.refill(ctx)
	}
	return p, nil
}

// sweep removes what an earlier process left in pool and trash. It logs
// what it cannot remove and carries on: a stuck leftover must not keep the
// daemon from starting. New entry names start above the leftovers' so they
// never collide.
func (p *Pool) sweep() {
	for _, dir := range []string{p.poolDir, p.trashDir} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			p.log.Warn("listing stale disks", "dir", dir, "err", err)
			continue
		}
		for _, e := range ents {
			if n, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && n > p.seq.Load() {
				p.seq.Store(n)
			}
			path := filepath.Join(dir, e.Name())
			if err := teardown(context.Background(), path, p.log); err != nil {
				p.log.Warn("removing stale disk", "path", path, "err", err)
				continue
			}
			p.log.Info("removed stale disk", "path", path)
		}
	}
}

// refill keeps PoolSize volumes ready, making up to refillWorkers at
// once, each on a thread of its own at low priority (refillNice): making
// a volume is mostly waiting for the storage (the mount reads and writes
// its superblock through two loop devices), so several at once make
// several times as many (BenchmarkPoolRefill: 250 disks/s with four on a
// busy host, 26 made one at a time by mkfs), and the running sandboxes
// come first. While making fails it
// backs off, and tries one volume at a time until one is made.
func (p *Pool) refill(ctx context.Context) {
	defer p.refillWG.Done()
	jobs := make(chan struct{})
	results := make(chan error)
	for range refillWorkers {
		p.refillWG.Add(1)
		go p.refillWorker(ctx, jobs, results)
	}
	busy, limit := 0, refillWorkers
	backoff := time.Duration(0)
	var retry <-chan time.Time
	for {
		for retry == nil && busy < limit {
			ok, short := p.claim()
			if short {
				retry = time.After(spaceRetry)
			}
			if !ok {
				break
			}
			select {
			case jobs <- struct{}{}: // a worker is idle: busy < refillWorkers
			case <-ctx.Done():
				return
			}
			busy++
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry:
			retry = nil
		case err := <-results:
			busy--
			switch {
			case err == nil:
				backoff, limit = 0, refillWorkers
			case ctx.Err() != nil:
				return
			default:
				backoff = min(max(2*backoff, refillBackoffMin), refillBackoffMax)
				limit = 1
				p.log.Warn("refilling disk pool", "err", err, "retry_in", backoff)
				retry = time.After(backoff)
			}
		}
	}
}

// refillWorker makes a volume for each job and reports how it went.
func (p *Pool) refillWorker(ctx context.Context, jobs <-chan struct{}, results chan<- error) {
	defer p.refillWG.Done()
	lowerPriority()
	for {
		select {
		case <-ctx.Done():
			return
		case <-jobs:
		}
		e, err := p.make(ctx, p.cfg.DefaultSize)
		p.mu.Lock()
		p.making--
		keep := err == nil && !p.closed
		if keep {
			p.ready = append(p.ready, e)
			p.lastMade = time.Now()
		}
		p.mu.Unlock()
		if err == nil && !keep {
			p.destroy(e)
		}
		select {
		case results <- err:
		case <-ctx.Done():
			return
		}
	}
}

// claim counts one more volume being made if the pool, counting those
// being made, is short of PoolSize and the storage could admit every one
// of them (room): a ready volume holds no blocks, but one the storage
// could not back when it is handed out would fail that create. short
// reports that the storage's space held the pool back.
func (p *Pool) claim() (ok, short bool) {
	room, err := p.room()
	if err != nil {
		p.log.Warn("measuring the space for the disk pool", "err", err)
		return false, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.ready) + p.making + p.recycling
	if p.closed || n >= p.cfg.PoolSize {
		return false, false
	}
	if int64(n+1)*p.cfg.DefaultSize > room {
		return false, true
	}
	p.making++
	return true, false
}

// poke wakes the refill.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// make makes a volume of size bytes in a new pool directory.
func (p *Pool) make(ctx context.Context, size int64) (*entry, error) {
	dir := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
	dev, err := buildVolume(dir, p.log, func(img string) error { return p.newImage(ctx, img, size) })
	if err != nil {
		return nil, err
	}
	return &entry{dir: dir, device: dev, size: size}, nil
}

// newImage makes img, the image of a new volume of size bytes: a clone of
// the pristine image of that size (pristine_linux.go) with a UUID of its
// own. It holds no blocks but the pristine image's until it is handed out
// (reserve).
func (p *Pool) newImage(ctx context.Context, img string, size int64) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating disk image: %w", err)
	}
	defer f.Close()
	for tries := 0; ; tries++ {
		src, err := p.pristines.get(ctx, size)
		if err != nil {
			return err
		}
		err = cloneImage(ctx, f, src, p.copyOpts)
		if errors.Is(err, fs.ErrNotExist) && tries == 0 {
			// Evicted since get, or removed by hand: made again.
			p.pristines.forget(size, src)
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	if err := setFreshUUID(f); err != nil {
		return err
	}
	return f.Close()
}

// destroy removes an entry that will not be handed out, in the
// background.
func (p *Pool) destroy(e *entry) { p.reaper.remove(e.dir) }

// take pops a ready entry of size bytes, or returns nil, and pokes refill.
func (p *Pool) take(size int64) (*entry, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errClosed
	}
	if size != p.cfg.DefaultSize || len(p.ready) == 0 {
		return nil, nil
	}
	e := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.poke()
	return e, nil
}

// Acquire hands out a mounted volume of size bytes (0 means the default)
// for sandbox id, its root owned by uid:gid with mode 0755. A default-size
// volume comes from the pool when one is ready; anything else is made,
// which takes tens of milliseconds.
func (p *Pool) Acquire(ctx context.Context, id string, size int64, uid, gid int) (*Volume, error) {
	return p.acquire(ctx, id, size, uid, gid, true)
}

// AcquireAhead is Acquire for a volume made ahead of time for a sandbox
// yet to come (a warm guest's): with an overcommit of 1 its blocks are
// allocated when Rename gives it to its sandbox, not before. It is
// admitted now, and counts as promised until then.
func (p *Pool) AcquireAhead(ctx context.Context, id string, size int64, uid, gid int) (*Volume, error) {
	return p.acquire(ctx, id, size, uid, gid, false)
}

func (p *Pool) acquire(ctx context.Context, id string, size int64, uid, gid int, back bool) (*Volume, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	if size == 0 {
		size = p.cfg.DefaultSize
	}
	size, err := normalizeSize(size)
	if err != nil {
		return nil, err
	}
	if err := validateOwner(uid, gid); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dst := filepath.Join(p.volDir, id)
	// Checked first so a conflict does not cost a pooled volume; the
	// rename below is what makes it exact.
	if _, err := os.Lstat(dst); err == nil {
		return nil, errdefs.Conflict("sandbox %q already has a disk", id)
	}

	e, err := p.take(size)
	if err != nil {
		return nil, err
	}
	if e == nil {
		if e, err = p.make(ctx, size); err != nil {
			return nil, fmt.Errorf("making disk: %w", err)
		}
	}
	if err := p.handOut(e, dst, uid, gid, back); err != nil {
		p.destroy(e)
		return nil, err
	}
	return &Volume{ID: id, Path: filepath.Join(dst, rootName), Size: e.size, Device: e.device}, nil
}

// handOut gives e's root to uid:gid, admits its disk (reserve) and renames
// e's directory to dst; with an overcommit of 1 and back the backer
// allocates its blocks behind the call (not while it waits in the pool;
// without back, when Rename gives it to its sandbox). The rename is the commit: before
// it the volume is a pool entry (swept after a crash), after it it belongs
// to the sandbox. It does not fsync the parent
// directories: that would cost milliseconds per create, and the rename
// reaches the host's journal with the sandbox's first fsync (ext4 commits
// all metadata in one transaction) or within the commit interval anyway.
func (p *Pool) handOut(e *entry, dst string, uid, gid int, back bool) error {
	root := filepath.Join(e.dir, rootName)
	if err := unix.Chown(root, uid, gid); err != nil {
		return fmt.Errorf("chowning disk root: %w", err)
	}
	if err := unix.Chmod(root, 0o755); err != nil {
		return fmt.Errorf("chmoding disk root: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(e.dir, imageName), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening disk image: %w", err)
	}
	own, err := p.reserve(f, func() error {
		if err := unix.Renameat2(unix.AT_FDCWD, e.dir, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return errdefs.Conflict("sandbox %q already has a disk", filepath.Base(dst))
			}
			return fmt.Errorf("handing out disk: %w", err)
		}
		return nil
	})
	if err != nil || own == 0 || !back || p.cfg.Overcommit > 1 {
		f.Close()
		return err
	}
	p.backer.add(f)
	return nil
}

// Open returns the volume handed out to id earlier, possibly by a previous
// process. If its image exists but is not mounted (after a reboot, say), it
// is attached and mounted again. A vol directory is only ever made whole,
// by one rename, so the one half state is one this package never makes: a
// directory without an image. Open reports it as ErrNotFound; List still
// lists it, so Remove can delete it.
func (p *Pool) Open(id string) (*Volume, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	if p.isClosed() {
		return nil, errClosed
	}
	if v, err := p.mounted(id); !errors.Is(err, errNotMounted) {
		return v, err
	}
	p.volMu.Lock()
	defer p.volMu.Unlock()
	if v, err := p.mounted(id); !errors.Is(err, errNotMounted) {
		return v, err // mounted by a concurrent Open
	}
	dir := filepath.Join(p.volDir, id)
	img := filepath.Join(dir, imageName)
	root := filepath.Join(dir, rootName)
	fi, err := os.Stat(img)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("disk", id)
		}
		return nil, fmt.Errorf("opening disk of %q: %w", id, err)
	}
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("making mountpoint: %w", err)
	}
	dev, err := remountImage(img, root)
	if err != nil {
		return nil, fmt.Errorf("re-mounting disk of %q: %w", id, err)
	}
	p.log.Info("re-mounted disk", "sandbox", id, "device", dev)
	return &Volume{ID: id, Path: root, Size: fi.Size(), Device: dev}, nil
}

var errNotMounted = errors.New("not mounted")

// mounted returns id's volume if it is mounted from its own image,
// errNotMounted if nothing is mounted at its root, ErrNotFound if id has
// no volume.
func (p *Pool) mounted(id string) (*Volume, error) {
	dir := filepath.Join(p.volDir, id)
	root := filepath.Join(dir, rootName)
	img := filepath.Join(dir, imageName)
	var dst, rst unix.Stat_t
	if err := unix.Stat(dir, &dst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, errdefs.NotFound("disk", id)
		}
		return nil, fmt.Errorf("opening disk of %q: %w", id, err)
	}
	if err := unix.Lstat(root, &rst); err != nil || rst.Dev == dst.Dev {
		return nil, errNotMounted
	}
	name, backing, err := loopOf(rst.Dev)
	if err != nil {
		return nil, fmt.Errorf("opening disk of %q: %w", id, err)
	}
	if backing != img {
		return nil, fmt.Errorf("opening disk of %q: %s is mounted from %s, not from its image", id, root, backing)
	}
	var ist unix.Stat_t
	if err := unix.Stat(img, &ist); err != nil {
		return nil, fmt.Errorf("opening disk of %q: %w", id, err)
	}
	return &Volume{ID: id, Path: root, Size: ist.Size, Device: "/dev/" + name}, nil
}

// List returns the ids of the handed-out volumes present on disk, sorted,
// whether mounted or not, so the caller can find volumes no sandbox owns.
func (p *Pool) List() ([]string, error) {
	ents, err := os.ReadDir(p.volDir)
	if err != nil {
		return nil, fmt.Errorf("listing disks: %w", err)
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		if api.IsSandboxID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Remove deletes id's volume. Removing an id without a volume is not an
// error. The volume is renamed into trash, which frees the id, and
// unmounted and deleted there in the background (reap_linux.go); a crash
// before that is done leaves only trash for the next NewPool to sweep.
func (p *Pool) Remove(ctx context.Context, id string) error {
	dst, err := p.toTrash(ctx, id)
	if err != nil || dst == "" {
		return err
	}
	p.reaper.remove(dst)
	return nil
}

// Rename gives the volume handed out to from to the id to, with one
// rename of its directory (the mount moves with it), and with an
// overcommit of 1 has the backer allocate it if it was made ahead
// (AcquireAhead, CloneFrom). It fails with ErrNotFound if from has no
// volume and ErrConflict if to has one.
func (p *Pool) Rename(from, to string) error {
	if err := reqcheck.SandboxID("id", from); err != nil {
		return err
	}
	if err := reqcheck.SandboxID("id", to); err != nil {
		return err
	}
	if p.isClosed() {
		return errClosed
	}
	p.volMu.Lock()
	defer p.volMu.Unlock()
	err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(p.volDir, from), unix.AT_FDCWD, filepath.Join(p.volDir, to), unix.RENAME_NOREPLACE)
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.NotFound("disk", from)
	case errors.Is(err, unix.EEXIST):
		return errdefs.Conflict("sandbox %q already has a disk", to)
	case err != nil:
		return fmt.Errorf("renaming disk %q to %q: %w", from, to, err)
	}
	// A snapshot in progress now guards the new id against Remove.
	if ch := p.snapping[from]; ch != nil {
		delete(p.snapping, from)
		p.snapping[to] = ch
	}
	if p.cfg.Overcommit == 1 {
		p.backLater(filepath.Join(p.volDir, to, imageName))
	}
	return nil
}

// Ready returns how many pooled volumes are ready now.
func (p *Pool) Ready() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// Reaping returns how many volume teardowns are queued or under way
// (Remove answers before its volume is gone).
func (p *Pool) Reaping() int { return p.reaper.pending() }

func (p *Pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close stops the refill, removes the ready pool volumes and waits for
// the removals under way. Handed-out volumes stay mounted for the next
// process to Open. Calls other than List and Ready fail after Close.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()

	p.cancel()
	p.refillWG.Wait()
	p.backer.wait()
	errs := p.dropClones()
	p.closeSeeds()
	for _, e := range ready {
		if err := teardown(context.Background(), e.dir, p.log); err != nil {
			errs = append(errs, err)
		}
	}
	p.reaper.close()
	errs = append(errs, p.lock.Unlock())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing disk pool: %w", err)
	}
	return nil
}

// Usage reports the bytes used and the capacity of the volume's filesystem.
func (v *Volume) Usage() (used, size int64, err error) {
	var parent, root unix.Stat_t
	if err := unix.Stat(filepath.Dir(v.Path), &parent); err != nil {
		return 0, 0, fmt.Errorf("reading disk usage: %w", err)
	}
	if err := unix.Stat(v.Path, &root); err != nil {
		return 0, 0, fmt.Errorf("reading disk usage: %w", err)
	}
	if root.Dev == parent.Dev {
		// Reporting the host filesystem's numbers would be a lie.
		return 0, 0, fmt.Errorf("reading disk usage: %w: %s is not mounted", errdefs.ErrNotFound, v.Path)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(v.Path, &st); err != nil {
		return 0, 0, fmt.Errorf("reading disk usage: %w", err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}
