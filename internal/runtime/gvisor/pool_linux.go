package gvisor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// PoolName is the name the pool of ready gvisor sandboxes goes by in
// runtime.Tiers' pool sizes.
const PoolName = "gvisor:image:host"

// pool keeps sandboxes of one image, disk size and set of limits built
// and prepared ahead of time (runsc started, the guest waiting for its
// Activate): runsc takes some 300 ms to start a sandbox on an idle
// machine, which a create that takes one does not wait for.
type pool struct {
	src  runtime.PoolSource
	size int

	mu       sync.Mutex
	img      *image.Image
	ready    []*prepared // oldest first
	building map[string]bool
	closing  bool

	poke chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// KeepReady keeps size sandboxes of src ready, each handed out to a
// create that asks for gvisor with src's image and disk size (any
// limits). It is called once, after the daemon reconciled its records
// (what an earlier daemon kept ready is a leftover then).
func (r *Runtime) KeepReady(src runtime.PoolSource, size int) {
	if size <= 0 || r.pool != nil {
		return
	}
	p := &pool{src: src, size: size, building: map[string]bool{}, poke: make(chan struct{}, 1), stop: make(chan struct{})}
	r.pool = p
	p.wg.Add(1)
	go r.refill(p)
	p.wake()
}

func (p *pool) wake() {
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// refill builds sandboxes, one at a time, until the pool is full.
func (r *Runtime) refill(p *pool) {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.poke:
		}
		for {
			p.mu.Lock()
			want := p.size - len(p.ready) - len(p.building)
			closing := p.closing
			p.mu.Unlock()
			if want <= 0 || closing {
				break
			}
			if err := r.buildOne(p); err != nil {
				r.log.Warn("building a ready gvisor sandbox", "err", err)
				select {
				case <-p.stop:
					return
				case <-time.After(5 * time.Second):
				}
			}
		}
	}
}

func (r *Runtime) buildOne(p *pool) error {
	img, err := p.src.Image()
	if err != nil {
		return err
	}
	id := runtime.NewID()
	p.mu.Lock()
	p.building[id] = true
	p.img = img
	p.mu.Unlock()
	res := p.src.Limits
	res.DiskBytes = p.src.DiskBytes
	rd, err := r.build(context.Background(), id, runtime.Spec{ID: id, Image: img, Resources: res}, true, func(string) {})
	p.mu.Lock()
	delete(p.building, id)
	if err == nil {
		rd.pooled = true
		if p.closing {
			err = errClosing
		} else {
			p.ready = append(p.ready, rd)
		}
	}
	p.mu.Unlock()
	if err == errClosing {
		r.discard(rd)
		return nil
	}
	return err
}

var errClosing = errors.New("the runtime is closing")

// take hands out a ready sandbox that serves spec, or nil.
func (r *Runtime) take(spec runtime.Spec) *prepared {
	p := r.pool
	if p == nil || spec.ID != "" || len(spec.Mounts) > 0 || spec.DiskFrom != "" || spec.Image == nil || spec.Resources.DiskBytes != p.src.DiskBytes {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.img == nil || p.img.ID != spec.Image.ID {
		return nil
	}
	for len(p.ready) > 0 {
		rd := p.ready[0]
		p.ready = p.ready[1:]
		select {
		case <-rd.sb.done:
			go r.discard(rd) // died while it waited
			continue
		default:
		}
		p.wake()
		return rd
	}
	p.wake()
	return nil
}

// discard removes a prepared sandbox no create took, and its network
// files.
func (r *Runtime) discard(rd *prepared) {
	rd.undo()
	if r.cfg.Network != nil {
		r.cfg.Network.Forget(rd.sb.id)
	}
}

// Keeps implements runtime.Keeper: the pool's sandboxes are no leftovers.
func (r *Runtime) Keeps(id string) bool {
	p := r.pool
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.building[id] {
		return true
	}
	for _, rd := range p.ready {
		if rd.sb.id == id {
			return true
		}
	}
	return false
}

// PoolSizes implements runtime.Pools' report: the ready sandboxes.
func (r *Runtime) PoolSizes() map[string]int {
	p := r.pool
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]int{PoolName: len(p.ready)}
}

// PoolTargets reports the size the pool is kept at.
func (r *Runtime) PoolTargets() map[string]int {
	if r.pool == nil {
		return nil
	}
	return map[string]int{PoolName: r.pool.size}
}

// closePool stops the refill and removes the ready sandboxes.
func (r *Runtime) closePool() {
	p := r.pool
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closing = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	for _, rd := range ready {
		r.discard(rd)
	}
}
