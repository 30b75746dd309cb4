package daemon

import (
	"fmt"
	"os"
	"time"

	"github.com/paddock-dev/paddock/internal/archive"
)

// ArchiveConfig is the object store paused sandboxes are archived to
// (package archive): any S3-compatible endpoint. Its keys come from the
// environment (PADDOCK_ARCHIVE_ACCESS_KEY, PADDOCK_ARCHIVE_SECRET_KEY),
// not the command line.
type ArchiveConfig struct {
	// Endpoint is http(s)://HOST[:PORT]; empty: no archive.
	Endpoint string
	Bucket   string
	Prefix   string
	// After archives paused sandboxes idle that long (0: on request
	// only).
	After time.Duration
}

// OpenArchive returns the store ac names (nil when it names none).
func OpenArchive(ac ArchiveConfig) (*archive.Store, error) {
	if ac.Endpoint == "" {
		if ac.After > 0 {
			return nil, fmt.Errorf("--archive-after needs --archive-endpoint")
		}
		return nil, nil
	}
	bucket := ac.Bucket
	if bucket == "" {
		bucket = "paddock"
	}
	return archive.Open(archive.Config{
		Endpoint:  ac.Endpoint,
		Bucket:    bucket,
		Prefix:    ac.Prefix,
		AccessKey: os.Getenv("PADDOCK_ARCHIVE_ACCESS_KEY"),
		SecretKey: os.Getenv("PADDOCK_ARCHIVE_SECRET_KEY"),
		Region:    os.Getenv("PADDOCK_ARCHIVE_REGION"),
	})
}
