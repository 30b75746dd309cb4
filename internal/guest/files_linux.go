package guest

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"runtime/debug"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/openat"
	"github.com/paddock-dev/paddock/internal/untar"
	"github.com/paddock-dev/paddock/wire"
)

func init() {
	for op, h := range map[string]opHandler{
		guestapi.OpFileRead:   (*server).opFileRead,
		guestapi.OpFileWrite:  (*server).opFileWrite,
		guestapi.OpFileStat:   (*server).opFileStat,
		guestapi.OpFileList:   (*server).opFileList,
		guestapi.OpFileMkdir:  (*server).opFileMkdir,
		guestapi.OpFileRemove: (*server).opFileRemove,
		guestapi.OpFileMove:   (*server).opFileMove,
		guestapi.OpFileTarGet: (*server).opFileTarGet,
		guestapi.OpFileTarPut: (*server).opFileTarPut,
		guestapi.OpFileWatch:  (*server).opFileWatch,
	} {
		extraOps[op] = contained(op, h)
		helperOps[op] = true
	}
}

// contained runs a file op so that a panic (a bug met by some hostile
// file tree) ends that connection, not the guest: the guest is PID 1, and
// its death ends the sandbox.
func contained(op string, h opHandler) opHandler {
	return func(s *server, c *opConn, req guestapi.Request) {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("file op panicked", "op", op, "panic", v, "stack", string(debug.Stack()))
				c.conn.Close()
			}
		}()
		h(s, c, req)
	}
}

// fileOp opens the root for a file request and cleans its path. On error
// it has answered the request.
func (s *server) fileOp(c *opConn, req guestapi.Request) (*fsRoot, *guestapi.FileRequest, string, bool) {
	if req.File == nil {
		c.respond(guestapi.Response{}, errdefs.Invalid("file", "missing file arguments"))
		return nil, nil, "", false
	}
	r, err := openFSRoot(fileRootDir, s.cfg.Workdir)
	if err != nil {
		c.respond(guestapi.Response{}, err)
		return nil, nil, "", false
	}
	p, err := r.clean("path", req.File.Path)
	if err == nil {
		err = checkXattrArgs(req.File)
	}
	if err != nil {
		r.Close()
		c.respond(guestapi.Response{}, err)
		return nil, nil, "", false
	}
	return r, req.File, p, true
}

// end writes the End frame that closes a stream.
func (c *opConn) end(e guestapi.FileEnd, err error) error {
	if err != nil {
		e.Error = apiError(err)
	}
	return c.fw.WriteJSON(wire.End, e)
}

func (s *server) opFileStat(c *opConn, req guestapi.Request) {
	r, _, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	fi, err := r.statXattrs(p, r.ids(), req.File.XattrPrefix)
	c.respond(guestapi.Response{File: &guestapi.FileResponse{Info: fi}}, err)
}

func (s *server) opFileRead(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	f, n, fi, err := r.openRead(p, fr.Offset, fr.Length)
	if c.respond(guestapi.Response{File: &guestapi.FileResponse{Info: fi, Length: n}}, err) != nil || err != nil {
		return
	}
	defer f.Close()
	limit := n
	if n < 0 && fr.Length != nil {
		limit = *fr.Length
	}
	sent, err := sendFile(c, f, fr.Offset, limit, n >= 0)
	c.end(guestapi.FileEnd{Bytes: sent}, err)
}

// openRead opens a regular file for a read of length bytes (nil: to the
// end) from off, and says how many bytes it will send (-1: unknown until
// the end, for files whose size the kernel makes up).
func (r *fsRoot) openRead(p string, off int64, length *int64) (*os.File, int64, *api.FileInfo, error) {
	if off < 0 {
		return nil, 0, nil, errdefs.Invalid("offset", "%d is negative", off)
	}
	if length != nil && *length < 0 {
		return nil, 0, nil, errdefs.Invalid("length", "%d is negative", *length)
	}
	f, st, err := r.openRegular(p)
	if err != nil {
		return nil, 0, nil, err
	}
	fi := fileInfo(p, st, "", nil)
	n := int64(-1)
	if !isPseudoFS(int(f.Fd())) {
		n = max(st.Size-off, 0)
		if length != nil {
			n = min(n, *length)
		}
	}
	return f, n, &fi, nil
}

