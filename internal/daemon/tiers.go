package daemon

import (
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"sort"

	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/runtime/gvisor"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// runsCache is where scripts/runsc-bin.sh (make runsc) builds runsc by
// default, one directory per pinned version.
const runscCache = "/var/cache/paddock/runsc"

// findRunsc is the runsc the gvisor runtime uses: the configured one,
// else runsc on PATH, else the newest in make runsc's cache; "" if none.
func findRunsc(configured string) string {
	if configured != "" {
		return configured
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	found, _ := filepath.Glob(filepath.Join(runscCache, "*", "runsc"))
	sort.Strings(found)
	if len(found) > 0 {
		return found[len(found)-1]
	}
	return ""
}

// runtimeTiers puts the gvisor runtime beside the native one, when runsc
// is there; without it creates that ask for gvisor are refused, and so is
// a daemon whose default it is.
func runtimeTiers(cfg Config, native runtime.Runtime, gcfg gvisor.Config, log *slog.Logger) (*runtime.Tiers, error) {
	gcfg.Runsc = findRunsc(cfg.Runsc)
	gcfg.Base = native
	g, err := gvisor.New(gcfg)
	if err != nil {
		if cfg.DefaultRuntime == gvisor.Name {
			return nil, fmt.Errorf("the default runtime, gvisor: %w", err)
		}
		log.Info("the gvisor runtime is unavailable", "err", err)
		t, err2 := runtime.NewTiers(native, cfg.DefaultRuntime)
		if err2 != nil {
			return nil, err2
		}
		t.Unavailable(gvisor.Name, err)
		return t, nil
	}
	log.Info("the gvisor runtime is ready", "runsc", gcfg.Runsc, "version", g.Version())
	return runtime.NewTiers(native, cfg.DefaultRuntime, g)
}

// keepGvisorReady starts the pool of ready gvisor sandboxes
// (--gvisor-pool) of the default image, disk size and limits.
func keepGvisorReady(t *runtime.Tiers, cfg Config, images *image.Store) {
	r, err := t.Tier(gvisor.Name)
	if err != nil || cfg.GvisorPool <= 0 {
		return
	}
	g := r.(*gvisor.Runtime)
	g.KeepReady(runtime.PoolSource{
		Image:     func() (*image.Image, error) { return images.Get(image.HostImage) },
		DiskBytes: cfg.Defaults.DiskBytes,
		Limits:    cfg.Defaults,
	}, cfg.GvisorPool)
}
