package sandbox

import (
	"context"
	"errors"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/runtime"
)

var (
	errNoVolumes   = errdefs.New(errdefs.ErrUnavailable, "volumes are not configured")
	errNoSnapshots = errdefs.New(errdefs.ErrUnavailable, "snapshots are not configured")
)

// Create makes a named volume, empty or filled from a directory
// snapshot.
func (s Volumes) Create(ctx context.Context, req api.VolumeRequest) (api.Volume, error) {
	m := s.m
	if m.cfg.Volumes == nil {
		return api.Volume{}, errNoVolumes
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return api.Volume{}, err
	}
	if req.FromSnapshot == "" {
		return m.cfg.Volumes.Create(ctx, req, "")
	}
	if m.cfg.Snapshots == nil {
		return api.Volume{}, errNoSnapshots
	}
	snap, err := m.cfg.Snapshots.Get(req.FromSnapshot)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
			return api.Volume{}, errdefs.Invalid("from_snapshot", "unknown snapshot %q", req.FromSnapshot)
		}
		return api.Volume{}, err
	}
	if snap.Path == "" {
		return api.Volume{}, errdefs.Invalid("from_snapshot", "snapshot %s is of a whole sandbox; a volume is made from a directory snapshot", snap.ID)
	}
	if req.SizeBytes != 0 && req.SizeBytes != snap.SizeBytes {
		return api.Volume{}, errdefs.Invalid("size_bytes", "a volume made from snapshot %s keeps its size of %d bytes", snap.ID, snap.SizeBytes)
	}
	holder := "creating:" + runtime.NewID()
	if err := m.cfg.Snapshots.Hold(snap.ID, holder); err != nil {
		return api.Volume{}, err
	}
	defer m.cfg.Snapshots.Drop(snap.ID, holder)
	img, err := m.cfg.Snapshots.ImagePath(snap.ID)
	if err != nil {
		return api.Volume{}, err
	}
	return m.cfg.Volumes.Create(ctx, req, img)
}

// List lists the named volumes.
func (s Volumes) List(ctx context.Context) ([]api.Volume, error) {
	m := s.m
	if m.cfg.Volumes == nil {
		return nil, errNoVolumes
	}
	return m.cfg.Volumes.List(), nil
}

// Get describes one volume.
func (s Volumes) Get(ctx context.Context, name string) (api.Volume, error) {
	m := s.m
	if m.cfg.Volumes == nil {
		return api.Volume{}, errNoVolumes
	}
	return m.cfg.Volumes.Get(name)
}

// Remove deletes a volume no sandbox mounts.
func (s Volumes) Remove(ctx context.Context, name string) error {
	m := s.m
	if m.cfg.Volumes == nil {
		return errNoVolumes
	}
	m.settleBriefly(ctx) // a sandbox just removed may still hold it
	return m.cfg.Volumes.Remove(ctx, name)
}

// List lists snapshots, all or those of one sandbox.
func (s Snapshots) List(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	m := s.m
	if m.cfg.Snapshots == nil {
		return nil, errNoSnapshots
	}
	if sandbox != "" {
		if err := reqcheck.SandboxID("id", sandbox); err != nil {
			return nil, err
		}
	}
	return m.cfg.Snapshots.List(sandbox), nil
}

// Get describes one snapshot.
func (s Snapshots) Get(ctx context.Context, id string) (api.Snapshot, error) {
	m := s.m
	if m.cfg.Snapshots == nil {
		return api.Snapshot{}, errNoSnapshots
	}
	return m.cfg.Snapshots.Get(id)
}

// Remove deletes a snapshot nothing holds.
func (s Snapshots) Remove(ctx context.Context, id string) error {
	m := s.m
	if m.cfg.Snapshots == nil {
		return errNoSnapshots
	}
	m.settleBriefly(ctx) // a sandbox just removed may still hold it
	return m.cfg.Snapshots.Remove(id)
}
