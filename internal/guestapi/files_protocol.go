package guestapi

import "github.com/paddock-dev/paddock/api"

// File ops of the control protocol. Every path names a file inside the
// sandbox: it is resolved by the guest under the sandbox's root, relative
// paths against the sandbox's workdir.
//
// Each op is one connection: the Request frame (with File set), then the
// guest's Response frame (an error, or File set), then for some ops a
// stream:
//
//	file.read     guest → Data frames (File.Length bytes in all, or until
//	              the file's end when Length is -1), then End.
//	file.write    Response once the target is known to be writable; then
//	              client → Data frames, End (Bytes = the total sent); then
//	              guest → End (Info of the file, or Error). Nothing
//	              replaces the target until the client's End arrived and
//	              the file was synced: a client that goes away leaves it
//	              as it was.
//	file.list     guest → Event frames, each a JSON array of api.FileInfo,
//	              then End (Entries = how many).
//	file.tar_get  guest → Data frames of a tar stream, then End.
//	file.tar_put  like file.write, the Data frames carrying a tar stream;
//	              the guest's End has Entries and Bytes.
//	file.watch    guest → Event frames, one api.FileEvent each, until the
//	              client closes the connection; End if the watch ends on
//	              the guest's side (the directory was removed).
//
// An End with Error set ends a stream that failed part way.
const (
	OpFileRead   = "file.read"
	OpFileWrite  = "file.write"
	OpFileStat   = "file.stat"
	OpFileList   = "file.list"
	OpFileMkdir  = "file.mkdir"
	OpFileRemove = "file.remove"
	OpFileMove   = "file.move"
	OpFileTarGet = "file.tar_get"
	OpFileTarPut = "file.tar_put"
	OpFileWatch  = "file.watch"
)

// FileRequest holds the arguments of the file ops.
type FileRequest struct {
	Path string `json:"path"`
	// To is where move puts Path.
	To string `json:"to,omitempty"`
	// Offset and Length select a byte range for read; a nil Length reads
	// to the end.
	Offset int64  `json:"offset,omitempty"`
	Length *int64 `json:"length,omitempty"`
	// Mode is the permission bits for write and mkdir; nil keeps an
	// existing file's mode, or uses 0644 (files) and 0755 (directories).
	Mode *api.FileMode `json:"mode,omitempty"`
	// Owner is "USER[:GROUP]" (names or numbers, resolved in the
	// sandbox's /etc/passwd and /etc/group) for write, mkdir and
	// tar_put; empty keeps an existing file's owner, or root.
	Owner string `json:"owner,omitempty"`
	// Depth is how many levels list descends (1: the directory's own
	// entries).
	Depth int `json:"depth,omitempty"`
	// Recursive: remove a directory with its contents; watch
	// subdirectories too.
	Recursive bool `json:"recursive,omitempty"`
	// Parents: mkdir creates missing parents and accepts an existing
	// directory.
	Parents bool `json:"parents,omitempty"`
	// Overwrite: move may replace an existing To.
	Overwrite bool `json:"overwrite,omitempty"`
	// Xattrs are extended attributes (user.* names) write gives the new
	// file. A write replaces the file, so attributes not named here are
	// gone.
	Xattrs map[string]string `json:"xattrs,omitempty"`
	// XattrPrefix (under user.) makes stat, list, move and write answer
	// each regular file's and directory's attributes that start with it.
	XattrPrefix string `json:"xattr_prefix,omitempty"`
}

// FileResponse holds the answers of the file ops.
type FileResponse struct {
	// Info describes the file that stat, mkdir and move answer about, or
	// the file a read is about to send.
	Info *api.FileInfo `json:"info,omitempty"`
	// Length is how many bytes of data a read sends, or -1 when that is
	// not known in advance (files whose size the kernel makes up).
	Length int64 `json:"length,omitempty"`
}

// FileEnd is the payload of the End frame that closes a file stream.
type FileEnd struct {
	// Bytes is how many bytes of data the stream carried.
	Bytes int64 `json:"bytes"`
	// Entries counts list entries or extracted tar entries.
	Entries int64 `json:"entries,omitempty"`
	// Info describes the file a write produced.
	Info *api.FileInfo `json:"info,omitempty"`
	// Error says why the stream failed part way.
	Error *api.Error `json:"error,omitempty"`
	// Reason says why a watch ended on the guest's side.
	Reason string `json:"reason,omitempty"`
}
