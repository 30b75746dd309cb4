package guest

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/openat"
	"github.com/paddock-dev/paddock/wire"
)

// maxWatches bounds the directories one watch covers.
const maxWatches = 8192

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_EXCL_UNLINK | unix.IN_ONLYDIR

// movePairWait is how long an unmatched "moved from" waits for its "moved
// to" before it is reported as a removal (the file left the watched tree).
const movePairWait = 10 * time.Millisecond

func (s *server) opFileWatch(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	w, err := r.newWatcher(p, fr.Recursive)
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		if w != nil {
			w.Close()
		}
		return
	}
	defer w.Close()
	// The client ends the watch by closing the connection.
	go func() {
		for {
			if _, err := c.fr.Read(); err != nil {
				w.Close()
				return
			}
		}
	}()
	reason, err := w.run(func(ev api.FileEvent) error { return c.fw.WriteJSON(wire.Event, ev) })
	if reason != "" {
		c.end(guestapi.FileEnd{Reason: reason}, nil)
	}
	if err != nil && !errors.Is(err, os.ErrClosed) {
		s.log.Debug("file watch ended", "path", p, "err", err)
	}
}

// watcher reports the changes under a directory of the sandbox with
// inotify, adding watches for new subdirectories when recursive.
type watcher struct {
	p         string
	recursive bool
	// r and the watched directory's identity: the directory is resolved
	// again for each watch added, since holding it open would keep the
	// kernel from reporting its removal.
	r         *fsRoot
	dev, ino  uint64
	fd        *os.File // the inotify descriptor, in the netpoller
	closeOnce sync.Once

	rootWD int32
	wds    map[int32]string // watch → directory relative to p ("" for p)
	dirs   map[string]int32
	full   bool // maxWatches reached; reported once

	// pending is a "moved from" waiting for its "moved to".
	pending *rawEvent
	last    api.FileEvent // the last event sent, to fold repeated writes
}

type rawEvent struct {
	wd     int32
	mask   uint32
	cookie uint32
	name   string
}

func (r *fsRoot) newWatcher(p string, recursive bool) (*watcher, error) {
	dir, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	err = unix.Fstat(int(dir.Fd()), &st)
	dir.Close()
	if err != nil {
		return nil, openat.Error(p, err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("%w: starting a watch: %v", errdefs.ErrUnavailable, err)
	}
	w := &watcher{
		p: p, recursive: recursive, r: r, dev: st.Dev, ino: st.Ino, fd: os.NewFile(uintptr(fd), "inotify"),
		wds: map[int32]string{}, dirs: map[string]int32{},
	}
	if err := w.addTree("", nil); err != nil {
		w.Close()
		return nil, err
	}
	w.rootWD = w.dirs[""]
	return w, nil
}

// Close ends the watch; run returns.
func (w *watcher) Close() {
	w.closeOnce.Do(func() { w.fd.Close() })
}

// control runs fn on the inotify descriptor. It goes through the
// descriptor's RawConn: os.File.Fd would put it in blocking mode (run's
// Read could then no longer be interrupted by Close), and a descriptor
// closed meanwhile could have been reused by another open.
func (w *watcher) control(fn func(fd int) error) error {
	rc, err := w.fd.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// openBeneath opens directory rel under the watched one (resolved again
// inside the root and checked to be the same directory) without following
// any link.
func (w *watcher) openBeneath(rel string, flags int) (int, error) {
	dir, err := w.r.open(w.p, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	defer dir.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		return -1, openat.Error(w.p, err)
	}
	if st.Dev != w.dev || st.Ino != w.ino {
		return -1, fmt.Errorf("%w: %s: the watched directory was moved or replaced", errdefs.ErrNotFound, w.p)
	}
	name := rel
	if name == "" {
		name = "."
	}
	fd, err := openat.Openat2(int(dir.Fd()), name, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: openat.ResolveBeneath | unix.RESOLVE_NO_SYMLINKS,
	})
	if err != nil {
		return -1, openat.Error(path.Join(w.p, rel), err)
	}
	return fd, nil
}

// addWatch watches directory rel. inotify_add_watch has no *at form, so
// the directory is opened beneath the watched one without following any
// link, and watched through this process's own descriptor for it
// (/proc/self/fd/N: the guest's procfs, which the sandbox cannot replace),
// after checking that this names the very directory opened.
func (w *watcher) addWatch(rel string) (bool, error) {
	fd, err := w.openBeneath(rel, unix.O_PATH)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if openat.NoDescend(fd) {
		if rel == "" {
			return false, fmt.Errorf("%w: %s: is on /proc or /sys, which cannot be watched", errdefs.ErrDenied, w.p)
		}
		return false, nil
	}
	if len(w.wds) >= maxWatches {
		return false, fmt.Errorf("%w: %s: more than %d directories to watch", errdefs.ErrTooLarge, w.p, maxWatches)
	}
	var st, pst unix.Stat_t
	proc := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return false, openat.Error(path.Join(w.p, rel), err)
	}
	if err := unix.Stat(proc, &pst); err != nil || pst.Dev != st.Dev || pst.Ino != st.Ino {
		return false, fmt.Errorf("watching %s: /proc/self/fd does not name the directory opened", path.Join(w.p, rel))
	}
	var wd int
	err = w.control(func(ifd int) error {
		var err error
		wd, err = unix.InotifyAddWatch(ifd, proc, watchMask)
		return err
	})
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return false, fmt.Errorf("%w: %s: the sandbox's inotify watch limit is reached", errdefs.ErrTooLarge, w.p)
		}
		return false, openat.Error(path.Join(w.p, rel), err)
	}
	if old, ok := w.wds[int32(wd)]; ok && old != rel {
		delete(w.dirs, old)
	}
	w.wds[int32(wd)] = rel
	w.dirs[rel] = int32(wd)
	return true, nil
}

