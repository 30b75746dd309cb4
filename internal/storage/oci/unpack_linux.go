package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// OCI whiteout names (image-spec, layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Overlayfs's opaque-directory xattrs. Sandboxes mount overlayfs inside a
// user namespace with userxattr, which reads user.overlay.*; a privileged
// overlay on the host reads trusted.overlay.*. Both are set so that a layer
// means the same under either.
var opaqueXattrs = []string{"user.overlay.opaque", "trusted.overlay.opaque"}

const (
	maxOwnerID    = 1<<32 - 2 // (uid_t)-1 means "unchanged" to chown
	maxCachedDirs = 256
	maxLinkTarget = 4095
)

// layerStats describes an unpacked layer.
type layerStats struct {
	Size    int64 `json:"size"`    // bytes of regular-file content written
	Entries int   `json:"entries"` // tar entries read
	// SkippedXattrs counts extended attributes not applied: outside the
	// allowed namespaces, on an entry type that cannot carry them, or not
	// supported by the store's filesystem.
	SkippedXattrs int `json:"skipped_xattrs,omitempty"`
	// OpaqueRoot is set when the layer hides everything below it.
	OpaqueRoot bool `json:"opaque_root,omitempty"`
}

// applier unpacks one layer's tar stream into a directory, converting OCI
// whiteouts to overlayfs's on-disk format. The directory is private to the
// applier (a fresh temporary directory in a 0700 tree) while it runs, so
// the only adversary is the stream itself: every parent is resolved with
// openat2 beneath the layer's root without following symlinks, and each
// final component is created or changed through its parent's handle with
// no-follow calls.
type applier struct {
	ctx       context.Context
	root      int // O_RDONLY|O_DIRECTORY handle on the layer's root
	lim       Limits
	imageLeft *atomic.Int64 // bytes the image may still unpack, shared by its layers
	// room, if set, refuses n more bytes of content when the host
	// cannot spare them.
	room func(n int64) error
	log  *slog.Logger

	dirs   map[string]int  // O_PATH handles on directories, by layer-relative path
	hidden map[string]bool // names a whiteout in this layer hid from lower layers
	times  []dirTime       // directory times, set last (adding entries changes them)
	stats  layerStats
	buf    []byte
}

type dirTime struct {
	rel string
	ts  []unix.Timespec
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func newApplier(root int, lim Limits, imageLeft *atomic.Int64, log *slog.Logger) *applier {
	return &applier{
		root:      root,
		lim:       lim,
		imageLeft: imageLeft,
		log:       log,
		dirs:      map[string]int{},
		hidden:    map[string]bool{},
	}
}

// close releases the applier's directory handles (not root).
func (a *applier) close() {
	for k, fd := range a.dirs {
		unix.Close(fd)
		delete(a.dirs, k)
	}
}

// apply reads the tar stream to its end-of-archive marker and unpacks
// every entry. An error names the entry it happened on.
func (a *applier) apply(ctx context.Context, r io.Reader) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	a.buf = *bp
	a.ctx = ctx
	defer a.close()

	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: reading layer tar: %w", errdefs.ErrInvalid, err)
		}
		a.stats.Entries++
		if a.stats.Entries > a.lim.MaxEntries {
			return fmt.Errorf("%w: layer has more than %d entries", errdefs.ErrTooLarge, a.lim.MaxEntries)
		}
		if len(a.dirs) > maxCachedDirs {
			a.close()
		}
		if err := a.entry(tr, hdr); err != nil {
			return fmt.Errorf("entry %q: %w", clip(hdr.Name), err)
		}
	}
	return a.setDirTimes()
}

// cleanName turns a tar entry name into a path relative to the layer's
// root ("" is the root itself). Leading slashes are dropped (an absolute
// name means the same path in the image's root; some builders write them);
// any ".." component is refused, whatever it would resolve to.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.Invalid("name", "contains a NUL byte")
	}
	n := strings.TrimLeft(name, "/")
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", errdefs.Invalid("name", "has a \"..\" component")
		}
	}
	n = path.Clean(n)
	if n == "." {
		return "", nil
	}
	return n, nil
}

