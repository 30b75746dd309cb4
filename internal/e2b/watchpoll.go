package e2b

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/mountinfo"
)

// Watching network mounts (envd 0.6.4): inotify sees only the changes made
// through this kernel, not those another client of an NFS, SMB or FUSE
// file system makes, so envd refuses to watch a directory on one unless
// the call says allowNetworkMounts. With it, paddock polls the directory:
// a listing every pollEvery, compared with the one before.
const (
	pollEvery = 500 * time.Millisecond
	// pollDepth and pollEntries bound a recursive poll's listing.
	pollDepth   = 16
	pollEntries = 20000
)

// fileEvents is a watch's source of events: the guest's inotify watch
// (guestapi.EventStream) or a poller.
type fileEvents interface {
	Next() (api.FileEvent, error)
	Close() error
	Abort()
}

// isNetworkFS reports whether fstype, as /proc/self/mountinfo names it,
// is a network file system in envd's sense (NFS, CIFS, SMB, FUSE).
func isNetworkFS(fstype string) bool {
	switch fstype {
	case "nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse", "fuseblk":
		return true
	}
	return strings.HasPrefix(fstype, "fuse.")
}

// mountFSType is the file system type of the mount that holds dir (an
// absolute, clean path), from a mountinfo's text: the one with the
// longest mount point that contains dir, the last mounted on ties.
func mountFSType(text []byte, dir string) string {
	best, bestLen := "", -1
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			continue
		}
		mp := mountinfo.Unescape(f[4])
		if mp != "/" && dir != mp && !strings.HasPrefix(dir, mp+"/") {
			continue
		}
		if len(mp) >= bestLen {
			best, bestLen = g[0], len(mp)
		}
	}
	return best
}

// networkMount is the type of the network file system dir is on in the
// sandbox, or "" (a local one, or not known).
func networkMount(ctx context.Context, gc *guestapi.Client, dir string) string {
	limit := int64(4 << 20)
	_, data, err := gc.ReadFile(ctx, guestapi.FileRequest{Path: "/proc/self/mountinfo", Length: &limit})
	if err != nil {
		return ""
	}
	defer data.Close()
	b, err := io.ReadAll(io.LimitReader(data, limit))
	if err != nil {
		return ""
	}
	if t := mountFSType(b, dir); isNetworkFS(t) {
		return t
	}
	return ""
}

// errNetworkMount refuses a watch of a network mount the call did not
// allow.
func errNetworkMount(dir, fstype string) error {
	return errdefs.Invalid("path", "%s is on a network mount (%s), where events may be missed; watch it with allowNetworkMounts", dir, fstype)
}

// poller watches a directory by listing it every pollEvery.
type poller struct {
	ctx    context.Context
	cancel context.CancelFunc
	gc     *guestapi.Client
	req    guestapi.FileRequest
	seen   map[string]api.FileInfo
	queue  []api.FileEvent
}

var _ fileEvents = (*poller)(nil)

func newPoller(ctx context.Context, gc *guestapi.Client, dir string, recursive bool) (*poller, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &poller{ctx: ctx, cancel: cancel, gc: gc, req: guestapi.FileRequest{Path: dir, Depth: 1}}
	if recursive {
		p.req.Depth = pollDepth
	}
	var err error
	if p.seen, err = p.scan(); err != nil {
		cancel()
		return nil, err
	}
	return p, nil
}

func (p *poller) scan() (map[string]api.FileInfo, error) {
	ls, err := p.gc.ListDir(p.ctx, p.req)
	if err != nil {
		return nil, err
	}
	defer ls.Close()
	out := map[string]api.FileInfo{}
	for {
		batch, err := ls.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		for _, fi := range batch {
			if fi.Path == p.req.Path {
				continue
			}
			if len(out) == pollEntries {
				return nil, errdefs.New(errdefs.ErrTooLarge, "%s holds more than %d entries to poll; watch a smaller directory", p.req.Path, pollEntries)
			}
			out[fi.Path] = fi
		}
	}
}

func (p *poller) Next() (api.FileEvent, error) {
	for len(p.queue) == 0 {
		select {
		case <-p.ctx.Done():
			return api.FileEvent{}, guestapi.ErrStreamCut
		case <-time.After(pollEvery):
		}
		now, err := p.scan()
		switch {
		case p.ctx.Err() != nil:
			return api.FileEvent{}, guestapi.ErrStreamCut
		case errdefs.Code(err) == errdefs.Code(errdefs.ErrNotFound):
			return api.FileEvent{}, &guestapi.WatchEnded{Reason: "the directory is gone"}
		case err != nil:
			return api.FileEvent{}, err
		}
		p.queue, p.seen = diffListings(p.seen, now, time.Now()), now
	}
	e := p.queue[0]
	p.queue = p.queue[1:]
	return e, nil
}

func (p *poller) Close() error { p.cancel(); return nil }
func (p *poller) Abort()       { p.cancel() }

// diffListings is what changed from listing old to listing now, as
// inotify would say it: removals, then creations, writes (size or mtime)
// and mode changes, each in path order.
func diffListings(old, now map[string]api.FileInfo, at time.Time) []api.FileEvent {
	var out []api.FileEvent
	for _, p := range slices.Sorted(maps.Keys(old)) {
		if _, ok := now[p]; !ok {
			out = append(out, api.FileEvent{Type: api.EventRemove, Path: p, IsDir: old[p].Type == api.TypeDir, Time: at})
		}
	}
	for _, p := range slices.Sorted(maps.Keys(now)) {
		fi, was := now[p], old[p]
		switch _, ok := old[p]; {
		case !ok || was.Type != fi.Type:
			out = append(out, api.FileEvent{Type: api.EventCreate, Path: p, IsDir: fi.IsDir(), Time: at})
		case !fi.IsDir() && (was.Size != fi.Size || !was.ModTime.Equal(fi.ModTime)):
			out = append(out, api.FileEvent{Type: api.EventWrite, Path: p, Time: at})
		case was.Mode != fi.Mode:
			out = append(out, api.FileEvent{Type: api.EventChmod, Path: p, IsDir: fi.IsDir(), Time: at})
		}
	}
	return out
}
