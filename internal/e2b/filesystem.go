package e2b

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// The filesystem.Filesystem service, over the guest's file ops. The
// guest resolves every path under the sandbox's root.

type entryInfo struct {
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Path          string    `json:"path"`
	Size          string    `json:"size"` // int64: a string in proto3 JSON
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget *string   `json:"symlinkTarget,omitempty"`
	// Metadata is the file's user.e2b.* attributes (envd 0.6.2).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// entryOf describes a file as envd does: mode is the permission bits
// (os.FileMode.Perm), permissions the file's own mode as Go prints it
// (type letter included), owners by name. A symlink is described by its
// target, as envd does: symlinkTarget is the resolved path, type and mode
// are the target's (unspecified and 0 when it does not resolve), the
// rest the link's own.
func entryOf(fi api.FileInfo, link *resolvedLink) entryInfo {
	mode := fi.Mode.OS()
	typ := fileType(fi.Type)
	perm := mode
	switch fi.Type {
	case api.TypeDir:
		mode |= fs.ModeDir
	case api.TypeSymlink:
		mode |= fs.ModeSymlink
		perm, typ = 0, "FILE_TYPE_UNSPECIFIED"
		if link != nil && link.target != nil {
			perm, typ = link.target.Mode.OS(), fileType(link.target.Type)
		}
	}
	e := entryInfo{
		Name: fi.Name, Type: typ, Path: fi.Path, Size: strconv.FormatInt(fi.Size, 10),
		Mode: uint32(perm.Perm()), Permissions: mode.String(),
		Owner: nameOr(fi.User, fi.UID), Group: nameOr(fi.Group, fi.GID),
		ModifiedTime: fi.ModTime.UTC(),
		Metadata:     fileMetadata(fi.Xattrs),
	}
	if fi.Type == api.TypeSymlink {
		t := fi.Path
		if link != nil {
			t = link.path
		}
		e.SymlinkTarget = &t
	}
	return e
}

func fileType(t string) string {
	switch t {
	case api.TypeFile:
		return "FILE_TYPE_FILE"
	case api.TypeDir:
		return "FILE_TYPE_DIRECTORY"
	case api.TypeSymlink:
		return "FILE_TYPE_SYMLINK"
	}
	return "FILE_TYPE_UNSPECIFIED"
}

// resolvedLink is where a symlink leads: the absolute path, and the file
// there (nil when the chain ends nowhere).
type resolvedLink struct {
	path   string
	target *api.FileInfo
}

// maxLinkHops bounds a symlink chain, as the kernel's 40 does.
const maxLinkHops = 40

// resolveLink follows the symlink fi to what it names, inside the
// sandbox (the guest resolves each path under the sandbox's root). A
// chain that loops or leads nowhere resolves to the link's own path, as
// envd's does.
func resolveLink(ctx context.Context, gc *guestapi.Client, fi api.FileInfo) *resolvedLink {
	cur := fi
	for range maxLinkHops {
		next := cur.LinkTarget
		if !path.IsAbs(next) {
			next = path.Join(path.Dir(cur.Path), next)
		}
		next = path.Clean(next)
		t, err := gc.Stat(ctx, guestapi.FileRequest{Path: next})
		if err != nil {
			break
		}
		if t.Type != api.TypeSymlink {
			return &resolvedLink{path: next, target: t}
		}
		cur = *t
		cur.Path = next
	}
	return &resolvedLink{path: fi.Path}
}

// describe is entryOf with a symlink resolved.
func describe(ctx context.Context, gc *guestapi.Client, fi api.FileInfo) entryInfo {
	if fi.Type != api.TypeSymlink {
		return entryOf(fi, nil)
	}
	return entryOf(fi, resolveLink(ctx, gc, fi))
}

func nameOr(name string, id uint32) string {
	if name != "" {
		return name
	}
	return strconv.FormatUint(uint64(id), 10)
}

type pathRequest struct {
	Path string `json:"path"`
}

// callPath resolves a request path for the call's user.
func callPath(r *http.Request, p string, field string) (string, string, error) {
	user, err := userOf(r)
	if err != nil {
		return "", "", err
	}
	if strings.ContainsRune(p, 0) {
		return "", "", errdefs.Invalid(field, "contains a NUL byte")
	}
	return user, resolve(user, p), nil
}

// fileDo makes a file op of the call's sandbox that answers with a
// file's description: (*guestapi.Client).Stat, Mkdir or Move.
func (s *Server) fileDo(r *http.Request, op func(*guestapi.Client, context.Context, guestapi.FileRequest) (*api.FileInfo, error), fr guestapi.FileRequest) (*api.FileInfo, error) {
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	return op(gc, r.Context(), fr)
}

func (s *Server) fsStat(r *http.Request, req *pathRequest) (any, error) {
	_, p, err := callPath(r, req.Path, "path")
	if err != nil {
		return nil, err
	}
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	fi, err := gc.Stat(r.Context(), guestapi.FileRequest{Path: p, XattrPrefix: metadataXattr})
	if err != nil {
		return nil, err
	}
	return map[string]any{"entry": describe(r.Context(), gc, *fi)}, nil
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

func (s *Server) fsListDir(r *http.Request, req *listDirRequest) (any, error) {
	_, p, err := callPath(r, req.Path, "path")
	if err != nil {
		return nil, err
	}
	depth := max(int(min(req.Depth, 64)), 1)
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	ls, err := gc.ListDir(r.Context(), guestapi.FileRequest{Path: p, Depth: depth, XattrPrefix: metadataXattr})
	if err != nil {
		return nil, err
	}
	defer ls.Close()
	out := []entryInfo{}
	for {
		batch, err := ls.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		for _, fi := range batch {
			out = append(out, describe(r.Context(), gc, fi))
		}
	}
	return map[string]any{"entries": out}, nil
}

func (s *Server) fsMakeDir(r *http.Request, req *pathRequest) (any, error) {
	user, p, err := callPath(r, req.Path, "path")
	if err != nil {
		return nil, err
	}
	if _, err := s.fileDo(r, (*guestapi.Client).Stat, guestapi.FileRequest{Path: p}); err == nil {
		return nil, &rpcError{Code: "already_exists", Message: p + " already exists"}
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	fi, err := s.fileDo(r, (*guestapi.Client).Mkdir, guestapi.FileRequest{Path: p, Parents: true, Owner: user})
	if err != nil {
		return nil, err
	}
	return map[string]any{"entry": entryOf(*fi, nil)}, nil
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

func (s *Server) fsMove(r *http.Request, req *moveRequest) (any, error) {
	_, from, err := callPath(r, req.Source, "source")
	if err != nil {
		return nil, err
	}
	_, to, err := callPath(r, req.Destination, "destination")
	if err != nil {
		return nil, err
	}
	fi, err := s.fileDo(r, (*guestapi.Client).Move, guestapi.FileRequest{Path: from, To: to, Overwrite: true, XattrPrefix: metadataXattr})
	if err != nil {
		return nil, err
	}
	if fi == nil {
		if fi, err = s.fileDo(r, (*guestapi.Client).Stat, guestapi.FileRequest{Path: to, XattrPrefix: metadataXattr}); err != nil {
			return nil, err
		}
	}
	return map[string]any{"entry": entryOf(*fi, nil)}, nil
}

func (s *Server) fsRemove(r *http.Request, req *pathRequest) (any, error) {
	_, p, err := callPath(r, req.Path, "path")
	if err != nil {
		return nil, err
	}
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	// envd's RemoveAll: a path that is not there is removed already.
	if err := gc.Remove(r.Context(), guestapi.FileRequest{Path: p, Recursive: true}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	return struct{}{}, nil
}

type watchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
	// IncludeEntry adds each changed file's entry info to its event
	// (envd 0.6.3).
	IncludeEntry bool `json:"includeEntry"`
	// AllowNetworkMounts lets a directory on a network mount be watched,
	// by polling (envd 0.6.4, watchpoll.go).
	AllowNetworkMounts bool `json:"allowNetworkMounts"`
}

type watchEvent struct {
	Start      *struct{}        `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *struct{}        `json:"keepalive,omitempty"`
}

type filesystemEvent struct {
	Name  string     `json:"name"`
	Type  string     `json:"type"`
	Entry *entryInfo `json:"entry,omitempty"`
}

var eventTypes = map[string]string{
	api.EventCreate: "EVENT_TYPE_CREATE",
	api.EventWrite:  "EVENT_TYPE_WRITE",
	api.EventRemove: "EVENT_TYPE_REMOVE",
	api.EventRename: "EVENT_TYPE_RENAME",
	api.EventChmod:  "EVENT_TYPE_CHMOD",
}

func (s *Server) fsWatchDir(w http.ResponseWriter, r *http.Request) {
	var req watchRequest
	st, err := openStream(w, r, &req)
	if err == nil {
		err = s.watch(r, st, &req)
	}
	if err != nil {
		st.end(s, r, err)
	}
}

// watch streams a directory's changes: a start event once the watch is
// in place, then one event per change, named relative to the directory.
// A rename within the tree is reported as envd does: the old name
// renamed, the new one created.
func (s *Server) watch(r *http.Request, st *stream, req *watchRequest) error {
	_, dir, err := callPath(r, req.Path, "path")
	if err != nil {
		return err
	}
	gc, err := s.guestOf(r)
	if err != nil {
		return err
	}
	info, err := gc.Stat(r.Context(), guestapi.FileRequest{Path: dir})
	if err != nil {
		return err
	}
	if info.Type != api.TypeDir {
		return errdefs.Invalid("path", "%s is not a directory", dir)
	}
	id := sandboxID(r)
	defer s.mgr.Busy(id)()
	done, err := s.mgr.Done(r.Context(), id)
	if err != nil {
		return err
	}
	var ev fileEvents
	if fstype := networkMount(r.Context(), gc, dir); fstype == "" {
		ev, err = gc.Watch(r.Context(), guestapi.FileRequest{Path: dir, Recursive: req.Recursive})
	} else if !req.AllowNetworkMounts {
		err = errNetworkMount(dir, fstype)
	} else {
		ev, err = newPoller(r.Context(), gc, dir, req.Recursive)
	}
	if err != nil {
		return err
	}
	defer ev.Close()
	stop := context.AfterFunc(r.Context(), ev.Abort)
	defer stop()
	if st.send(watchEvent{Start: &struct{}{}}) != nil {
		return nil
	}
	defer st.keepalive(keepaliveInterval(r), watchEvent{Keepalive: &struct{}{}})()
	rel := func(p string) string {
		if rp, ok := strings.CutPrefix(p, strings.TrimSuffix(dir, "/")+"/"); ok {
			return rp
		}
		return path.Base(p)
	}
	for {
		e, err := ev.Next()
		if err != nil {
			var ended *guestapi.WatchEnded
			switch {
			case r.Context().Err() != nil:
			case errors.As(err, &ended):
				st.end(s, r, nil)
			case errors.Is(err, guestapi.ErrStreamCut) && sandboxGone(done):
				panic(http.ErrAbortHandler)
			default:
				st.end(s, r, err)
			}
			return nil
		}
		var out []filesystemEvent
		switch e.Type {
		case api.EventRename:
			if e.OldPath != "" {
				out = append(out, filesystemEvent{Name: rel(e.OldPath), Type: "EVENT_TYPE_RENAME"})
			}
			out = append(out, filesystemEvent{Name: rel(e.Path), Type: "EVENT_TYPE_CREATE", Entry: s.eventEntry(r.Context(), gc, req, e.Path)})
		default:
			t, ok := eventTypes[e.Type]
			if !ok {
				continue // overflow: envd has no event for it
			}
			var entry *entryInfo
			if e.Type != api.EventRemove {
				entry = s.eventEntry(r.Context(), gc, req, e.Path)
			}
			out = append(out, filesystemEvent{Name: rel(e.Path), Type: t, Entry: entry})
		}
		for i := range out {
			if st.send(watchEvent{Filesystem: &out[i]}) != nil {
				return nil
			}
		}
	}
}

// eventEntry is the entry info of a watch event's file when the watch
// asked for it, taken when the event is sent, as envd does: nil for a
// file that is gone by then.
func (s *Server) eventEntry(ctx context.Context, gc *guestapi.Client, req *watchRequest, p string) *entryInfo {
	if !req.IncludeEntry {
		return nil
	}
	fi, err := gc.Stat(ctx, guestapi.FileRequest{Path: p, XattrPrefix: metadataXattr})
	if err != nil {
		return nil
	}
	e := describe(ctx, gc, *fi)
	return &e
}