// splitRel splits a layer-relative path into its parent and final
// component.
func splitRel(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

func joinRel(dir, base string) string {
	if dir == "" {
		return base
	}
	return dir + "/" + base
}

func (a *applier) entry(tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := splitRel(rel)
	switch {
	case base == whiteoutOpaque:
		return a.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta) || strings.HasPrefix(dir, whiteoutMeta) || strings.Contains(dir, "/"+whiteoutMeta):
		// Other .wh..wh. names are aufs bookkeeping (.wh..wh.plnk holds
		// hard-link targets), not content; Docker skips them too.
		return nil
	case strings.HasPrefix(base, whiteoutPrefix):
		return a.whiteout(dir, strings.TrimPrefix(base, whiteoutPrefix))
	}
	if hdr.Uid < 0 || hdr.Uid > maxOwnerID || hdr.Gid < 0 || hdr.Gid > maxOwnerID {
		return errdefs.Invalid("owner", "%d:%d is out of range", hdr.Uid, hdr.Gid)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.Invalid("type", "the layer's root must be a directory")
		}
		return a.dirMeta(a.root, rel, hdr, false)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		return a.file(tr, hdr, dir, base)
	case tar.TypeDir:
		return a.dir(hdr, dir, base)
	case tar.TypeSymlink:
		return a.symlink(hdr, dir, base)
	case tar.TypeLink:
		return a.hardlink(hdr, dir, base)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return a.node(hdr, dir, base)
	}
	return errdefs.Invalid("type", "unsupported tar entry type %q", hdr.Typeflag)
}

// openBeneath opens p relative to dirfd with openat2, refusing to follow
// any symlink (or magic link) or to leave dirfd's tree.
func openBeneath(dirfd int, p string, flags uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for range 16 {
		fd, err := unix.Openat2(dirfd, p, &how)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// describe turns a path-resolution errno into an explanation.
func describe(p string, err error) error {
	switch err {
	case unix.ELOOP:
		return fmt.Errorf("%w: %q has a symlink component (never followed while unpacking)", errdefs.ErrInvalid, clip(p))
	case unix.ENOTDIR:
		return fmt.Errorf("%w: %q has a component that is not a directory", errdefs.ErrInvalid, clip(p))
	case unix.EXDEV:
		return fmt.Errorf("%w: %q leaves the layer", errdefs.ErrInvalid, clip(p))
	}
	return fmt.Errorf("opening %q: %w", clip(p), err)
}

// parent returns an O_PATH handle on the layer directory dir, creating it
// and its missing parents when create is set. Created parents are owned by
// root with mode 0755, as containerd makes them. A component that is this
// layer's own whiteout is replaced by an opaque directory: the whiteout hid
// the lower layers' entry and the new directory must go on hiding it.
func (a *applier) parent(dir string, create bool) (int, error) {
	if dir == "" {
		return a.root, nil
	}
	if fd, ok := a.dirs[dir]; ok {
		return fd, nil
	}
	fd, err := openBeneath(a.root, dir, unix.O_PATH)
	if err != nil && create && (err == unix.ENOENT || err == unix.ENOTDIR) {
		// Walk down one level at a time: which component is missing (or
		// is a whiteout) matters.
		pdir, base := splitRel(dir)
		pfd, perr := a.parent(pdir, true)
		if perr != nil {
			return -1, perr
		}
		if err := a.implicitDir(pfd, dir, base); err != nil {
			return -1, err
		}
		fd, err = openBeneath(pfd, base, unix.O_PATH)
	}
	if err != nil {
		if err == unix.ENOENT {
			return -1, fmt.Errorf("%w: directory %q is not in this layer", errdefs.ErrInvalid, clip(dir))
		}
		return -1, describe(dir, err)
	}
	a.dirs[dir] = fd
	return fd, nil
}

// implicitDir makes a directory that the stream implies but has not (yet)
// described.
func (a *applier) implicitDir(pfd int, rel, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
	case err != nil:
		return fmt.Errorf("inspecting %q: %w", clip(rel), err)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil
	case a.hidden[rel] && isWhiteout(&st):
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return fmt.Errorf("replacing whiteout %q: %w", clip(rel), err)
		}
	default:
		return describe(rel, unix.ENOTDIR)
	}
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
		return fmt.Errorf("creating %q: %w", clip(rel), err)
	}
	dfd, err := openBeneath(pfd, base, unix.O_RDONLY)
	if err != nil {
		return describe(rel, err)
	}
	defer unix.Close(dfd)
	if err := unix.Fchown(dfd, 0, 0); err != nil {
		return fmt.Errorf("chown %q: %w", clip(rel), err)
	}
	if err := unix.Fchmod(dfd, 0o755); err != nil {
		return fmt.Errorf("chmod %q: %w", clip(rel), err)
	}
	if a.hidden[rel] {
		return setOpaque(dfd, rel)
	}
	return nil
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// invalidate drops cached handles on rel and everything beneath it, after
// rel was removed.
func (a *applier) invalidate(rel string) {
	for k, fd := range a.dirs {
		if k == rel || strings.HasPrefix(k, rel+"/") {
			unix.Close(fd)
			delete(a.dirs, k)
		}
	}
}