// addTree watches rel and, when recursive, the directories under it. With
// emit set it reports what it finds under rel as created: a directory
// made and filled before its watch was added would otherwise be silent.
func (w *watcher) addTree(rel string, emit func(api.FileEvent) error) error {
	ok, err := w.addWatch(rel)
	if err != nil || !ok || !w.recursive {
		return err
	}
	fd, err := w.openBeneath(rel, unix.O_RDONLY)
	if err != nil {
		return nil // gone meanwhile
	}
	d := os.NewFile(uintptr(fd), rel)
	names, _ := d.Readdirnames(-1)
	sort.Strings(names)
	type child struct {
		rel   string
		isDir bool
	}
	var kids []child
	for _, n := range names {
		st, err := lstatAt(fd, n)
		if err != nil {
			continue
		}
		kids = append(kids, child{path.Join(rel, n), st.Mode&unix.S_IFMT == unix.S_IFDIR})
	}
	d.Close()
	for _, k := range kids {
		if emit != nil {
			if err := emit(w.event(api.EventCreate, k.rel, k.isDir)); err != nil {
				return err
			}
		}
		if k.isDir {
			if err := w.addTree(k.rel, emit); err != nil {
				if errors.Is(err, errdefs.ErrTooLarge) && emit != nil {
					return w.overflow(emit)
				}
				return err
			}
		}
	}
	return nil
}

// overflow reports, once, that part of the tree is not watched.
func (w *watcher) overflow(emit func(api.FileEvent) error) error {
	if w.full {
		return nil
	}
	w.full = true
	return emit(api.FileEvent{Type: api.EventOverflow, Path: w.p, Time: time.Now().UTC()})
}

func (w *watcher) event(typ, rel string, isDir bool) api.FileEvent {
	return api.FileEvent{Type: typ, Path: path.Join(w.p, rel), IsDir: isDir, Time: time.Now().UTC()}
}

// renameTree updates the watched directories under old to be under new.
func (w *watcher) renameTree(old, new string) {
	for rel, wd := range w.dirs {
		if rel == old || strings.HasPrefix(rel, old+"/") {
			n := new + strings.TrimPrefix(rel, old)
			delete(w.dirs, rel)
			w.dirs[n] = wd
			w.wds[wd] = n
		}
	}
}

// dropTree stops watching rel and what is under it (it left the tree).
func (w *watcher) dropTree(rel string) {
	for r, wd := range w.dirs {
		if r == rel || strings.HasPrefix(r, rel+"/") {
			w.control(func(ifd int) error {
				_, err := unix.InotifyRmWatch(ifd, uint32(wd))
				return err
			})
			delete(w.dirs, r)
			delete(w.wds, wd)
		}
	}
}

// run reads events and hands them to emit until the watch is closed (an
// error wrapping os.ErrClosed), emit fails, or the watched directory goes
// away (a reason).
func (w *watcher) run(emit func(api.FileEvent) error) (string, error) {
	buf := make([]byte, 64<<10)
	for {
		if w.pending != nil {
			w.fd.SetReadDeadline(time.Now().Add(movePairWait))
		}
		n, err := w.fd.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.fd.SetReadDeadline(time.Time{})
			if err := w.flushPending(emit); err != nil {
				return "", err
			}
			continue
		}
		if err != nil {
			return "", err
		}
		w.last = api.FileEvent{}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(raw.Len)
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			off = end
			ev := rawEvent{wd: raw.Wd, mask: raw.Mask, cookie: raw.Cookie, name: name}
			reason, err := w.handle(ev, emit)
			if err != nil || reason != "" {
				return reason, err
			}
		}
	}
}

