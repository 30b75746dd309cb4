package disk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Ready clones. A snapshot image that sandboxes are made from more than
// once (a template's, most of all) gets one clone made ahead of time,
// attached and mounted in pool/ like the default-size volumes, so that the
// next AcquireFrom of it is a rename instead of a clone, a loop device and
// a mount (5 ms idle here, 10-40 ms when the host's disk is busy, because
// the clone is synced before it is used). One clone per source, for the
// maxRecentSources sources used last; a clone whose source changed or
// went away is dropped.

// maxRecentSources bounds the sources AcquireFrom remembers, and so the
// ready clones.
const maxRecentSources = 8

// source identifies a snapshot image's contents: a file replaced under
// the same path is another source.
type source struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func sourceOf(fi os.FileInfo) source {
	st := fi.Sys().(*syscall.Stat_t)
	return source{dev: st.Dev, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}

// readyClone is a mounted clone of src waiting in pool/.
type readyClone struct {
	e   *entry
	src source
}

// takeClone pops the ready clone of path if it is of src.
func (p *Pool) takeClone(path string, src source) *entry {
	p.mu.Lock()
	rc := p.clones[path]
	delete(p.clones, path)
	p.mu.Unlock()
	if rc == nil {
		return nil
	}
	if rc.src != src {
		go p.destroy(rc.e)
		return nil
	}
	return rc.e
}

// used notes that a volume was made from path: a source used before gets
// a ready clone made in the background. Clones of sources no longer
// remembered, or gone, are dropped.
func (p *Pool) used(path string, src source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	again := p.dropRecentLocked(path)
	p.recent = append(p.recent, path)
	var drop []*entry
	if len(p.recent) > maxRecentSources {
		old := p.recent[0]
		p.recent = p.recent[1:]
		if rc := p.clones[old]; rc != nil {
			drop = append(drop, rc.e)
			delete(p.clones, old)
		}
	}
	for s, rc := range p.clones {
		if _, err := os.Stat(s); err != nil {
			drop = append(drop, rc.e)
			delete(p.clones, s)
		}
	}
	if len(drop) > 0 {
		go func() {
			for _, e := range drop {
				p.destroy(e)
			}
		}()
	}
	if !again || p.clones[path] != nil || p.cloning[path] {
		return
	}
	p.cloning[path] = true
	p.cloneWG.Add(1)
	go p.makeClone(path, src)
}

// dropRecentLocked takes path off the recent sources and says whether it
// was there.
func (p *Pool) dropRecentLocked(path string) bool {
	for i, s := range p.recent {
		if s == path {
			p.recent = append(p.recent[:i], p.recent[i+1:]...)
			return true
		}
	}
	return false
}

// Forget drops what the pool keeps of the snapshot image at path (its
// ready clone, whose loop device, mount and blocks go in the background,
// and its seed),
// for a snapshot removed. A clone being made of it is not kept when it is done
// (makeClone finds its source gone).
func (p *Pool) Forget(path string) {
	p.mu.Lock()
	rc := p.clones[path]
	delete(p.clones, path)
	p.dropRecentLocked(path)
	p.mu.Unlock()
	if rc != nil {
		p.destroy(rc.e)
	}
	p.forgetSeed(path)
}

// makeClone makes the ready clone of path (of src), at the refill's low
// importance: it runs after the AcquireFrom that asked for it returned.
func (p *Pool) makeClone(path string, src source) {
	defer p.cloneWG.Done()
	e, err := p.cloneInto(context.Background(), path)
	if err == nil {
		// Read what a sandbox's start reads first (the overlay's
		// directories at the root), so that it does not wait for the
		// image's inode blocks on a busy disk.
		root := filepath.Join(e.dir, rootName)
		if ents, err := os.ReadDir(root); err == nil {
			for _, d := range ents {
				os.Lstat(filepath.Join(root, d.Name()))
			}
		}
	}
	p.mu.Lock()
	delete(p.cloning, path)
	keep := err == nil && !p.closed && p.clones[path] == nil && stillSource(path, src)
	if keep {
		p.clones[path] = &readyClone{e: e, src: src}
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("making a ready clone", "source", path, "err", err)
		return
	}
	if !keep {
		p.destroy(e)
	}
}

func stillSource(path string, src source) bool {
	fi, err := os.Stat(path)
	return err == nil && sourceOf(fi) == src
}

// cloneInto makes a mounted clone of the image at path in a new pool
// directory. Like a volume made from a pristine image, the clone is not
// synced (cloneImage): a synced one cost 0.5 ms more of the host's CPU
// (the substrate's log forced through both loop devices), for a file a
// crash sweeps away until it is handed out.
func (p *Pool) cloneInto(ctx context.Context, path string) (*entry, error) {
	dir := filepath.Join(p.poolDir, strconv.FormatUint(p.seq.Add(1), 10))
	var size int64
	dev, err := buildVolume(dir, p.log, func(img string) error {
		f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("creating disk image: %w", err)
		}
		defer f.Close()
		if err := cloneImage(ctx, f, path, p.copyOpts); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("inspecting disk image: %w", err)
		}
		size = fi.Size()
		return f.Close()
	})
	if err != nil {
		return nil, err
	}
	return &entry{dir: dir, device: dev, size: size}, nil
}

// dropClones tears down the ready clones, for Close.
func (p *Pool) dropClones() []error {
	p.cloneWG.Wait()
	p.mu.Lock()
	clones := p.clones
	p.clones = map[string]*readyClone{}
	p.mu.Unlock()
	var errs []error
	for _, rc := range clones {
		if err := teardown(context.Background(), rc.e.dir, p.log); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