// clear removes whatever this layer already has at base (a later entry
// replaces an earlier one), except a directory when keepDir is set. It
// reports whether a directory was kept.
func (a *applier) clear(pfd int, rel, base string, keepDir bool) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inspecting %q: %w", clip(rel), err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, nil
		}
		a.invalidate(rel)
		if err := removeAllAt(pfd, base); err != nil {
			return false, fmt.Errorf("replacing directory %q: %w", clip(rel), err)
		}
		return false, nil
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return false, fmt.Errorf("replacing %q: %w", clip(rel), err)
	}
	return false, nil
}

// removeAllAt removes name (and, for a directory, everything in it)
// relative to dirfd, never following a symlink.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAllAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

func (a *applier) file(tr *tar.Reader, hdr *tar.Header, dir, base string) error {
	rel := joinRel(dir, base)
	if hdr.Size > a.lim.MaxLayerSize-a.stats.Size {
		return a.layerTooLarge()
	}
	if hdr.Size > a.imageLeft.Load() {
		return a.imageTooLarge()
	}
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	if _, err := a.clear(pfd, rel, base, false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if _, err := io.CopyBuffer(&budgetWriter{f: f, a: a}, tr, a.buf); err != nil {
		return err
	}
	if err := a.meta(fd, hdr, true); err != nil {
		return err
	}
	if err := unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return f.Close()
}

// budgetWriter counts file content against the layer's and the image's
// limits before writing it.
type budgetWriter struct {
	f *os.File
	a *applier
}

func (w *budgetWriter) Write(p []byte) (int, error) {
	if err := w.a.ctx.Err(); err != nil {
		return 0, err
	}
	n := int64(len(p))
	w.a.stats.Size += n
	if w.a.stats.Size > w.a.lim.MaxLayerSize {
		return 0, w.a.layerTooLarge()
	}
	if w.a.imageLeft.Add(-n) < 0 {
		return 0, w.a.imageTooLarge()
	}
	if w.a.room != nil {
		if err := w.a.room(n); err != nil {
			return 0, err
		}
	}
	return w.f.Write(p)
}

func (a *applier) layerTooLarge() error {
	return fmt.Errorf("%w: layer unpacks to more than %d bytes", errdefs.ErrTooLarge, a.lim.MaxLayerSize)
}

func (a *applier) imageTooLarge() error {
	return fmt.Errorf("%w: image unpacks to more than %d bytes", errdefs.ErrTooLarge, a.lim.MaxImageSize)
}

// meta sets owner, then mode (chown clears setuid and setgid bits), then
// extended attributes (chown clears security.capability too) on an open
// regular file or directory.
func (a *applier) meta(fd int, hdr *tar.Header, regular bool) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return a.setXattrs(fd, hdr, regular)
}

// allowXattr decides which of an image's extended attributes are kept:
//   - user.*: application data, kept; but user.overlay.* is overlayfs's own
//     metadata in the sandboxes' (userxattr) overlay, so an image may not
//     forge it: whiteouts and opaque directories come only from .wh. names;
//   - security.capability: file capabilities (ping, some servers), kept;
//   - system.posix_acl_access/default: POSIX ACLs, kept;
//   - every other security.* (SELinux labels, IMA/EVM) describes the host
//     the image was built on, not ours: dropped;
//   - trusted.* needs privilege and would let an image forge
//     trusted.overlay.*: dropped.
func allowXattr(key string) bool {
	switch {
	case strings.HasPrefix(key, "user.overlay."):
		return false
	case strings.HasPrefix(key, "user."):
		return true
	case key == "security.capability", key == "system.posix_acl_access", key == "system.posix_acl_default":
		return true
	}
	return false
}

const paxXattr = "SCHILY.xattr."

