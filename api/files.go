package api

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The bodies of the /v1/sandboxes/{id}/files endpoints. The guest sends
// the same FileInfo and FileEvent values to the daemon, which passes them
// on as they are.

// File types in FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other" // devices, fifos, sockets
)

// FileInfo describes one file in a sandbox. A symbolic link is described
// as a link, with its target, never as what it points at.
type FileInfo struct {
	// Name is the last element of Path ("/" for the root).
	Name string `json:"name"`
	// Path is the absolute path inside the sandbox.
	Path string `json:"path"`
	// Type is file, dir, symlink or other (devices, fifos, sockets).
	Type  string   `json:"type"`
	Size  int64    `json:"size"`
	Mode  FileMode `json:"mode"`
	UID   uint32   `json:"uid"`
	GID   uint32   `json:"gid"`
	User  string   `json:"user,omitempty"`
	Group string   `json:"group,omitempty"`
	// ModTime is the last modification time.
	ModTime time.Time `json:"mtime"`
	// LinkTarget is a symbolic link's target, as stored.
	LinkTarget string `json:"link_target,omitempty"`
	// Xattrs are extended attributes, only when asked for (the E2B
	// facade's file metadata).
	Xattrs map[string]string `json:"xattrs,omitempty"`
}

// IsDir reports whether the file is a directory.
func (fi *FileInfo) IsDir() bool { return fi.Type == TypeDir }

// FileMode is a file's permission bits with setuid (04000), setgid
// (02000) and sticky (01000), as in chmod. JSON carries it as an octal
// string ("0644").
type FileMode uint32

func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

// MarshalJSON writes the mode as an octal string.
func (m FileMode) MarshalJSON() ([]byte, error) { return json.Marshal(m.String()) }

// UnmarshalJSON reads an octal string ("0644", "644", "0o644").
func (m *FileMode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("mode must be an octal string such as \"0644\"")
	}
	v, err := ParseFileMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseFileMode parses permission bits written in octal: "0644", "644",
// "0o644"; at most 07777. It is UnmarshalJSON's parser, for the modes
// that arrive outside JSON (query arguments, flags).
func ParseFileMode(s string) (FileMode, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || t == "" || v > 0o7777 {
		return 0, fmt.Errorf("%q is not an octal mode from 0000 to 7777", s)
	}
	return FileMode(v), nil
}

// OS returns the mode as an os.FileMode (permission and special bits).
func (m FileMode) OS() os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// MkdirRequest is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MkdirRequest struct {
	Path string `json:"path"`
	// Parents makes missing parents too, and accepts an existing
	// directory (mkdir -p).
	Parents bool `json:"parents"`
	// Mode is octal, as FileMode writes it ("0755"); empty means 0755.
	// It is a string so that the daemon can name the field when it is
	// not a mode.
	Mode string `json:"mode,omitempty"`
	// Owner is "USER[:GROUP]" for the directories made; empty is root.
	Owner string `json:"owner"`
}

// RemoveRequest is the body of POST /v1/sandboxes/{id}/files/remove.
type RemoveRequest struct {
	Path string `json:"path"`
	// Recursive removes a directory with its contents.
	Recursive bool `json:"recursive"`
}

// MoveRequest is the body of POST /v1/sandboxes/{id}/files/move.
type MoveRequest struct {
	From string `json:"from"`
	// To is the new name, not a directory to move into.
	To string `json:"to"`
	// Overwrite may replace an existing To (a directory only if empty).
	Overwrite bool `json:"overwrite"`
}

// TarResult is the answer to PUT /v1/sandboxes/{id}/files/tar.
type TarResult struct {
	// Entries is how many entries were extracted.
	Entries int64 `json:"entries"`
	// Bytes is the size of the tar stream received.
	Bytes int64 `json:"bytes"`
}

// File event types in FileEvent.Type.
const (
	EventCreate = "create"
	EventWrite  = "write"
	EventRemove = "remove" // also: moved out of the watched tree
	EventRename = "rename" // within the watched tree; OldPath is set
	EventChmod  = "chmod"  // mode, owner or times changed
	// EventOverflow says events were lost: the kernel's queue overflowed
	// or a new directory could not be watched.
	EventOverflow = "overflow"
)

// FileEvent is one change under a watched directory: one line of the
// newline-delimited JSON of GET /v1/sandboxes/{id}/files/watch.
type FileEvent struct {
	Type string `json:"type"`
	// Path is the absolute path of the file that changed (the new name
	// for a rename).
	Path string `json:"path"`
	// OldPath is a renamed file's previous path.
	OldPath string    `json:"old_path,omitempty"`
	IsDir   bool      `json:"is_dir,omitempty"`
	Time    time.Time `json:"time"`
}

// WatchEndType is the Type of a WatchEnd, which no FileEvent has.
const WatchEndType = "end"

// WatchEnd is the last line of a watch that the daemon ends: the watched
// directory went away (Reason), or the sandbox did or the watch broke
// (Error).
type WatchEnd struct {
	Type   string `json:"type"` // WatchEndType
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}