func (w *watcher) send(emit func(api.FileEvent) error, ev api.FileEvent) error {
	if ev.Type == api.EventWrite && w.last.Type == api.EventWrite && w.last.Path == ev.Path {
		return nil
	}
	w.last = ev
	return emit(ev)
}

// flushPending reports a "moved from" whose pair never came: the file
// left the watched tree.
func (w *watcher) flushPending(emit func(api.FileEvent) error) error {
	ev := w.pending
	if ev == nil {
		return nil
	}
	w.pending = nil
	dir, ok := w.wds[ev.wd]
	if !ok || isFileTemp(ev.name) {
		return nil
	}
	rel := path.Join(dir, ev.name)
	isDir := ev.mask&unix.IN_ISDIR != 0
	if isDir {
		w.dropTree(rel)
	}
	return w.send(emit, w.event(api.EventRemove, rel, isDir))
}

func (w *watcher) handle(ev rawEvent, emit func(api.FileEvent) error) (string, error) {
	if ev.mask&unix.IN_Q_OVERFLOW != 0 {
		return "", emit(api.FileEvent{Type: api.EventOverflow, Path: w.p, Time: time.Now().UTC()})
	}
	if w.pending != nil && !(ev.mask&unix.IN_MOVED_TO != 0 && ev.cookie == w.pending.cookie) {
		if err := w.flushPending(emit); err != nil {
			return "", err
		}
	}
	dir, ok := w.wds[ev.wd]
	if !ok {
		return "", nil // a watch already dropped
	}
	isDir := ev.mask&unix.IN_ISDIR != 0
	rel := path.Join(dir, ev.name)
	if isFileTemp(ev.name) && ev.mask&(unix.IN_CREATE|unix.IN_MODIFY|unix.IN_ATTRIB|unix.IN_DELETE) != 0 {
		return "", nil // a write of the file API in progress
	}
	switch {
	case ev.mask&unix.IN_IGNORED != 0:
		delete(w.wds, ev.wd)
		if w.dirs[dir] == ev.wd {
			delete(w.dirs, dir)
		}
		if ev.wd == w.rootWD {
			return "the watched directory was removed", nil
		}
	case ev.mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
		// Reported by the parent's watch (or, for the watched directory
		// itself, by IN_IGNORED).
	case ev.mask&unix.IN_CREATE != 0:
		if err := w.send(emit, w.event(api.EventCreate, rel, isDir)); err != nil {
			return "", err
		}
		if isDir && w.recursive {
			if err := w.addTree(rel, emit); err != nil {
				return "", w.treeError(err, emit)
			}
		}
	case ev.mask&unix.IN_MODIFY != 0:
		return "", w.send(emit, w.event(api.EventWrite, rel, isDir))
	case ev.mask&unix.IN_ATTRIB != 0:
		return "", w.send(emit, w.event(api.EventChmod, rel, isDir))
	case ev.mask&unix.IN_DELETE != 0:
		return "", w.send(emit, w.event(api.EventRemove, rel, isDir))
	case ev.mask&unix.IN_MOVED_FROM != 0:
		e := ev
		w.pending = &e
	case ev.mask&unix.IN_MOVED_TO != 0:
		if p := w.pending; p != nil && p.cookie == ev.cookie {
			w.pending = nil
			if isFileTemp(p.name) {
				// The file API's atomic write landing: one write.
				return "", w.send(emit, w.event(api.EventWrite, rel, isDir))
			}
			old := path.Join(w.wds[p.wd], p.name)
			if isDir && w.recursive {
				w.renameTree(old, rel)
			}
			e := w.event(api.EventRename, rel, isDir)
			e.OldPath = path.Join(w.p, old)
			return "", w.send(emit, e)
		}
		// Moved in: watched before it is reported, so that a client
		// acting on the report misses nothing under it.
		if isDir && w.recursive {
			if err := w.addTree(rel, nil); err != nil {
				if err := w.treeError(err, emit); err != nil {
					return "", err
				}
			}
		}
		return "", w.send(emit, w.event(api.EventCreate, rel, isDir))
	}
	return "", nil
}

// isFileTemp reports a name of the file API's temporary files
// (openat.TempName). Their events are not reported: a write through the file
// API shows as one write event when it lands. (Sandbox code can use such
// names to go unseen; a watch is a convenience, not an audit.)
func isFileTemp(name string) bool {
	return len(name) == len(".paddock-")+16+len(".tmp") && strings.HasPrefix(name, ".paddock-") && strings.HasSuffix(name, ".tmp")
}

// treeError turns a failure to watch a new directory into an overflow
// event: the watch goes on without it.
func (w *watcher) treeError(err error, emit func(api.FileEvent) error) error {
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrDenied):
		return nil // gone, or swapped for a file or link, meanwhile
	case errors.Is(err, errdefs.ErrTooLarge):
		return w.overflow(emit)
	}
	return err
}