// openRegular opens p for reading if it is a regular file. It looks at
// what p is through an O_PATH handle first, so that opening it has no
// side effect (a fifo, a device), then checks that it opened the same
// file.
func (r *fsRoot) openRegular(p string) (*os.File, *unix.Stat_t, error) {
	h, err := r.open(p, unix.O_PATH)
	if err != nil {
		return nil, nil, err
	}
	var hst unix.Stat_t
	err = unix.Fstat(int(h.Fd()), &hst)
	h.Close()
	if err != nil {
		return nil, nil, openat.Error(p, err)
	}
	if err := requireRegular(p, hst.Mode); err != nil {
		return nil, nil, err
	}
	f, err := r.open(p, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK)
	if err != nil {
		return nil, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, nil, openat.Error(p, err)
	}
	if st.Dev != hst.Dev || st.Ino != hst.Ino {
		f.Close()
		return nil, nil, errdefs.Conflict("%s: changed while it was being opened", p)
	}
	return f, &st, nil
}

func requireRegular(p string, mode uint32) error {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return errdefs.Conflict("%s: is a directory", p)
	}
	return errdefs.Invalid("path", "%s: not a regular file", p)
}

// sendFile sends up to limit bytes of f from off as data frames (all of
// the file from off when limit is negative). With exact set, the file
// ending before limit bytes is an error: the reader was promised them.
func sendFile(c *opConn, f *os.File, off, limit int64, exact bool) (int64, error) {
	bp := fileChunks.Get().(*[]byte)
	defer fileChunks.Put(bp)
	buf := *bp
	var hdr [wire.HeaderSize]byte
	var sent int64
	for limit < 0 || sent < limit {
		want := len(buf)
		if limit >= 0 {
			want = int(min(int64(want), limit-sent))
		}
		n, err := f.ReadAt(buf[:want], off+sent)
		if n > 0 {
			if err := writeFrame(c.conn, &hdr, wire.Data, buf[:n]); err != nil {
				return sent, err
			}
			sent += int64(n)
		}
		if err == io.EOF {
			if exact && sent < limit {
				return sent, errdefs.Conflict("%s: shrank while it was being read", f.Name())
			}
			return sent, nil
		}
		if err != nil {
			return sent, openat.Error(f.Name(), err)
		}
	}
	return sent, nil
}

// fileChunks recycles the data buffers of file streams.
var fileChunks = sync.Pool{New: func() any { b := make([]byte, guestapi.FileChunkSize); return &b }}

// dataReader reads the data frames a client sends up to its End frame.
type dataReader struct {
	guestapi.DataFrames
	fr  *wire.Reader
	end guestapi.FileEnd
	n   int64
}

func newDataReader(fr *wire.Reader) *dataReader {
	d := &dataReader{fr: fr}
	d.DataFrames = guestapi.NewDataFrames(d.nextData)
	return d
}

// errClientGone is the error of a data stream whose client went away
// before its End frame.
var errClientGone = errors.New("the client went away before the end of the data")

func (d *dataReader) nextData() ([]byte, error) {
	f, err := d.fr.Read()
	if err != nil {
		return nil, errClientGone
	}
	switch f.Type {
	case wire.Data:
		d.n += int64(len(f.Payload))
		return f.Payload, nil
	case wire.End:
		if err := json.Unmarshal(f.Payload, &d.end); err != nil {
			return nil, errdefs.Invalid("frame", "malformed end frame: %v", err)
		}
		if d.end.Bytes != 0 && d.end.Bytes != d.n {
			return nil, errdefs.Invalid("frame", "the client says it sent %d bytes, %d arrived", d.end.Bytes, d.n)
		}
		return nil, io.EOF
	}
	return nil, errdefs.Invalid("frame", "unexpected frame type %d in a data stream", f.Type)
}

