package oci

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// blob is one layer of an image being stored, as its source has it.
type blob struct {
	diffID v1.Hash // from the image's config: the sha256 of the uncompressed tar
	// digest is the blob's digest from a manifest. It is zero when the
	// source has none (a `docker save` archive names layers by path), and
	// then the diff ID alone vouches for the content.
	digest v1.Hash
	size   int64 // the blob's size from the manifest, or -1
	open   func() (io.ReadCloser, error)
}

// layerInfo is a stored layer's layer.json.
type layerInfo struct {
	DiffID string `json:"diff_id"`
	layerStats
	Unpacked time.Time `json:"unpacked"`
}

const (
	layerRootName = "root"
	layerInfoName = "layer.json"
	tmpPrefix     = durable.TempPrefix
	delPrefix     = ".del-"
)

func (s *Store) layersDir() string          { return filepath.Join(s.dir, "layers") }
func (s *Store) layerDir(hex string) string { return filepath.Join(s.dir, "layers", hex) }
func (s *Store) layerRoot(hex string) string {
	return filepath.Join(s.dir, "layers", hex, layerRootName)
}

// ensureLayer makes sure the layer b is unpacked, unpacking it if no
// image has it yet. Layers are locked one by one, so two pulls sharing a
// layer unpack it once: the second waits and then finds it. It reports
// whether this call unpacked it.
func (s *Store) ensureLayer(ctx context.Context, b blob, imageLeft *atomic.Int64) (*layerInfo, bool, error) {
	hex := b.diffID.Hex
	unlock, err := s.layerLocks.lock(ctx, hex)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	s.mu.Lock()
	info := s.layers[hex]
	s.mu.Unlock()
	if info != nil {
		if imageLeft.Add(-info.Size) < 0 {
			return nil, false, fmt.Errorf("%w: image unpacks to more than %d bytes", errdefs.ErrTooLarge, s.lim.MaxImageSize)
		}
		return info, false, nil
	}
	start := time.Now()
	info, err = s.unpack(ctx, b, imageLeft)
	if err != nil {
		return nil, false, err
	}
	s.unpacks.Add(1)
	s.mu.Lock()
	s.layers[hex] = info
	s.mu.Unlock()
	s.log.Debug("layer unpacked", "diff_id", short(b.diffID.String()), "size", info.Size,
		"entries", info.Entries, "skipped_xattrs", info.SkippedXattrs, "took", time.Since(start).Round(time.Millisecond))
	return info, true, nil
}

// unpack streams the blob through its digest check, decompression and the
// diff ID check into a fresh temporary directory, and renames that into
// place only once the whole stream was read and both digests matched and
// the tree was synced to disk. On any error the temporary directory goes:
// nothing half-written is ever visible under the layer's name.
func (s *Store) unpack(ctx context.Context, b blob, imageLeft *atomic.Int64) (info *layerInfo, err error) {
	hexID := b.diffID.Hex
	tmp, err := os.MkdirTemp(s.layersDir(), tmpPrefix+hexID+"-")
	if err != nil {
		return nil, fmt.Errorf("creating layer dir: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	root := filepath.Join(tmp, layerRootName)
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening layer dir: %w", err)
	}
	defer unix.Close(rootfd)

	stats, err := s.extract(ctx, b, rootfd, imageLeft)
	if err != nil {
		return nil, err
	}
	// One syncfs instead of an fsync per file: the rename below must not
	// reach the disk before the tree does.
	syncStart := time.Now()
	if err := unix.Syncfs(rootfd); err != nil {
		return nil, fmt.Errorf("syncing layer: %w", err)
	}
	s.log.Debug("layer synced", "diff_id", short(b.diffID.String()), "took", time.Since(syncStart).Round(time.Millisecond))
	info = &layerInfo{DiffID: b.diffID.String(), layerStats: stats, Unpacked: time.Now().UTC()}
	data, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	if err := durable.Create(filepath.Join(tmp, layerInfoName), data, 0o600); err != nil {
		return nil, err
	}
	err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, s.layerDir(hexID), unix.RENAME_NOREPLACE)
	if err != nil {
		return nil, fmt.Errorf("publishing layer: %w", err)
	}
	if err := durable.SyncDir(s.layersDir()); err != nil {
		return nil, err
	}
	return info, nil
}

