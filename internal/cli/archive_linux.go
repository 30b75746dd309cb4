//go:build linux

package cli

import (
	"github.com/spf13/pflag"

	"github.com/paddock-dev/paddock/internal/daemon"
)

// archiveFlags name the object store paused sandboxes are archived to
// (paddock serve: where to archive; paddock gateway: where to find
// archived sandboxes whose node is gone).
func archiveFlags(f *pflag.FlagSet, ac *daemon.ArchiveConfig) {
	f.StringVar(&ac.Endpoint, "archive-endpoint", "", "S3-compatible object store for archived sandboxes, http(s)://HOST[:PORT] (keys: $PADDOCK_ARCHIVE_ACCESS_KEY, $PADDOCK_ARCHIVE_SECRET_KEY)")
	f.StringVar(&ac.Bucket, "archive-bucket", "paddock", "the archive's bucket (made if missing)")
	f.StringVar(&ac.Prefix, "archive-prefix", "", "put before every object's name in the archive's bucket")
}