// drain reads up to the End frame, discarding data.
func (d *dataReader) drain() error {
	_, err := d.WriteTo(io.Discard)
	return err
}

func (s *server) opFileWrite(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	w, err := r.createAtomic(p, fr.Mode, fr.Owner)
	if err == nil {
		if err = setXattrs(int(w.f.Fd()), p, fr.Xattrs); err != nil {
			w.abort()
			w = nil
		}
	}
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		if w != nil {
			w.abort()
		}
		return
	}
	src := newDataReader(c.fr)
	_, err = io.Copy(w, src)
	if err == errClientGone {
		w.abort()
		return
	}
	if err != nil {
		w.abort()
		c.end(guestapi.FileEnd{Bytes: w.n}, err)
		return
	}
	fi, err := w.commit()
	if err == nil && fr.XattrPrefix != "" {
		fi, err = r.statXattrs(p, r.ids(), fr.XattrPrefix)
	}
	c.end(guestapi.FileEnd{Bytes: w.n, Info: fi}, err)
}

// atomicFile is a write in progress: a temporary file beside the target
// that replaces it (by rename) only once it is complete and synced.
type atomicFile struct {
	r        *fsRoot
	p        string
	dir      *os.File // the target's directory
	name     string
	tmp      string
	f        *os.File
	mode     uint32
	uid, gid int
	n        int64
	flushed  int64 // bytes handed to writeback
}

// createAtomic starts a write of p. Missing parent directories are made
// (0755, owned like the file). Whatever p's last element is now (a file,
// a symbolic link, nothing) is replaced, never written through; a
// directory there is a conflict. With no mode or owner given, an existing
// regular file's are kept; new files are 0644 and root's.
func (r *fsRoot) createAtomic(p string, mode *api.FileMode, owner string) (*atomicFile, error) {
	if p == "/" {
		return nil, errdefs.Conflict("/: is a directory")
	}
	uid, gid, err := r.ids().owner(owner)
	if err != nil {
		return nil, err
	}
	dir, err := r.mkdirAll(path.Dir(p), 0o755, uid, gid)
	if err != nil {
		return nil, err
	}
	w := &atomicFile{r: r, p: p, dir: dir, name: path.Base(p), mode: 0o644, uid: uid, gid: gid}
	st, err := lstatAt(int(dir.Fd()), w.name)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		dir.Close()
		return nil, errdefs.Conflict("%s: is a directory", p)
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		w.mode = st.Mode & 0o7777
		if owner == "" {
			w.uid, w.gid = int(st.Uid), int(st.Gid)
		}
	case err != nil && !errors.Is(err, unix.ENOENT):
		dir.Close()
		return nil, openat.Error(p, err)
	}
	if mode != nil {
		w.mode = uint32(*mode)
	}
	for i := 0; ; i++ {
		w.tmp = openat.TempName()
		fd, err := unix.Openat(int(dir.Fd()), w.tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) && i < 8 {
			continue
		}
		if err != nil {
			dir.Close()
			return nil, openat.Error(p, err)
		}
		w.f = os.NewFile(uintptr(fd), p)
		return w, nil
	}
}

// writebackChunk is how much written data the kernel is asked to start
// writing back at a time: a big file is then mostly on disk by the time
// it is synced, instead of the whole sync waiting at the end.
const writebackChunk = 8 << 20

func (w *atomicFile) Write(b []byte) (int, error) {
	n, err := w.f.Write(b)
	w.n += int64(n)
	if err != nil {
		return n, openat.Error(w.p, err)
	}
	if w.n-w.flushed >= writebackChunk {
		unix.SyncFileRange(int(w.f.Fd()), w.flushed, w.n-w.flushed, unix.SYNC_FILE_RANGE_WRITE)
		w.flushed = w.n
	}
	return n, nil
}