// extract runs the stream into the directory open at rootfd and checks
// both digests. A blob that fails its digest is reported as corrupt even
// when the damage first showed as a decompression or tar error: the rest
// of the blob is read (up to its declared size) to tell.
func (s *Store) extract(ctx context.Context, b blob, rootfd int, imageLeft *atomic.Int64) (layerStats, error) {
	rc, err := b.open()
	if err != nil {
		return layerStats{}, fmt.Errorf("fetching blob: %w", err)
	}
	defer rc.Close()
	rawLimit := s.lim.MaxLayerSize
	if b.size >= 0 {
		rawLimit = b.size
	}
	raw := newDigester(sourceReader{rc}, rawLimit, "blob")
	br := bufio.NewReaderSize(raw, 256<<10)
	dec, err := decompress(br)
	if err != nil {
		return layerStats{}, err
	}
	diff := newDigester(contentReader{dec}, s.lim.MaxLayerSize, "uncompressed layer")
	a := newApplier(rootfd, s.lim, imageLeft, s.log)
	a.room = s.room
	err = a.apply(ctx, diff)
	if err == nil {
		// The tar's end-of-archive marker need not be the end of the
		// stream; the diff ID covers every byte.
		_, err = io.Copy(io.Discard, diff)
	}
	dec.Close()
	if ctx.Err() != nil {
		return layerStats{}, ctx.Err()
	}
	if errors.Is(err, errdefs.ErrTooLarge) {
		return layerStats{}, err
	}
	_, drainErr := io.Copy(io.Discard, br)
	if (b.digest != v1.Hash{}) && b.digest.Algorithm == "sha256" {
		if got := raw.sum(); got != b.digest.Hex {
			return layerStats{}, errdefs.New(errdefs.ErrInvalid, "blob %s is corrupt: its %d bytes (of %d) hash to sha256:%s", b.digest, raw.n, b.size, got)
		}
	}
	if err != nil {
		return layerStats{}, err
	}
	if drainErr != nil {
		return layerStats{}, fmt.Errorf("reading blob: %w", drainErr)
	}
	if got := diff.sum(); got != b.diffID.Hex {
		return layerStats{}, errdefs.New(errdefs.ErrInvalid, "layer content is corrupt: it hashes to sha256:%s, not to its diff ID", got)
	}
	return a.stats, nil
}

// sourceError is an error of the stream a blob is read from (network,
// disk): it says nothing about the blob's content.
type sourceError struct{ err error }

func (e sourceError) Error() string { return e.err.Error() }
func (e sourceError) Unwrap() error { return e.err }

type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = sourceError{err}
	}
	return n, err
}

// contentReader reads a decompressed layer: an error the decompressor
// raised itself (bad data, a checksum, a truncated stream) means the
// layer is corrupt, which is the caller's input, not a daemon failure.
type contentReader struct{ r io.Reader }

func (c contentReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	var se sourceError
	if err != nil && err != io.EOF && !errors.As(err, &se) && !errors.Is(err, errdefs.ErrTooLarge) {
		err = errdefs.New(errdefs.ErrInvalid, "layer is corrupt: %v", err)
	}
	return n, err
}

// digester hashes and counts what is read through it and refuses to read
// past a limit.
type digester struct {
	r     io.Reader
	h     hash.Hash
	n     int64
	limit int64
	what  string
}

func newDigester(r io.Reader, limit int64, what string) *digester {
	return &digester{r: r, h: sha256.New(), limit: limit, what: what}
}

func (d *digester) Read(p []byte) (int, error) {
	if d.n > d.limit {
		return 0, d.tooLarge()
	}
	// Read at most one byte past the limit: enough to tell.
	if left := d.limit - d.n + 1; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if d.n > d.limit {
		return n, d.tooLarge()
	}
	return n, err
}

func (d *digester) tooLarge() error {
	return fmt.Errorf("%w: %s is larger than %d bytes", errdefs.ErrTooLarge, d.what, d.limit)
}

func (d *digester) sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

// decompress recognises the blob's compression by its magic bytes, not by
// the media type a manifest claims.
func decompress(br *bufio.Reader) (io.ReadCloser, error) {
	magic, _ := br.Peek(6)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: layer is corrupt: %w", errdefs.ErrInvalid, err)
		}
		return zr, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The window bounds the decoder's memory; 128 MiB covers zstd's
		// --long mode.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, err
		}
		return zr.IOReadCloser(), nil
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}), bytes.HasPrefix(magic, []byte("BZh")):
		return nil, fmt.Errorf("%w: xz and bzip2 layers are not supported (OCI layers are tar, gzip or zstd)", errdefs.ErrInvalid)
	}
	return io.NopCloser(br), nil
}

// keyedMutex is a mutex per key whose waiters give up with their context.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{}
	refs int
}

func (k *keyedMutex) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// short abbreviates a digest for logs and messages.
func short(d string) string {
	if i := len("sha256:") + 12; len(d) > i {
		return d[:i]
	}
	return d
}

// room refuses n more bytes of unpacked content when the store's file
// system would be left with less than MinFree free. Every unpack under
// way writes to that file system, so its free space accounts them all.
func (s *Store) room(n int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		return fmt.Errorf("checking the image store's free space: %w", err)
	}
	if free := int64(st.Bavail) * st.Bsize; free-n < s.lim.MinFree {
		return fmt.Errorf("%w: unpacking would leave less than %d bytes free on the image store's file system (%d free)", errdefs.ErrNoSpace, s.lim.MinFree, free)
	}
	return nil
}
