// Package archive keeps paused sandboxes in an S3-compatible object store
// so that they outlive their node: a sandbox's record (spec, environment,
// limits, policy, labels; secrets by name only) and its disk, compressed
// and streamed in parts, are written under its id; any node can read them
// back, checking the disk's checksum before it keeps a byte of it.
//
// It is the one seam to the object store: the sandbox manager archives
// and restores through a *Store, the gateway looks up where an archived
// sandbox went (Lookup).
//
// Layout, under Config.Prefix in Config.Bucket:
//
//	sandboxes/<id>/disk         the disk: zstd of a tar with one GNU sparse
//	                            entry (only the image's data travels)
//	sandboxes/<id>/container-N  a group's: the disk of each container N
//	sandboxes/<id>/shared-N     beside the first, and of each shared volume
//	sandboxes/<id>/record.json  Record: written last, once the disks are in
//	                            and verified; its presence is the archive
//
// A restore claims the record first (Claim): a write conditional on the
// record's ETag (If-Match), which the store applies atomically, so of any
// number of nodes that resume one archived sandbox at once exactly one
// wins and the others are told which did. No lock of our own: the object
// store's compare-and-swap is the arbiter.
package archive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// Config says where the archive lives.
type Config struct {
	// Endpoint is the store's URL: http(s)://host[:port]. http is for
	// loopback and test stores; production takes https.
	Endpoint string
	// Bucket holds the archive; it is made if missing.
	Bucket string
	// Prefix is put before every object's name ("" for none).
	Prefix string
	// AccessKey and SecretKey sign requests (S3 signature v4).
	AccessKey, SecretKey string
	// Region is the bucket's region ("" lets the client ask the store).
	Region string
	// PartSize is the size of each part of a disk's upload (default 16
	// MiB): memory use is about PartSize times Threads.
	PartSize uint64
	Threads  uint
}

// Store is an archive in an object store.
type Store struct {
	cfg Config
	c   *minio.Client

	mu     sync.Mutex
	bucket bool // the bucket is known to exist
}

// Record is what the archive keeps of a sandbox besides its disk.
type Record struct {
	ID string `json:"id"`
	// Sandbox is the node's record of the sandbox (api.Sandbox and what
	// the manager keeps beside it), as the archiving node wrote it.
	Sandbox json.RawMessage `json:"sandbox"`
	// Node is the node that holds the sandbox now: the one that archived
	// it (it keeps a stub and restores it on resume), or the one that
	// restored it elsewhere. Gateways route the id there when its own
	// tag's node is gone.
	Node string `json:"node"`
	// Disk is the archived disk (a group's first container's); nil once
	// a node restored it.
	Disk *Disk `json:"disk,omitempty"`
	// Containers and Shared are, for a sandbox of several containers,
	// the disks of its containers beside the first and of its shared
	// volumes, by name (objects ContainerDisk(name), SharedDisk(name)).
	Containers map[string]Disk `json:"containers,omitempty"`
	Shared     map[string]Disk `json:"shared,omitempty"`
	ArchivedAt time.Time       `json:"archived_at"`
	// Claim, when set, is the node restoring the sandbox (Claim).
	Claim *Claim `json:"claim,omitempty"`
}

// Claim says a node is restoring an archived sandbox.
type Claim struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
}

// ClaimTTL is how long a claim holds against other nodes: a node that
// died restoring does not keep its sandbox from every other node for
// good. A restore of 1 GiB takes seconds.
const ClaimTTL = 10 * time.Minute

// Disk describes an archived disk.
type Disk struct {
	// Bytes and SHA256 are the stored object's size and checksum.
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Size is the disk image's size (holes included); Data its bytes of
	// data.
	Size int64 `json:"size"`
	Data int64 `json:"data"`
}

// Open returns a Store for cfg. It does not call the store, which may be
// down: the first archive makes the bucket if it is missing.
func Open(cfg Config) (*Store, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, errdefs.Invalid("archive endpoint", "%q: want http(s)://host[:port]", cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, errdefs.Invalid("archive bucket", "is empty")
	}
	if cfg.PartSize == 0 {
		cfg.PartSize = 16 << 20
	}
	if cfg.Threads == 0 {
		cfg.Threads = 4
	}
	cfg.Prefix = strings.Trim(cfg.Prefix, "/")
	if cfg.Prefix != "" {
		cfg.Prefix += "/"
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: u.Scheme == "https",
		Region: cfg.Region,
		// A store that is down is said so in seconds, not after the
		// client's ten tries with back-off.
		MaxRetries:   3,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("archive store %s: %w", cfg.Endpoint, err)
	}
	return &Store{cfg: cfg, c: c}, nil
}

