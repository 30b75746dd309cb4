// Package disk owns the size-capped filesystems that hold sandboxes'
// writable layers, and their snapshots. Each volume is a file formatted
// as ext4, attached to a loop device and mounted on the host, so a sandbox
// that fills its disk gets ENOSPC at its own cap and nobody else notices;
// its blocks are allocated when it is handed out (or it is sparse, with
// Config.Overcommit above 1: space_linux.go). A volume's image is a clone
// of a pristine image formatted once per size (pristine_linux.go), so
// making one costs no mkfs; a Pool keeps ready, mounted volumes of the
// default size, made by a few low-priority workers, and hands one out by
// renaming its directory. Remove renames a volume into trash and returns;
// it is unmounted and deleted behind the caller (reap_linux.go).
//
// Layout under Config.Dir (everything there belongs to this package):
//
//	lock               flock held by the one process that owns Dir
//	pristine/<v>-ext4-<size>M.img  formatted images new volumes clone
//	pool/<n>/disk.img  a volume being made, or ready to hand out
//	pool/<n>/root      its mountpoint (or, without disk.img, a seed's: a
//	                   snapshot image mounted read-only, seed_linux.go)
//	vol/<id>/disk.img  the volume handed out to sandbox <id>
//	vol/<id>/root      its mountpoint: Volume.Path
//	trash/<n>/...      a volume being removed
//
// A volume changes state only by a rename of its whole directory (a
// mountpoint cannot be renamed while mounted, but its parent can, and the
// mount moves with it), so after a crash each directory is in exactly one
// state: pool and trash entries are swept by the next NewPool, vol entries
// are kept and re-mounted by Open. Entry names <n> are never used twice.
// Loop devices are attached with autoclear, so they free themselves when
// the last mount goes away (and only then can they be bound again), and
// with direct I/O, so a block is cached once, by the volume's filesystem.
//
// # Substrate
//
// Snapshots and forks clone a volume's image file. On a filesystem that
// can reflink (XFS, btrfs) a clone of a 10 GiB image takes milliseconds and
// shares every block until one side writes it; on one that cannot (ext4)
// it is a copy. PrepareSubstrate gives a directory reflink on any host: it
// makes an XFS filesystem (mkfs.xfs -m reflink=1) in the sparse file
// <dir>.xfs, attaches it to a direct I/O loop device and mounts it on
// <dir>. Volumes then sit on two filesystems but one page cache, and write
// at near the host's speed. The substrate outlives the process, like the
// volumes on it: put Config.Dir, and the files snapshots are written to,
// at or below <dir>, so clones share extents.
//
//	<dir>.xfs          the substrate image, sparse, next to <dir>
//	<dir>/             its mountpoint
//
// # Snapshots
//
// Pool.Snapshot captures a running sandbox's disk: syncfs flushes it while
// the sandbox still runs, then the caller's pause hook stops the sandbox
// (the cgroup freezer), FIFREEZE makes the image on disk clean (no journal
// to replay), the image is cloned, and the filesystem is thawed and the
// sandbox resumed, on every path. The sandbox stops for the clone alone:
// milliseconds with reflink, half a second to seconds per GiB of data when
// copying.
// A snapshot is a plain ext4 image; AcquireFrom makes a volume from one.
package disk

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

const (
	// MinSize is the smallest volume: below it ext4's own metadata and
	// journal leave too little room to be useful.
	MinSize = 16 << 20
	// MaxSize is the largest volume, the largest file ext4 with 4 KiB
	// blocks (the usual host filesystem) can hold.
	MaxSize = 16 << 40
	// DefaultSize is Config.DefaultSize when it is left zero.
	DefaultSize = 10 << 30

	sizeAlign = 1 << 20 // sizes are rounded up to whole MiB
	maxIDLen  = 64
	maxOwner  = 1<<32 - 2 // (uid_t)-1 means "unchanged" to chown
)

