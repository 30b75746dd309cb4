package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/paddock-dev/paddock/api"
)

// Files in a sandbox. Every path is interpreted inside the sandbox: it is
// resolved under the sandbox's root (symbolic links included, so a link
// to /etc/shadow means the sandbox's /etc/shadow), and a relative path is
// taken from the sandbox's workdir. Bodies stream both ways: nothing here
// holds a whole file in memory.

// The file types are the API's (package api); the SDK names them too.
type (
	// FileInfo describes a file in a sandbox. A symbolic link is
	// described as a link, with its target.
	FileInfo = api.FileInfo
	// FileMode is a file's permission bits with setuid (04000), setgid
	// (02000) and sticky (01000), as in chmod. JSON carries it as an
	// octal string ("0644").
	FileMode = api.FileMode
	// FileEvent is one change under a watched directory.
	FileEvent = api.FileEvent
	// TarResult is the answer to UploadTar.
	TarResult = api.TarResult
)

// File types in FileInfo.Type.
const (
	TypeFile    = api.TypeFile
	TypeDir     = api.TypeDir
	TypeSymlink = api.TypeSymlink
	TypeOther   = api.TypeOther // devices, fifos, sockets
)

// Event types in FileEvent.Type.
const (
	EventCreate = api.EventCreate
	EventWrite  = api.EventWrite
	EventRemove = api.EventRemove // also: moved out of the watched tree
	EventRename = api.EventRename // within the watched tree; OldPath is set
	EventChmod  = api.EventChmod  // mode, owner or times changed
	// EventOverflow says events were lost: the kernel's queue overflowed
	// or a new directory could not be watched.
	EventOverflow = api.EventOverflow
)

// ModeOf returns the FileMode of an os.FileMode's permission and special
// bits; FileMode.OS is its inverse.
func ModeOf(fm os.FileMode) FileMode {
	m := FileMode(fm.Perm())
	if fm&os.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fm&os.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fm&os.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

func filesPath(id, sub string, q url.Values) string {
	p := "/v1/sandboxes/" + url.PathEscape(id) + "/files" + sub
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return p
}

// stream sends a request with a raw body (or none) and returns the
// response when it is a success.
func (c *Client) stream(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	if body != nil {
		body = uploadBody{body}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+inContainer(ctx, path), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// upload PUTs a raw body and decodes the JSON answer into out; what
// names the call in a decoding error.
func (c *Client) upload(ctx context.Context, path string, body io.Reader, contentType, what string, out any) error {
	resp, err := c.stream(ctx, http.MethodPut, path, body, contentType)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s answer: %w", what, err)
	}
	return nil
}

// uploadBody hands the transport the caller's reader in 1 MiB chunks
// (net/http copies a body 32 KiB at a time otherwise).
type uploadBody struct{ r io.Reader }

func (b uploadBody) Read(p []byte) (int, error) { return b.r.Read(p) }

var uploadBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func (b uploadBody) WriteTo(w io.Writer) (int64, error) {
	buf := uploadBufs.Get().(*[]byte)
	defer uploadBufs.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{b.r}, *buf)
}

// ReadFile returns the contents of a file in the sandbox as a stream. The
// caller closes it. A read that fails part way returns an error from
// Read, never a silently short file.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	return c.ReadFileRange(ctx, id, path, 0, -1)
}

// ReadFileRange returns length bytes of a file from offset (to the end
// when length is negative).
func (c *Client) ReadFileRange(ctx context.Context, id, path string, offset, length int64) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if offset != 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length >= 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	resp, err := c.stream(ctx, http.MethodGet, filesPath(id, "", q), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteOptions are the options of WriteFile.
type WriteOptions struct {
	// Mode is the file's permission bits (os.ModeSetuid and friends
	// included). Zero keeps an existing file's mode; a new file gets 0644.
	Mode os.FileMode
	// Owner is "USER[:GROUP]", names or numbers, resolved in the
	// sandbox's /etc/passwd and /etc/group. Empty keeps an existing
	// file's owner; a new file is root's.
	Owner string
}

// WriteFile writes r's bytes to a file in the sandbox, atomically: the
// data goes to a temporary file beside it, which is synced and renamed
// over the path only when r is done. A symbolic link at path is replaced,
// not written through. Missing parent directories are made.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts WriteOptions) (*FileInfo, error) {
	q := url.Values{"path": {path}}
	if opts.Mode != 0 {
		q.Set("mode", ModeOf(opts.Mode).String())
	}
	if opts.Owner != "" {
		q.Set("owner", opts.Owner)
	}
	if r == nil {
		r = bytes.NewReader(nil)
	}
	var fi FileInfo
	if err := c.upload(ctx, filesPath(id, "", q), r, "application/octet-stream", "write", &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Stat describes a file in the sandbox (a symbolic link as a link).
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodGet, filesPath(id, "/stat", url.Values{"path": {path}}), nil, &fi)
}

// Exists reports whether path exists in the sandbox (a dangling symbolic
// link exists).
func (c *Client) Exists(ctx context.Context, id, path string) (bool, error) {
	_, err := c.Stat(ctx, id, path)
	if errors.Is(err, ErrNotFound) {
		var e *Error
		// A missing sandbox is an error, not a missing file.
		if errors.As(err, &e) && strings.HasPrefix(e.Message, "not found: sandbox") {
			return false, err
		}
		return false, nil
	}
	return err == nil, err
}

// ListFiles lists a directory: depth 1 gives its entries, more descends
// into subdirectories (not through symbolic links), each directory's
// entry before its contents, names sorted.
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) ([]FileInfo, error) {
	var out []FileInfo
	err := c.ListFilesFunc(ctx, id, path, depth, func(fi FileInfo) error {
		out = append(out, fi)
		return nil
	})
	return out, err
}

