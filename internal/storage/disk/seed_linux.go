package disk

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Seeds. A template's snapshot image is what each of its sandboxes starts
// from, and most templates add a few files to an image. A clone of the
// image per sandbox costs a reflink, a loop device and an ext4 mount to
// make, and an unmount (its journal flushed through two loop devices), a
// detach and the clone's unlink (the substrate's reference counts) to
// remove: under churn from a template, 7.6 ms of the host's CPU per
// sandbox more than from an image, half of it in the kernel's block and
// XFS workers (issue 21). So an image used more than once whose
// filesystem holds little is kept mounted read-only, a seed, and a volume
// made from it is a ready volume of the default size (made ahead, or
// recycled from a removed sandbox) with the seed's files mirrored into it
// (mirror_linux.go): when its sandbox is removed it goes back to the pool
// like any other.

const (
	// seedMaxInodes and seedMaxBytes bound the entries and data a seed
	// holds: a mirror's cost grows with both, a clone's does not. Per
	// cycle of a volume made, given a sandbox's few files and recycled,
	// on this project's 2-core test host (BenchmarkSeedChurn, the
	// machine's busy time): a clone 6.6-7.3 ms; a mirror 1.6 ms with 16
	// files (in two directories), 4.5 ms with 64, 8.4 ms with 128, about
	// 55 µs an entry.
	seedMaxInodes = 80
	seedMaxBytes  = 1 << 20
	// seedImageOverhead is what an image may have allocated beyond a
	// seed's data: a snapshot of a fresh 10 GiB disk holding two files
	// has 4.1 MiB (its superblock, group descriptors, bitmaps, the inode
	// tables' used blocks).
	seedImageOverhead = 16 << 20
	// seedReserved are the inodes a fresh filesystem uses (ext4's ten
	// reserved ones and lost+found), which the mount's count includes.
	seedReserved = 11
	// maxSeeds bounds the seeds kept mounted; the least recently used
	// goes first.
	maxSeeds = maxRecentSources
)

// seed is what the pool knows of one snapshot image as a seed.
type seed struct {
	src source
	// mu is held for reading by a mirror from the seed, and for writing
	// by its mount and teardown.
	mu    sync.RWMutex
	tried bool   // the mount was tried (the second use)
	dir   string // its pool entry, mounted at dir/root; "" if none
	gone  bool   // dropped: no mirror starts from it
	used  time.Time
}

// fromSeed makes a volume of the image at path (of src) by mirroring its
// seed into a ready volume. seeded reports whether path's image seeds;
// e is nil when it does not, or no ready volume is there: the caller
// clones the image.
func (p *Pool) fromSeed(ctx context.Context, path string, src source) (e *entry, seeded bool) {
	if p.cfg.PoolSize == 0 || src.size != p.cfg.DefaultSize {
		return nil, false
	}
	s, again := p.seedFor(path, src)
	if s == nil || !again {
		return nil, false // a first use: clone it
	}
	if !p.readSeed(s, path, src) {
		return nil, false
	}
	if e, _ = p.take(p.cfg.DefaultSize); e == nil {
		s.mu.RUnlock()
		p.log.Debug("no ready disk to mirror a seed into: cloning its image", "source", path)
		return nil, true
	}
	skip := map[string]bool{keepOnWipe: true}
	err := mirrorTree(ctx, filepath.Join(s.dir, rootName), filepath.Join(e.dir, rootName), skip, seedMaxInodes, seedMaxBytes)
	s.mu.RUnlock()
	if err == nil {
		return e, true
	}
	p.destroy(e)
	if ctx.Err() != nil {
		return nil, true
	}
	// The image is cloned from now on: what failed once (a bound, a
	// file the volume cannot take) fails again.
	p.log.Warn("mirroring a seed failed; its image is cloned instead", "source", path, "err", err)
	p.unmountSeed(s, false)
	return nil, false
}

// readSeed mounts s at its first use and reports whether it is mounted
// and not dropped, holding s.mu for reading if so (the caller's mirror
// then reads it). Only that first use takes s.mu for writing: a writer
// waits for every mirror in progress and holds up those that come after
// it, so taking it on every call had concurrent creates from one
// template mirror one at a time.
func (p *Pool) readSeed(s *seed, path string, src source) bool {
	s.mu.RLock()
	if !s.tried {
		s.mu.RUnlock()
		s.mu.Lock()
		if !s.tried && !s.gone {
			s.tried = true
			s.dir = p.mountSeed(path, src)
		}
		s.mu.Unlock()
		s.mu.RLock()
	}
	if s.gone || s.dir == "" {
		s.mu.RUnlock()
		return false
	}
	return true
}