// setXattrs applies the allowed extended attributes of hdr. Only regular
// files and directories carry them: Linux refuses user.* on anything
// else, and capabilities only mean something on a file.
func (a *applier) setXattrs(fd int, hdr *tar.Header, regular bool) error {
	var keys []string
	size := 0
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattr) {
			continue
		}
		key := strings.TrimPrefix(k, paxXattr)
		size += len(key) + len(v)
		if !allowXattr(key) || (key == "security.capability" && !regular) {
			a.stats.SkippedXattrs++
			continue
		}
		keys = append(keys, key)
	}
	if size > a.lim.MaxXattrSize {
		return fmt.Errorf("%w: extended attributes exceed %d bytes", errdefs.ErrTooLarge, a.lim.MaxXattrSize)
	}
	sort.Strings(keys)
	for _, k := range keys {
		err := unix.Fsetxattr(fd, k, []byte(hdr.PAXRecords[paxXattr+k]), 0)
		if err == unix.EOPNOTSUPP {
			a.stats.SkippedXattrs++
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ERANGE) || errors.Is(err, unix.E2BIG) {
			// A value the kernel cannot take (a malformed capability
			// set, say) is the image's fault.
			return fmt.Errorf("%w: extended attribute %s: the kernel refuses its value (%v)", errdefs.ErrInvalid, k, err)
		}
		if err != nil {
			return fmt.Errorf("setting xattr %s: %w", k, err)
		}
	}
	return nil
}

// skipXattrs counts the xattrs of an entry that cannot carry any.
func (a *applier) skipXattrs(hdr *tar.Header) {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattr) {
			a.stats.SkippedXattrs++
		}
	}
}

func times(hdr *tar.Header) []unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{timespec(at), timespec(hdr.ModTime)}
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func (a *applier) dir(hdr *tar.Header, dir, base string) error {
	rel := joinRel(dir, base)
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	kept, err := a.clear(pfd, rel, base, true)
	if err != nil {
		return err
	}
	if !kept {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("creating: %w", err)
		}
	}
	dfd, err := openBeneath(pfd, base, unix.O_RDONLY)
	if err != nil {
		return describe(rel, err)
	}
	defer unix.Close(dfd)
	// A directory made where this layer whited out a name must hide the
	// lower layers' entry, as the whiteout did.
	return a.dirMeta(dfd, rel, hdr, !kept && a.hidden[rel])
}

func (a *applier) dirMeta(dfd int, rel string, hdr *tar.Header, opaque bool) error {
	if err := a.meta(dfd, hdr, false); err != nil {
		return err
	}
	if opaque {
		if err := setOpaque(dfd, rel); err != nil {
			return err
		}
	}
	a.times = append(a.times, dirTime{rel: rel, ts: times(hdr)})
	return nil
}

func setOpaque(dfd int, rel string) error {
	for _, x := range opaqueXattrs {
		if err := unix.Fsetxattr(dfd, x, []byte("y"), 0); err != nil {
			return fmt.Errorf("marking %q opaque (%s): %w", clip(rel), x, err)
		}
	}
	return nil
}

func (a *applier) symlink(hdr *tar.Header, dir, base string) error {
	rel := joinRel(dir, base)
	if hdr.Linkname == "" || len(hdr.Linkname) > maxLinkTarget || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return errdefs.Invalid("symlink", "bad target %q", clip(hdr.Linkname))
	}
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	if _, err := a.clear(pfd, rel, base, false); err != nil {
		return err
	}
	// The target is stored verbatim: it is resolved at run time, inside
	// the sandbox's root, never here.
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return fmt.Errorf("creating symlink: %w", err)
	}
	a.skipXattrs(hdr)
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return nil
}

// hardlink links to an entry earlier in this same layer: a layer is its
// own directory, so a target in a lower layer cannot be linked to (nor can
// one outside the layer: the target is resolved like any entry name).
func (a *applier) hardlink(hdr *tar.Header, dir, base string) error {
	rel := joinRel(dir, base)
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if target == "" {
		return errdefs.Invalid("hard link", "target is the layer's root")
	}
	if target == rel {
		return nil
	}
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	if _, err := a.clear(pfd, rel, base, false); err != nil {
		return err
	}
	tdir, tbase := splitRel(target)
	tfd, err := a.parent(tdir, false)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	// Flags 0: a symlink target is linked itself, never followed.
	switch err := unix.Linkat(tfd, tbase, pfd, base, 0); err {
	case nil:
		return nil
	case unix.ENOENT:
		return fmt.Errorf("%w: hard link target %q is not in this layer", errdefs.ErrInvalid, clip(target))
	case unix.EPERM:
		return fmt.Errorf("%w: hard link target %q is a directory", errdefs.ErrInvalid, clip(target))
	default:
		return fmt.Errorf("linking to %q: %w", clip(target), err)
	}
}