// Endpoint names the store in messages.
func (s *Store) Endpoint() string { return s.cfg.Endpoint + "/" + s.cfg.Bucket }

func (s *Store) ensureBucket(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bucket {
		return nil
	}
	ok, err := s.c.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return s.unavailable("checking bucket", err)
	}
	if !ok {
		if err := s.c.MakeBucket(ctx, s.cfg.Bucket, minio.MakeBucketOptions{Region: s.cfg.Region}); err != nil {
			if code := minio.ToErrorResponse(err).Code; code != "BucketAlreadyOwnedByYou" && code != "BucketAlreadyExists" {
				return s.unavailable("making bucket", err)
			}
		}
	}
	s.bucket = true
	return nil
}

// unavailable is the error of a call the store did not serve.
func (s *Store) unavailable(what string, err error) error {
	return errdefs.New(errdefs.ErrUnavailable, "archive store %s: %s: %v", s.Endpoint(), what, err)
}

func (s *Store) key(id, name string) string { return s.cfg.Prefix + "sandboxes/" + id + "/" + name }

// Get returns sandbox id's record: ErrNotFound if it was never archived.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	rec, _, err := s.get(ctx, id)
	return rec, err
}

// get is Get with the record's ETag, for a conditional write after it.
// A record replaced while it is read (minio-go reads on with If-Match
// of the ETag it saw first; the store answers 412) is read again, a few
// times.
func (s *Store) get(ctx context.Context, id string) (Record, string, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return Record{}, "", err
	}
	for try := 1; ; try++ {
		rec, etag, err := s.getOnce(ctx, id)
		switch code := minio.ToErrorResponse(err).Code; {
		case err == nil, errors.Is(err, errdefs.ErrInvalid):
			return rec, etag, err
		case code == "NoSuchKey":
			return rec, "", errdefs.New(errdefs.ErrNotFound, "sandbox %s is not in the archive", id)
		case code == minio.PreconditionFailed && try < 5:
			continue
		default:
			return rec, "", s.unavailable("reading the record of "+id, err)
		}
	}
}