// commit gives the file its owner and mode (in that order: chown clears
// setuid bits), syncs it, renames it over the target and syncs the
// directory.
func (w *atomicFile) commit() (*api.FileInfo, error) {
	defer w.dir.Close()
	err := openat.SetOwnerMode(int(w.f.Fd()), w.p, w.uid, w.gid, w.mode)
	if err == nil {
		if err = w.f.Sync(); err != nil {
			err = openat.Error(w.p, err)
		}
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = openat.Error(w.p, cerr)
	}
	if err == nil {
		if err = unix.Renameat(int(w.dir.Fd()), w.tmp, int(w.dir.Fd()), w.name); err != nil {
			err = openat.Error(w.p, err)
		}
	}
	if err != nil {
		unix.Unlinkat(int(w.dir.Fd()), w.tmp, 0)
		return nil, err
	}
	syncDirFD(int(w.dir.Fd()))
	return w.r.statPath(w.p, w.r.ids())
}

// abort drops the temporary file; the target is as it was.
func (w *atomicFile) abort() {
	w.f.Close()
	unix.Unlinkat(int(w.dir.Fd()), w.tmp, 0)
	w.dir.Close()
}

// syncDirFD makes a rename in dir durable.
func syncDirFD(dir int) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	unix.Fsync(fd)
	unix.Close(fd)
}

