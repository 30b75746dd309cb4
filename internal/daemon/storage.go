package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// storageWatchEvery is how often watchStorage measures the storage.
const storageWatchEvery = 30 * time.Second

// watchStorage logs a warning when the storage can no longer hold what its
// disks were promised (Space.Short above 0: thin disks, or blocks shared
// with snapshots, on a filling host), and again when that ends, until ctx
// ends. The metrics say the same (paddock_storage_short_bytes); the log is
// for a daemon nobody scrapes.
func watchStorage(ctx context.Context, disks *disk.Pool, log *slog.Logger) {
	short := false
	t := time.NewTicker(storageWatchEvery)
	defer t.Stop()
	for {
		if sp, err := disks.Space(); err == nil && (sp.Short > 0) != short {
			short = !short
			if short {
				log.Warn("the storage cannot hold what its disks were promised: writes past it will fail with I/O errors",
					"short_bytes", sp.Short, "promised_bytes", sp.Promised, "free_bytes", sp.Free, "host_free_bytes", sp.HostFree)
			} else {
				log.Info("the storage holds what its disks were promised again", "free_bytes", sp.Free)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