// getOnce reads the record once; the store's errors come back as they
// are, for get to tell a replaced record from the rest.
func (s *Store) getOnce(ctx context.Context, id string) (Record, string, error) {
	var rec Record
	obj, err := s.c.GetObject(ctx, s.cfg.Bucket, s.key(id, "record.json"), minio.GetObjectOptions{})
	if err != nil {
		return rec, "", err
	}
	defer obj.Close()
	st, err := obj.Stat()
	if err != nil {
		return rec, "", err
	}
	b, err := io.ReadAll(io.LimitReader(obj, maxRecord+1))
	if err != nil {
		return rec, "", err
	}
	if len(b) > maxRecord {
		return rec, "", errdefs.New(errdefs.ErrInvalid, "the archived record of %s is over %d bytes", id, maxRecord)
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.ID != id {
		return rec, "", errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt", id)
	}
	return rec, st.ETag, nil
}

// maxRecord bounds a record read back (a sandbox's record is a few KiB).
const maxRecord = 4 << 20

// Put writes sandbox id's record (the archive's commit point: write the
// disk first).
func (s *Store) Put(ctx context.Context, rec Record) error {
	_, err := s.put(ctx, rec, "")
	return err
}

// errChanged: a conditional write found the record changed since it was
// read.
var errChanged = errors.New("the record changed")

// put writes rec; with etag set, only if the stored record still has it
// (errChanged if not). It returns the new record's ETag.
func (s *Store) put(ctx context.Context, rec Record, etag string) (string, error) {
	if err := s.ensureBucket(ctx); err != nil {
		return "", err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	opts := minio.PutObjectOptions{ContentType: "application/json", DisableMultipart: true}
	if etag != "" {
		opts.SetMatchETag(etag)
	}
	info, err := s.c.PutObject(ctx, s.cfg.Bucket, s.key(rec.ID, "record.json"), strings.NewReader(string(b)), int64(len(b)), opts)
	if err != nil {
		// 412 when the ETag differs; 409 (ConditionalRequestConflict)
		// when another conditional write to it is under way; 404 when it
		// went.
		switch minio.ToErrorResponse(err).Code {
		case minio.PreconditionFailed, "ConditionalRequestConflict", "NoSuchKey":
			if etag != "" {
				return "", errChanged
			}
		}
		return "", s.unavailable("writing the record of "+rec.ID, err)
	}
	return info.ETag, nil
}

// Claimed is an archived sandbox a node claimed to restore it.
type Claimed struct {
	Record
	etag string
}

// Claim takes archived sandbox id for node to restore it. Of the nodes
// that claim one sandbox at once exactly one wins (a write conditional on
// the record's ETag); the others get ErrConflict naming it. A claim of
// another node's younger than ClaimTTL holds; node's own (a retry) is
// renewed. A sandbox already restored on another node is an
// errdefs.MovedError.
func (s *Store) Claim(ctx context.Context, id, node string) (*Claimed, error) {
	rec, etag, err := s.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := claimable(rec, node, time.Now()); err != nil {
		return nil, err
	}
	rec.Claim = &Claim{Node: node, At: time.Now().UTC()}
	etag, err = s.put(ctx, rec, etag)
	if errors.Is(err, errChanged) {
		// Another node claimed it (or restored it) meanwhile: name it.
		if now, _, gerr := s.get(ctx, id); gerr == nil {
			if err := claimable(now, node, time.Now()); err != nil {
				return nil, err
			}
		}
		return nil, errdefs.Conflict("sandbox %s is being resumed by another node", id)
	}
	if err != nil {
		return nil, err
	}
	return &Claimed{Record: rec, etag: etag}, nil
}

// claimable says why node may not claim rec now, or nil.
func claimable(rec Record, node string, now time.Time) error {
	switch {
	case rec.Disk == nil && rec.Node != node:
		return &errdefs.MovedError{ID: rec.ID, Node: rec.Node}
	case rec.Disk == nil:
		return errdefs.Conflict("sandbox %s was restored on this node already", rec.ID)
	case rec.Claim != nil && rec.Claim.Node != node && now.Sub(rec.Claim.At) < ClaimTTL:
		return errdefs.Conflict("sandbox %s is being resumed on node %s (since %s)", rec.ID, rec.Claim.Node, rec.Claim.At.Format(time.RFC3339))
	}
	return nil
}

// Release gives up a claim (the restore failed): the record is as it was,
// for any node to claim again.
func (s *Store) Release(ctx context.Context, c *Claimed) error {
	rec := c.Record
	rec.Claim = nil
	_, err := s.put(ctx, rec, c.etag)
	if errors.Is(err, errChanged) {
		return nil // another node took it over since: its claim stands
	}
	return err
}

// Restored ends a claim: the sandbox runs on c's node, the record names it
// and no disk, and the disk object is deleted. It fails with ErrConflict
// if another node took the claim over meanwhile (its claim had expired).
func (s *Store) Restored(ctx context.Context, c *Claimed) error {
	rec := c.Record
	rec.Node, rec.Disk, rec.Sandbox, rec.Claim = c.Claim.Node, nil, nil, nil
	rec.Containers, rec.Shared = nil, nil
	if _, err := s.put(ctx, rec, c.etag); err != nil {
		if errors.Is(err, errChanged) {
			return errdefs.Conflict("sandbox %s was claimed by another node while it was restored here", c.ID)
		}
		return err
	}
	return s.DeleteDisk(ctx, c.ID)
}

// Delete removes everything archived of sandbox id: its record first
// (its presence is the archive), then its disks.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.cfg.Bucket, s.key(id, "record.json"), minio.RemoveObjectOptions{}); err != nil &&
		minio.ToErrorResponse(err).Code != "NoSuchKey" {
		return s.unavailable("deleting "+id, err)
	}
	return s.DeleteDisk(ctx, id)
}

// DeleteDisk removes sandbox id's archived disks (once restored): every
// object under its name but the record.
func (s *Store) DeleteDisk(ctx context.Context, id string) error {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return err
	}
	var errs []error
	for obj := range s.c.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.key(id, ""), Recursive: true}) {
		if obj.Err != nil {
			if minio.ToErrorResponse(obj.Err).Code != "NoSuchBucket" {
				errs = append(errs, obj.Err)
			}
			break
		}
		if obj.Key == s.key(id, "record.json") {
			continue
		}
		if err := s.c.RemoveObject(ctx, s.cfg.Bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil &&
			minio.ToErrorResponse(err).Code != "NoSuchKey" {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s.unavailable("deleting the disks of "+id, err)
	}
	return nil
}

// Lookup is the node that holds archived sandbox id (Record.Node), for a
// gateway whose table has no live node for its tag.
func (s *Store) Lookup(ctx context.Context, id string) (node string, archived bool, err error) {
	rec, err := s.Get(ctx, id)
	if err != nil {
		return "", false, err
	}
	return rec.Node, rec.Disk != nil, nil
}