// ListFilesFunc is ListFiles calling fn with each entry as it arrives,
// for listings too big to hold; an error from fn stops it.
func (c *Client) ListFilesFunc(ctx context.Context, id, path string, depth int, fn func(FileInfo) error) error {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	resp, err := c.stream(ctx, http.MethodGet, filesPath(id, "/list", q), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("reading the list of %s: %w", path, err)
	}
	for dec.More() {
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			return fmt.Errorf("reading the list of %s: %w", path, err)
		}
		if err := fn(fi); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("reading the list of %s: %w", path, err)
	}
	return nil
}

// MkdirOptions are the options of Mkdir.
type MkdirOptions struct {
	// Parents makes missing parents too, and accepts an existing
	// directory (mkdir -p).
	Parents bool
	// Mode of the directories made; zero means 0755.
	Mode os.FileMode
	// Owner of the directories made, as in WriteOptions.
	Owner string
}

// Mkdir makes a directory in the sandbox.
func (c *Client) Mkdir(ctx context.Context, id, path string, opts MkdirOptions) (*FileInfo, error) {
	body := api.MkdirRequest{Path: path, Parents: opts.Parents, Owner: opts.Owner}
	if opts.Mode != 0 {
		body.Mode = ModeOf(opts.Mode).String()
	}
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodPost, filesPath(id, "/mkdir", nil), body, &fi)
}

// Remove removes a file, a symbolic link (not its target) or an empty
// directory; with recursive, a directory and everything in it.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	body := api.RemoveRequest{Path: path, Recursive: recursive}
	return c.do(ctx, http.MethodPost, filesPath(id, "/remove", nil), body, nil)
}

// Move renames from to to (exactly: to is the new name, not a directory
// to move into). An existing to is a conflict unless overwrite is set.
func (c *Client) Move(ctx context.Context, id, from, to string, overwrite bool) (*FileInfo, error) {
	body := api.MoveRequest{From: from, To: to, Overwrite: overwrite}
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodPost, filesPath(id, "/move", nil), body, &fi)
}

// DownloadTar returns a file or directory tree of the sandbox as a tar
// stream. Entry names start with the path's last element ("proj/",
// "proj/main.go"); symbolic links are stored as links; /proc, /sys,
// devices and sockets are left out. Extract it with care: it comes from
// the sandbox.
func (c *Client) DownloadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.stream(ctx, http.MethodGet, filesPath(id, "/tar", url.Values{"path": {path}}), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadOptions are the options of UploadTar.
type UploadOptions struct {
	// Owner, if set, owns every entry ("USER[:GROUP]"); otherwise the
	// tar's numeric ids are used.
	Owner string
}

// UploadTar extracts a tar stream into directory dir of the sandbox
// (made, with its parents, if missing). Entries with ".." are refused,
// absolute names are taken as relative to dir, and nothing is written
// through a symbolic link that leads out of dir; the error names the
// entry. Entries before a refused one stay.
func (c *Client) UploadTar(ctx context.Context, id, dir string, r io.Reader, opts UploadOptions) (*TarResult, error) {
	q := url.Values{"path": {dir}}
	if opts.Owner != "" {
		q.Set("owner", opts.Owner)
	}
	var res TarResult
	if err := c.upload(ctx, filesPath(id, "/tar", q), r, "application/x-tar", "upload", &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Watcher is a watch on a directory of a sandbox.
type Watcher struct {
	// Events delivers the changes; it is closed when the watch ends.
	Events <-chan FileEvent

	body   io.ReadCloser
	cancel context.CancelFunc
	mu     sync.Mutex
	err    error
}

// Watch watches a directory of the sandbox (and its subdirectories with
// recursive) and returns once the watch is in place: changes made after
// Watch returns are reported. It ends when ctx ends, Close is called, the
// directory is removed or the sandbox ends; Err then says why.
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool) (*Watcher, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	ctx, cancel := context.WithCancel(ctx)
	resp, err := c.stream(ctx, http.MethodGet, filesPath(id, "/watch", q), nil, "")
	if err != nil {
		cancel()
		return nil, err
	}
	ch := make(chan FileEvent, 64)
	w := &Watcher{Events: ch, body: resp.Body, cancel: cancel}
	go w.read(ctx, ch)
	return w, nil
}

// watchLine is one line of a watch stream: an event, or its end (the
// fields of an api.WatchEnd that a FileEvent lacks).
type watchLine struct {
	FileEvent
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

func (w *Watcher) read(ctx context.Context, ch chan<- FileEvent) {
	defer close(ch)
	defer w.body.Close()
	br := bufio.NewReaderSize(w.body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			if ctx.Err() == nil {
				w.setErr(fmt.Errorf("%w: the watch stream broke: %v", ErrUnavailable, err))
			}
			return
		}
		var l watchLine
		if err := json.Unmarshal(line, &l); err != nil {
			w.setErr(fmt.Errorf("decoding a watch event: %w", err))
			return
		}
		if l.Type == api.WatchEndType {
			switch {
			case l.Error == "sandbox ended":
				w.setErr(fmt.Errorf("%w: sandbox ended", ErrConflict))
			case l.Error != "":
				w.setErr(fmt.Errorf("%w: %s", ErrUnavailable, l.Error))
			default:
				w.setErr(fmt.Errorf("%w: %s", ErrNotFound, l.Reason))
			}
			return
		}
		select {
		case ch <- l.FileEvent:
		case <-ctx.Done():
			return
		}
	}
}

func (w *Watcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

// Err says why the watch ended, once Events is closed: nil when it was
// closed by Close or its context, ErrNotFound when the directory was
// removed, ErrConflict when the sandbox ended.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close ends the watch.
func (w *Watcher) Close() error {
	w.cancel()
	return nil
}
