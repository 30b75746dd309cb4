package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/rundir"
	"github.com/paddock-dev/paddock/internal/runtime/gvisor"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// Uninstall removes every trace of the daemon cfg describes from the
// host: it stops the daemon if it runs, kills its sandboxes (and warm
// guests) and removes their cgroups and the parent, unmounts its disks,
// volumes, snapshots and storage filesystem, deletes its nftables table
// and links, and removes its state and run directories and unix sockets.
// A stopped daemon leaves the storage mount and network in place for its
// running sandboxes; this is how an operator takes them away.
func Uninstall(ctx context.Context, cfg Config, log *slog.Logger) error {
	// A mistyped directory must not be emptied: the state dir must be a
	// paddock's (or gone already).
	for _, dir := range []string{cfg.StateDir, cfg.RunDir} {
		if abs, err := filepath.Abs(dir); err != nil || abs == "/" {
			return errdefs.Invalid("directory", "refusing to uninstall from %q", dir)
		}
	}
	if _, err := os.Stat(cfg.StateDir); err == nil {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "paddock.db")); err != nil {
			return errdefs.Invalid("state-dir", "%s holds no paddock.db: not a paddock state directory", cfg.StateDir)
		}
	}
	if pid, err := Stop(cfg.RunDir, time.Minute); err != nil {
		return err
	} else if pid > 0 {
		log.Info("stopped the daemon", "pid", pid)
	}
	var errs []error
	cgroups, err := cgroup.NewManager(cfg.CgroupParent, log)
	if err != nil {
		return fmt.Errorf("opening cgroups: %w", err)
	}
	names, err := cgroups.List()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		g, err := cgroups.Load(name)
		if err != nil {
			continue
		}
		if err := g.Kill(); err != nil {
			errs = append(errs, fmt.Errorf("killing sandbox %s: %w", name, err))
		}
		if err := g.Delete(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing cgroup of %s: %w", name, err))
		}
	}
	if len(names) > 0 {
		log.Info("killed sandboxes and guests", "count", len(names))
	}
	storage := filepath.Join(cfg.StateDir, "storage")
	for _, dir := range []string{cfg.RunDir, storage} {
		if err := disk.UnmountAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := disk.Unmount(storage); err != nil {
		errs = append(errs, err)
	}
	if err := rundir.Unmount(cfg.RunDir); err != nil {
		errs = append(errs, err)
	}
	if !cfg.Network.Disabled {
		name := cfg.Network.Name
		if name == "" {
			name = network.DefaultName
		}
		if err := network.Uninstall(name); err != nil {
			errs = append(errs, fmt.Errorf("removing network %s: %w", name, err))
		}
	}
	if err := cgroups.Remove(); err != nil {
		errs = append(errs, err)
	}
	gvisor.RemoveCgroups(cfg.CgroupParent)
	if err := errors.Join(errs...); err != nil {
		// The directories stay for a second try: what is left is in them.
		return err
	}
	for _, l := range cfg.Listen {
		if path, ok := strings.CutPrefix(l, "unix://"); ok {
			os.Remove(path)
		}
	}
	for _, dir := range []string{cfg.StateDir, cfg.RunDir} {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