// seedFor returns the seed record of path, made on its first use; again
// reports whether path was used before.
func (p *Pool) seedFor(path string, src source) (s *seed, again bool) {
	var drop []*seed
	defer func() {
		if len(drop) > 0 {
			p.dropSeeds(drop) // after p.mu is let go
		}
	}()
	// A source gone without Forget (a group member's capture) takes
	// its seed with it here, looked at outside p.mu, which every
	// hand-out takes.
	p.mu.Lock()
	others := make(map[string]*seed, len(p.seeds))
	for k, o := range p.seeds {
		if k != path {
			others[k] = o
		}
	}
	p.mu.Unlock()
	for k, o := range others {
		if stillSource(k, o.src) {
			delete(others, k)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	for k, o := range others {
		if p.seeds[k] == o {
			drop = append(drop, o)
			delete(p.seeds, k)
		}
	}
	if s = p.seeds[path]; s != nil && s.src != src {
		drop = append(drop, s)
		s = nil
	}
	again = s != nil
	if s == nil {
		for len(p.seeds) >= maxSeeds {
			var oldest string
			for k, o := range p.seeds {
				if oldest == "" || o.used.Before(p.seeds[oldest].used) {
					oldest = k
				}
			}
			drop = append(drop, p.seeds[oldest])
			delete(p.seeds, oldest)
		}
		s = &seed{src: src}
		p.seeds[path] = s
	}
	s.used = time.Now()
	return s, again
}

// mountSeed mounts the image at path read-only in a new pool entry and
// returns the entry, or "" if the image cannot seed: it needs a journal
// replayed (a read-only device refuses it), holds more than a seed may,
// or changed meanwhile. A crash leaves the entry to the next sweep.
func (p *Pool) mountSeed(path string, src source) string {
	dir := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
	root := filepath.Join(dir, rootName)
	ok := false
	defer func() {
		if !ok {
			if err := teardown(context.Background(), dir, p.log); err != nil {
				p.log.Warn("removing a seed", "path", dir, "err", err)
			}
		}
	}()
	// An image with more blocks than a seed's data and a fresh
	// filesystem's (about 4 MiB here) is not mounted to be refused.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Blocks*512 > seedMaxBytes+seedImageOverhead {
		ok = true // nothing made
		p.log.Debug("not seeding", "source", path, "allocated", st.Blocks*512)
		return ""
	}
	if unix.Mkdir(dir, 0o700) != nil || unix.Mkdir(root, 0o700) != nil {
		return ""
	}
	fd, dev, err := attachLoop(path, loopOptions{readOnly: true})
	if err != nil {
		p.log.Debug("not seeding", "source", path, "err", err)
		return ""
	}
	defer unix.Close(fd)
	if err := unix.Mount(dev, root, "ext4", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		p.log.Debug("not seeding", "source", path, "err", err)
		return ""
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return ""
	}
	used, files := int64(sfs.Blocks-sfs.Bfree)*sfs.Bsize, sfs.Files-sfs.Ffree
	if used > seedMaxBytes+seedMaxInodes*4096 || files > seedMaxInodes+seedReserved || !stillSource(path, src) {
		p.log.Debug("not seeding", "source", path, "used", used, "inodes", files)
		return ""
	}
	ok = true
	return dir
}

// unmountSeed unmounts s once no mirror reads from it; gone says it is
// dropped, not only no longer a seed (its image is cloned).
func (p *Pool) unmountSeed(s *seed, gone bool) {
	s.mu.Lock()
	s.gone = s.gone || gone
	dir := s.dir
	s.dir = ""
	s.mu.Unlock()
	if dir != "" {
		if err := teardown(context.Background(), dir, p.log); err != nil {
			p.log.Warn("removing a seed", "path", dir, "err", err)
		}
	}
}

func (p *Pool) dropSeeds(seeds []*seed) {
	for _, s := range seeds {
		p.unmountSeed(s, true)
	}
}

// forgetSeed drops path's seed, for Forget.
func (p *Pool) forgetSeed(path string) {
	p.mu.Lock()
	s := p.seeds[path]
	delete(p.seeds, path)
	p.mu.Unlock()
	if s != nil {
		p.unmountSeed(s, true)
	}
}

// closeSeeds drops every seed, for Close (after closed is set, so none
// is made again).
func (p *Pool) closeSeeds() {
	p.mu.Lock()
	seeds := p.seeds
	p.seeds = map[string]*seed{}
	p.mu.Unlock()
	for _, s := range seeds {
		p.unmountSeed(s, true)
	}
}