// Config configures a Pool.
type Config struct {
	// Dir holds every volume; the package owns everything under it.
	// Required, e.g. /var/lib/paddock/disks.
	Dir string
	// DefaultSize is the size of pooled volumes and of Acquire(size 0), in
	// bytes; 0 means DefaultSize (10 GiB).
	DefaultSize int64
	// PoolSize is how many ready volumes of DefaultSize to keep; 0 disables
	// the pool and every Acquire makes a volume.
	PoolSize int
	// Mkfs is the path of mkfs.ext4; empty looks it up in PATH, /usr/sbin
	// and /sbin.
	Mkfs string
	// Logger receives background events (refill failures, sweeps); nil
	// discards them.
	Logger *slog.Logger
	// Overcommit is how far the capacity of the disks may exceed the
	// storage's free space (space_linux.go): 1, the default, allocates
	// every image when it is handed out, so that a disk never promises
	// space its storage cannot give; above 1 images are sparse and admitted
	// while the capacity not yet written stays within the free space
	// times Overcommit. At most 100.
	Overcommit float64
	// Substrate is what PrepareSubstrate made of Dir or a parent of it;
	// snapshots copy rather than reflink when its Reflink is false. nil
	// means Dir is used as it is: snapshots try reflink and fall back to
	// copying.
	Substrate *Substrate
}

// SubstrateOptions configure PrepareSubstrate.
type SubstrateOptions struct {
	// Size is the size in bytes of an XFS image made for the substrate,
	// rounded up to whole MiB, at least 300 MiB (mkfs.xfs's minimum). The
	// image is sparse; 0 means the size of the filesystem that holds the
	// directory (at least 1 GiB), so it fills when the host's disk does.
	// It matters only when the image is made.
	Size int64
	// Mkfs is the path of mkfs.xfs; empty looks it up in PATH, /usr/sbin
	// and /sbin.
	Mkfs string
	// ForceCopy prepares the directory as usual but makes snapshots copy
	// images rather than reflink them (Substrate.Reflink is false): to rule
	// reflink out, and for tests of the copy path.
	ForceCopy bool
}

// Capture describes a snapshot taken by Pool.Snapshot.
type Capture struct {
	// Frozen is how long the sandbox was paused, from calling pause to
	// resume returning; without a pause hook it is FSFrozen, the time its
	// writes were blocked.
	Frozen time.Duration
	// FSFrozen is how long the filesystem was frozen (FIFREEZE to FITHAW).
	FSFrozen time.Duration
	// Total is the whole call, the flush and the snapshot's fsync included.
	Total time.Duration
	// Bytes is the disk space the image had allocated when captured, what
	// a copy costs and a reflink shares.
	Bytes int64
	// Reflink reports whether the snapshot shares extents with the image
	// (false: it is a copy).
	Reflink bool
}

// Volume is a mounted, size-capped filesystem handed out to one sandbox.
type Volume struct {
	ID     string
	Path   string // mountpoint on the host
	Size   int64  // bytes, the size of the backing file
	Device string // /dev/loopN
}

const (
	imageName = "disk.img"
	rootName  = "root"
)

// normalizeSize checks a requested size and rounds it up to whole MiB.
func normalizeSize(size int64) (int64, error) {
	if size < MinSize {
		return 0, errdefs.Invalid("disk", "size %d is below the minimum of %d MiB", size, MinSize>>20)
	}
	if size > MaxSize {
		return 0, errdefs.Invalid("disk", "size %d is above the maximum of %d TiB", size, MaxSize>>40)
	}
	return (size + sizeAlign - 1) / sizeAlign * sizeAlign, nil
}

func validateOwner(uid, gid int) error {
	if uid < 0 || uid > maxOwner {
		return errdefs.Invalid("uid", "%d is out of range", uid)
	}
	if gid < 0 || gid > maxOwner {
		return errdefs.Invalid("gid", "%d is out of range", gid)
	}
	return nil
}

// withDefaults validates cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Dir == "" {
		return cfg, errdefs.Invalid("dir", "is required")
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return cfg, fmt.Errorf("resolving %s: %w", cfg.Dir, err)
	}
	cfg.Dir = abs
	if cfg.DefaultSize == 0 {
		cfg.DefaultSize = DefaultSize
	}
	if cfg.DefaultSize, err = normalizeSize(cfg.DefaultSize); err != nil {
		return cfg, err
	}
	if cfg.PoolSize < 0 {
		return cfg, errdefs.Invalid("pool size", "%d is negative", cfg.PoolSize)
	}
	if cfg.Overcommit == 0 {
		cfg.Overcommit = 1
	}
	if !(cfg.Overcommit >= 1 && cfg.Overcommit <= 100) {
		return cfg, errdefs.Invalid("disk overcommit", "must be between 1 and 100, got %v", cfg.Overcommit)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}
