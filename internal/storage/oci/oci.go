// Package oci owns OCI images: pulling them from registries, importing
// them from `docker save` and OCI-layout archives, and keeping them on disk
// as content-addressed, read-only layer directories that every image and
// every sandbox shares.
//
// A layer is unpacked once, named by its diff ID (the sha256 of its
// uncompressed tar), into a directory in overlayfs's own lower-layer
// format: an OCI whiteout (.wh.NAME) becomes a 0/0 character device and an
// opaque directory (.wh..wh..opq) gets the user.overlay.opaque xattr
// (sandboxes mount overlayfs with userxattr) and trusted.overlay.opaque (a
// privileged overlay on the host). An image is then just its layer
// directories, top-most first, plus the defaults from its config, which is
// what internal/storage/image hands to the runtime as overlay lower dirs.
//
// Images are untrusted input. Unpacking resolves every parent directory
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS)
// relative to the layer's own directory handle and never follows a symlink;
// names with a ".." component are refused; sizes and entry counts are
// capped; every blob is checked against its digest and every layer against
// its diff ID before it is renamed into place, so a corrupt or hostile
// layer leaves nothing behind.
//
// Layout under the store's directory (everything there belongs to this
// package; the directory is kept 0700 because layers hold setuid-root files,
// file capabilities and device nodes exactly as the image has them):
//
//	lock                      flock held by the one process that owns the store
//	layers/<hex>/root/        a layer's tree (an overlay lower dir), <hex> = diff ID
//	layers/<hex>/layer.json   its metadata, written before the rename
//	layers/.tmp-<hex>-<n>/    an unpack in progress: removed by Open
//	layers/.del-<hex>-<n>/    a layer being deleted: removed by Open
//	blobs/sha256/<hex>        verified image configs and manifests
//	images/<hex>.json         one record per image, <hex> = its config digest (ID)
//	names.json                name -> image ID
//	tmp/                      archives being imported: emptied by Open
package oci

import "time"

// Image is a stored image: what a sandbox's root filesystem is built from.
// It is the store's view, with host paths; the API should answer with its
// own wire type, not this.
type Image struct {
	// Name is the name the image was looked up by, or its first name when
	// it was listed; empty for an image that no name points at.
	Name string
	// Names are all the names that point at the image, sorted.
	Names []string
	// ID is the digest of the image's config ("sha256:..."): it covers the
	// diff IDs of every layer, so equal IDs mean equal content.
	ID string
	// Digest is the digest of the image's manifest, as a registry or an OCI
	// layout names it. A `docker save` archive carries no manifest; for an
	// image imported from one, Digest equals ID.
	Digest string
	// RepoDigests are the pinned references the image was pulled as
	// ("host/repo@sha256:...").
	RepoDigests []string
	// Layers are the absolute paths of the unpacked layer directories,
	// top-most first, in overlayfs lowerdir order (a layer the image has
	// twice appears once; a layer that replaces the whole tree ends the
	// list). They are read-only and shared: never write into them.
	Layers []string
	// Env, Workdir, User, Entrypoint, Cmd and Labels come from the image's
	// config, unchanged.
	Env        []string
	Workdir    string
	User       string
	Entrypoint []string
	Cmd        []string
	Labels     map[string]string
	// Platform is "os/arch[/variant]" from the config.
	Platform string
	// Size is the sum of the layers' unpacked sizes (bytes of file
	// content; a layer shared with other images is counted in each).
	Size int64
	// Created is the image's creation time from its config (zero when the
	// config has none); Stored is when this store got it.
	Created time.Time
	Stored  time.Time
}

// Limits bound what an image may cost to store. Images are untrusted, so
// every one of these is checked while data streams in, before it is
// written: a decompression bomb fails at the limit, not at a full disk.
type Limits struct {
	// MaxLayerSize caps one layer's uncompressed tar stream, and
	// separately the bytes of file content it unpacks to (a sparse entry
	// can unpack to more than it streams).
	MaxLayerSize int64
	// MaxImageSize caps the unpacked content of all of an image's layers
	// together.
	MaxImageSize int64
	// MaxEntries caps the tar entries in one layer.
	MaxEntries int
	// MaxLayers caps the layers of one image (overlayfs takes at most 500
	// lower dirs; real images rarely have more than a few dozen).
	MaxLayers int
	// MaxMetadataSize caps a manifest, an index or a config.
	MaxMetadataSize int64
	// MaxXattrSize caps the extended attributes of one entry, in bytes of
	// names and values.
	MaxXattrSize int
	// MaxArchiveSize caps an archive given to Import (it is spooled to disk
	// before it is read).
	MaxArchiveSize int64
	// MinFree is what an unpack leaves free on the store's file system:
	// it stops with ErrNoSpace before writing past it. The caps above are
	// per layer and per image; this one counts every unpack at once (the
	// file system's free space is the account), so a small archive that
	// decompresses to far more (a gzip bomb) cannot fill the host's disk
	// under them.
	MinFree int64
}

// DefaultLimits are the limits Open uses unless told otherwise.
var DefaultLimits = Limits{
	MaxLayerSize:    16 << 30,
	MaxImageSize:    32 << 30,
	MaxEntries:      1 << 20,
	MaxLayers:       128,
	MaxMetadataSize: 4 << 20,
	MaxXattrSize:    64 << 10,
	MaxArchiveSize:  32 << 30,
	MinFree:         1 << 30,
}

// withDefaults fills zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxLayerSize > 0 {
		d.MaxLayerSize = l.MaxLayerSize
	}
	if l.MaxImageSize > 0 {
		d.MaxImageSize = l.MaxImageSize
	}
	if l.MaxEntries > 0 {
		d.MaxEntries = l.MaxEntries
	}
	if l.MaxLayers > 0 {
		d.MaxLayers = l.MaxLayers
	}
	if l.MaxMetadataSize > 0 {
		d.MaxMetadataSize = l.MaxMetadataSize
	}
	if l.MaxXattrSize > 0 {
		d.MaxXattrSize = l.MaxXattrSize
	}
	if l.MaxArchiveSize > 0 {
		d.MaxArchiveSize = l.MaxArchiveSize
	}
	if l.MinFree > 0 {
		d.MinFree = l.MinFree
	}
	return d
}

// Option configures Open.
type Option func(*options)

type options struct {
	limits   Limits
	parallel int
}

// WithLimits sets the store's limits; zero fields keep their defaults.
func WithLimits(l Limits) Option {
	return func(o *options) { o.limits = l.withDefaults() }
}

// WithParallelLayers sets how many layers of one image are fetched and
// unpacked at once (default 3). Each layer is its own directory, so they
// need no ordering.
func WithParallelLayers(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.parallel = n
		}
	}
}
