package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/paddock-dev/paddock/api"
)

// Snapshot captures a running sandbox's filesystem (or, with req.Path, one
// directory of it) without stopping it.
func (c *Client) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (*api.Snapshot, error) {
	var s api.Snapshot
	return &s, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", req, &s)
}

// Snapshots lists snapshots: all of them, or those of one sandbox.
func (c *Client) Snapshots(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	path := "/v1/snapshots"
	if sandbox != "" {
		path = "/v1/sandboxes/" + url.PathEscape(sandbox) + "/snapshots"
	}
	var out []api.Snapshot
	return out, c.do(ctx, http.MethodGet, path, nil, &out)
}

// GetSnapshot describes one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	var s api.Snapshot
	return &s, c.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, &s)
}

// DeleteSnapshot removes a snapshot that nothing uses.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil)
}

// Fork makes copies of a sandbox, each with its own copy of its files.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) (*api.ForkResult, error) {
	var r api.ForkResult
	return &r, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/fork", req, &r)
}

// CreateVolume makes a named volume.
func (c *Client) CreateVolume(ctx context.Context, req api.VolumeRequest) (*api.Volume, error) {
	var v api.Volume
	return &v, c.do(ctx, http.MethodPost, "/v1/volumes", req, &v)
}

// Volumes lists the named volumes.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var out []api.Volume
	return out, c.do(ctx, http.MethodGet, "/v1/volumes", nil, &out)
}

// GetVolume describes one volume.
func (c *Client) GetVolume(ctx context.Context, name string) (*api.Volume, error) {
	var v api.Volume
	return &v, c.do(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(name), nil, &v)
}

// DeleteVolume removes a volume that no sandbox mounts.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(name), nil, nil)
}
