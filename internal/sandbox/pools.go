package sandbox

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/template"
)

// poolsBucket keeps the sizes of image pools set through the API, so that
// a restarted daemon refills them. A template's pool size is its Warm.
const poolsBucket = "pools"

const (
	imagePoolPrefix    = "image:"
	templatePoolPrefix = "template:"
)

// imagePool is the record of an image's warm pool.
type imagePool struct {
	Image string `json:"image"`
	Size  int    `json:"size"`
}

// Set keeps size sandboxes ready for the pool named name:
// "image:NAME" for an image (sandboxes with the default limits and disk),
// "template:NAME" for a template (its Warm, recorded with the template).
// Size 0 removes the pool. The size outlives the daemon.
func (s Pools) Set(ctx context.Context, name string, size int) (api.Pool, error) {
	m := s.m
	p, ok := m.cfg.Runtime.(runtime.Pools)
	if !ok {
		return api.Pool{}, errdefs.New(errdefs.ErrUnavailable, "the %s runtime keeps no warm pools", m.cfg.Runtime.Name())
	}
	if size < 0 || size > template.MaxWarm {
		return api.Pool{}, errdefs.Invalid("size", "%d is outside 0..%d", size, template.MaxWarm)
	}
	switch {
	case strings.HasPrefix(name, templatePoolPrefix):
		if err := m.setTemplateWarm(strings.TrimPrefix(name, templatePoolPrefix), size); err != nil {
			return api.Pool{}, err
		}
	case strings.HasPrefix(name, imagePoolPrefix):
		ref := strings.TrimPrefix(name, imagePoolPrefix)
		img, err := m.cfg.Images.Get(ref)
		if err != nil {
			return api.Pool{}, err
		}
		// The pool is named for the image's own name, as the default
		// pool is ("image:host"), whichever name the caller used.
		name = imagePoolPrefix + img.Name
		if size == 0 {
			err = m.cfg.Store.Delete(poolsBucket, name)
		} else {
			err = m.cfg.Store.Put(poolsBucket, name, imagePool{Image: img.Name, Size: size})
		}
		if err != nil {
			return api.Pool{}, err
		}
		p.SetPool(name, m.imagePoolSource(img.Name), size)
	default:
		return api.Pool{}, errdefs.Invalid("name", "%q names no pool: want image:NAME or template:NAME", name)
	}
	m.log.Info("warm pool set", "pool", name, "size", size)
	return api.Pool{Name: name, Target: size, Ready: m.poolSizes()[name]}, nil
}

// withDefaults fills what res leaves unset from the daemon's defaults: a
// create's resources, and a template pool's limits.
func (m *Manager) withDefaults(res api.Resources) api.Resources {
	d := m.cfg.Defaults
	if res.CPUs == 0 {
		res.CPUs = d.CPUs
	}
	if res.MemoryBytes == 0 {
		res.MemoryBytes = d.MemoryBytes
	}
	if res.Pids == 0 {
		res.Pids = d.Pids
	}
	if res.DiskBytes == 0 {
		res.DiskBytes = d.DiskBytes
	}
	return res
}

func (m *Manager) imagePoolSource(ref string) runtime.PoolSource {
	return runtime.PoolSource{
		Image:     func() (*image.Image, error) { return m.cfg.Images.Get(ref) },
		DiskBytes: m.cfg.Defaults.DiskBytes,
		Limits:    m.cfg.Defaults,
	}
}

// setTemplateWarm records a template's new Warm and resizes its pool.
func (m *Manager) setTemplateWarm(name string, size int) error {
	unlock, err := m.lockTemplate(name)
	if err != nil {
		return err
	}
	defer unlock()
	t, err := m.cfg.Templates.Get(name)
	if err != nil {
		return err
	}
	t.Warm = size
	if _, err := m.cfg.Templates.Put(t); err != nil {
		return err
	}
	m.setTemplatePool(t)
	return nil
}

// Restore, at start-up, refills the image pools set through the API.
// A recorded size for the default image replaces --warm-guests.
func (s Pools) Restore(ctx context.Context) {
	m := s.m
	p, ok := m.cfg.Runtime.(runtime.Pools)
	if !ok {
		return
	}
	var pools []imagePool
	err := m.cfg.Store.Each(poolsBucket, func(key string, raw json.RawMessage) error {
		var ip imagePool
		if err := json.Unmarshal(raw, &ip); err != nil {
			m.log.Warn("skipping an unreadable pool record", "pool", key, "err", err)
			return nil
		}
		pools = append(pools, ip)
		return nil
	})
	if err != nil {
		m.log.Warn("reading the pool records", "err", err)
	}
	for _, ip := range pools {
		if _, err := m.cfg.Images.Get(ip.Image); err != nil {
			m.log.Warn("no warm pool for a missing image", "image", ip.Image, "err", err)
			continue
		}
		p.SetPool(imagePoolPrefix+ip.Image, m.imagePoolSource(ip.Image), ip.Size)
	}
}

// imagePools names the warm pools kept for any of an image's names.
func (m *Manager) imagePools(names []string) []string {
	p, ok := m.cfg.Runtime.(runtime.Pools)
	if !ok {
		return nil
	}
	targets := p.PoolTargets()
	var pools []string
	for _, n := range names {
		if targets[imagePoolPrefix+n] > 0 {
			pools = append(pools, "warm pool "+imagePoolPrefix+n)
		}
	}
	return pools
}