// mkdirAll returns a handle on directory p, creating it and its missing
// parents: the longest existing prefix is resolved inside the root, and
// each missing element is made under a handle on its parent and opened
// without following anything, so that nothing the sandbox does meanwhile
// can redirect it. Directories it makes get mode and owner (ids of -1
// are kept).
func (r *fsRoot) mkdirAll(p string, mode uint32, uid, gid int) (*os.File, error) {
	var parts []string
	if p != "/" {
		parts = strings.Split(strings.TrimPrefix(p, "/"), "/")
	}
	i := len(parts)
	var cur *os.File
	for ; i >= 0; i-- {
		prefix := "/" + strings.Join(parts[:i], "/")
		h, err := r.open(prefix, unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			cur = h
			break
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	if cur == nil {
		return nil, openat.Error("/", unix.ENOENT)
	}
	for j := i; j < len(parts); j++ {
		prefix := "/" + strings.Join(parts[:j+1], "/")
		next, err := openat.Mkdir(int(cur.Fd()), parts[j], prefix, mode, uid, gid, false)
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

func (s *server) opFileMkdir(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	fi, err := r.mkdir(p, fr.Parents, fr.Mode, fr.Owner)
	c.respond(guestapi.Response{File: &guestapi.FileResponse{Info: fi}}, err)
}

// mkdir makes directory p (mode default 0755). With parents, missing
// parents are made too and an existing directory is not an error.
func (r *fsRoot) mkdir(p string, parents bool, mode *api.FileMode, owner string) (*api.FileInfo, error) {
	ids := r.ids()
	uid, gid, err := ids.owner(owner)
	if err != nil {
		return nil, err
	}
	m := uint32(0o755)
	if mode != nil {
		m = uint32(*mode)
	}
	if parents {
		d, err := r.mkdirAll(p, m, uid, gid)
		if err != nil {
			return nil, err
		}
		d.Close()
		return r.statPath(p, ids)
	}
	if p == "/" {
		return nil, errdefs.Conflict("/: already exists")
	}
	dir, base, err := r.parent(p)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	d, err := openat.Mkdir(int(dir.Fd()), base, p, m, uid, gid, true)
	if err != nil {
		return nil, err
	}
	d.Close()
	return r.statPath(p, ids)
}

func (s *server) opFileRemove(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	c.respond(guestapi.Response{}, r.remove(p, fr.Recursive))
}

// remove removes p (a symbolic link itself, never what it points at); a
// directory only when empty, or with recursive.
func (r *fsRoot) remove(p string, recursive bool) error {
	if p == "/" {
		return errdefs.Invalid("path", "refusing to remove /")
	}
	dir, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer dir.Close()
	st, err := lstatAt(int(dir.Fd()), base)
	if err != nil {
		return openat.Error(p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(int(dir.Fd()), base, 0); err != nil {
			return openat.Error(p, err)
		}
		return nil
	}
	if !recursive {
		err := unix.Unlinkat(int(dir.Fd()), base, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return errdefs.Conflict("%s: directory not empty (remove it recursively)", p)
		}
		if err != nil {
			return openat.Error(p, err)
		}
		return nil
	}
	return removeAllAt(int(dir.Fd()), base, p)
}

// removeAllAt removes name in dir and everything under it, opening each
// directory under a handle on its parent without following symbolic
// links, so that a sandbox swapping a directory for a link meanwhile only
// gets the link removed.
func removeAllAt(dir int, name, p string) error {
	for attempt := 0; ; attempt++ {
		err := unix.Unlinkat(dir, name, 0)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
			return openat.Error(p, err)
		}
		sub, err := openChildDir(dir, name)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // swapped for a file or link: unlink that
		}
		if err != nil {
			return openat.Error(p, err)
		}
		if openat.NoDescend(int(sub.Fd())) {
			sub.Close()
			return errdefs.Conflict("%s: is a kernel file system mount", p)
		}
		for {
			names, rerr := sub.Readdirnames(1024)
			for _, n := range names {
				if err := removeAllAt(int(sub.Fd()), n, p+"/"+n); err != nil {
					sub.Close()
					return err
				}
			}
			if rerr != nil || len(names) == 0 {
				break
			}
		}
		sub.Close()
		err = unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if (errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST)) && attempt < 16 {
			continue // something was added meanwhile
		}
		return openat.Error(p, err)
	}
}

func (s *server) opFileMove(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	to, err := r.clean("to", fr.To)
	var fi *api.FileInfo
	if err == nil {
		fi, err = r.move(p, to, fr.Overwrite)
	}
	if err == nil && fi != nil && fr.XattrPrefix != "" {
		fi, err = r.statXattrs(to, r.ids(), fr.XattrPrefix)
	}
	c.respond(guestapi.Response{File: &guestapi.FileResponse{Info: fi}}, err)
}

// move renames from to to, both names acted on as they are (a symbolic
// link is moved, not its target). Without overwrite an existing to is a
// conflict.
func (r *fsRoot) move(from, to string, overwrite bool) (*api.FileInfo, error) {
	if from == "/" || to == "/" {
		return nil, errdefs.Invalid("path", "cannot move /")
	}
	fdir, fbase, err := r.parent(from)
	if err != nil {
		return nil, err
	}
	defer fdir.Close()
	if _, err := lstatAt(int(fdir.Fd()), fbase); err != nil {
		return nil, openat.Error(from, err)
	}
	tdir, tbase, err := r.parent(to)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	flags := uint(0)
	if !overwrite {
		flags = unix.RENAME_NOREPLACE
	}
	err = unix.Renameat2(int(fdir.Fd()), fbase, int(tdir.Fd()), tbase, flags)
	if errors.Is(err, unix.EINVAL) && flags != 0 {
		// A file system without RENAME_NOREPLACE: check, then rename.
		if _, serr := lstatAt(int(tdir.Fd()), tbase); serr == nil {
			err = unix.EEXIST
		} else {
			err = unix.Renameat(int(fdir.Fd()), fbase, int(tdir.Fd()), tbase)
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, unix.EEXIST) && !overwrite:
		return nil, errdefs.Conflict("%s: already exists (overwrite it with overwrite)", to)
	case errors.Is(err, unix.EINVAL):
		return nil, errdefs.Invalid("to", "cannot move %s into itself (%s)", from, to)
	case errors.Is(err, unix.EXDEV):
		return nil, errdefs.Invalid("to", "%s and %s are on different file systems", from, to)
	case errors.Is(err, unix.ENOENT):
		return nil, openat.Error(from, err)
	default:
		return nil, openat.Error(to, err)
	}
	return r.statPath(to, r.ids())
}

func (s *server) opFileList(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	depth := fr.Depth
	if depth == 0 {
		depth = 1
	}
	if depth < 0 {
		c.respond(guestapi.Response{}, errdefs.Invalid("depth", "%d is below 1", depth))
		return
	}
	d, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		return
	}
	defer d.Close()
	l := &lister{ids: r.ids(), depth: depth, xattrs: fr.XattrPrefix, emit: func(batch []api.FileInfo) error { return c.fw.WriteJSON(wire.Event, batch) }}
	err = l.walk(d, p, 1)
	if err == nil {
		err = l.flush()
	}
	c.end(guestapi.FileEnd{Entries: l.n}, err)
}

// listBatch is how many entries go in one frame.
const listBatch = 256

// lister walks a directory tree depth first, entries sorted by name, each
// directory's entry before its contents. It does not follow symbolic
// links nor enter /proc or /sys.
type lister struct {
	ids    *idNames
	depth  int
	xattrs string // the prefix of the attributes to add; "" for none
	emit   func([]api.FileInfo) error
	batch  []api.FileInfo
	n      int64
}

func (l *lister) flush() error {
	if len(l.batch) == 0 {
		return nil
	}
	err := l.emit(l.batch)
	l.batch = l.batch[:0]
	return err
}

func (l *lister) walk(d *os.File, p string, level int) error {
	names, err := d.Readdirnames(-1)
	if err != nil {
		return openat.Error(p, err)
	}
	sort.Strings(names)
	for _, name := range names {
		cp := path.Join(p, name)
		st, err := lstatAt(int(d.Fd()), name)
		if err != nil {
			continue // removed meanwhile
		}
		target := ""
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ = readlinkAt(int(d.Fd()), name)
		}
		fi := fileInfo(cp, &st, target, l.ids)
		addXattrs(&fi, int(d.Fd()), name, l.xattrs)
		l.batch = append(l.batch, fi)
		l.n++
		if len(l.batch) >= listBatch {
			if err := l.flush(); err != nil {
				return err
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || level >= l.depth {
			continue
		}
		sub, err := openChildDir(int(d.Fd()), name)
		if err != nil {
			continue // removed or swapped meanwhile
		}
		if openat.NoDescend(int(sub.Fd())) {
			sub.Close()
			continue
		}
		err = l.walk(sub, cp, level+1)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// frameWriter collects bytes into data frames of guestapi.FileChunkSize.
type frameWriter struct {
	c   *opConn
	buf []byte
	hdr [wire.HeaderSize]byte
	n   int64
}

func (w *frameWriter) Write(b []byte) (int, error) {
	total := len(b)
	for len(b) > 0 {
		k := copy(w.buf[len(w.buf):cap(w.buf)], b)
		w.buf = w.buf[:len(w.buf)+k]
		b = b[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.Flush(); err != nil {
				return total - len(b), err
			}
		}
	}
	return total, nil
}

func (w *frameWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := writeFrame(w.c.conn, &w.hdr, wire.Data, w.buf)
	w.n += int64(len(w.buf))
	w.buf = w.buf[:0]
	return err
}

func (s *server) opFileTarGet(c *opConn, req guestapi.Request) {
	r, _, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	t, err := r.newTarSource(p)
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		return
	}
	defer t.Close()
	bp := fileChunks.Get().(*[]byte)
	defer fileChunks.Put(bp)
	fw := &frameWriter{c: c, buf: (*bp)[:0]}
	err = t.write(fw)
	if err == nil {
		err = fw.Flush()
	}
	c.end(guestapi.FileEnd{Bytes: fw.n, Entries: t.entries}, err)
}

func (s *server) opFileTarPut(c *opConn, req guestapi.Request) {
	r, fr, p, ok := s.fileOp(c, req)
	if !ok {
		return
	}
	defer r.Close()
	opts := untar.ExtractOptions{Chown: true, UID: -1, GID: -1, KeepSetID: true, Cut: errClientGone}
	ids := r.ids()
	uid, gid, err := ids.owner(fr.Owner)
	var dir *os.File
	if err == nil {
		opts.UID, opts.GID = uid, gid
		dir, err = r.mkdirAll(p, 0o755, uid, gid)
	}
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		return
	}
	defer dir.Close()
	src := newDataReader(c.fr)
	stats, err := untar.ExtractTar(dir, src, opts)
	if err == nil {
		err = src.drain()
	}
	if err == errClientGone {
		return
	}
	c.end(guestapi.FileEnd{Bytes: src.n, Entries: stats.Entries}, err)
}
