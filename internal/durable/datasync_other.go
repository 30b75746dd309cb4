//go:build !linux

package durable

import "os"

// DataSync makes f's data last past a power loss (a full f.Sync where
// there is no fdatasync).
func DataSync(f *os.File) error {
	return f.Sync()
}