// node makes a character or block device or a FIFO. The store runs as
// root on the host and keeps the node as the image has it; its tree is
// private (0700) and the runtime mounts layers nodev, and a sandbox's
// overlay lives in a user namespace where device nodes cannot be opened.
func (a *applier) node(hdr *tar.Header, dir, base string) error {
	rel := joinRel(dir, base)
	var kind uint32
	switch hdr.Typeflag {
	case tar.TypeChar:
		kind = unix.S_IFCHR
	case tar.TypeBlock:
		kind = unix.S_IFBLK
	default:
		kind = unix.S_IFIFO
	}
	if hdr.Devmajor < 0 || hdr.Devmajor > 1<<31 || hdr.Devminor < 0 || hdr.Devminor > 1<<31 {
		return errdefs.Invalid("device", "number %d:%d is out of range", hdr.Devmajor, hdr.Devminor)
	}
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	if _, err := a.clear(pfd, rel, base, false); err != nil {
		return err
	}
	perm := uint32(hdr.Mode) & 0o7777
	dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	if err := unix.Mknodat(pfd, base, kind|perm, dev); err != nil {
		return fmt.Errorf("mknod: %w", err)
	}
	a.skipXattrs(hdr)
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := chmodNoFollow(pfd, base, perm); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times: %w", err)
	}
	return nil
}

// chmodNoFollow changes the mode of a node this applier just made.
// fchmodat2 (Linux 6.6) can refuse to follow a symlink; before it, plain
// fchmodat is still safe here because the node was made a moment ago in a
// directory nobody else writes to.
func chmodNoFollow(dirfd int, name string, mode uint32) error {
	err := unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		err = unix.Fchmodat(dirfd, name, mode, 0)
	}
	return err
}

// whiteout records that name is deleted from the lower layers: overlayfs
// reads a 0/0 character device as a whiteout. If this layer has its own
// entry of that name, the whiteout only hides the lower layers' one (OCI:
// a whiteout never applies to its own layer): a directory becomes opaque,
// anything else already hides the lower entry.
func (a *applier) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return errdefs.Invalid("whiteout", "names no entry")
	}
	rel := joinRel(dir, name)
	pfd, err := a.parent(dir, true)
	if err != nil {
		return err
	}
	a.hidden[rel] = true
	var st unix.Stat_t
	err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
		if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("making whiteout: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("inspecting %q: %w", clip(rel), err)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		dfd, err := openBeneath(pfd, name, unix.O_RDONLY)
		if err != nil {
			return describe(rel, err)
		}
		defer unix.Close(dfd)
		return setOpaque(dfd, rel)
	}
	return nil
}

// opaque marks dir as hiding everything the lower layers have in it.
// Overlayfs does not look at opacity on a layer's root directory, so an
// opaque root (this layer replaces the whole tree) is recorded in the
// layer's stats instead: an image built on it leaves out every layer below.
func (a *applier) opaque(dir string) error {
	if dir == "" {
		a.stats.OpaqueRoot = true
		return setOpaque(a.root, dir)
	}
	if _, err := a.parent(dir, true); err != nil {
		return err
	}
	dfd, err := openBeneath(a.root, dir, unix.O_RDONLY)
	if err != nil {
		return describe(dir, err)
	}
	defer unix.Close(dfd)
	return setOpaque(dfd, dir)
}

// setDirTimes sets every directory's times, after the whole stream: each
// entry added to a directory changed its mtime.
func (a *applier) setDirTimes() error {
	for _, t := range a.times {
		if t.rel == "" {
			if err := unix.UtimesNanoAt(a.root, ".", t.ts, 0); err != nil {
				return fmt.Errorf("setting times of the root: %w", err)
			}
			continue
		}
		dir, base := splitRel(t.rel)
		pfd, err := a.parent(dir, false)
		if err != nil {
			// A later entry replaced the directory (or a parent) with
			// something else: its times were set with it.
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if err := unix.UtimesNanoAt(pfd, base, t.ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("setting times of %q: %w", clip(t.rel), err)
		}
	}
	return nil
}

// clip shortens a name from an archive for an error message.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
