package template

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// MaxContext bounds a build context's file bytes (it is held in memory).
const MaxContext = 64 << 20

// maxEntries bounds a build context's entries.
const maxEntries = 100000

// entry is one file, directory or symlink of a build context.
type entry struct {
	name string // clean, relative, no ".."
	typ  byte   // tar.TypeReg, TypeDir or TypeSymlink
	mode int64
	link string
	data []byte
	sum  [sha256.Size]byte // of data, computed once
	mod  time.Time
}

// Context is a build context: the files a spec's copy steps may name.
type Context struct {
	entries map[string]*entry
}

// NewContext returns an empty context (a spec with inline files only).
func NewContext() *Context { return &Context{entries: map[string]*entry{}} }

// ContextPath checks and cleans a build context path: relative, no "..",
// no NUL. "." and "" name the whole context.
func ContextPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", errors.New("not a valid path")
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%q must be relative to the build context", trunc(p))
	}
	// Cleaned whole: a prefix trimmed first ("./" of ".//x") can leave
	// an absolute path.
	c := path.Clean(p)
	if path.IsAbs(c) {
		return "", fmt.Errorf("%q must be relative to the build context", trunc(p))
	}
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%q leaves the build context", trunc(p))
	}
	return c, nil
}

// ReadContext reads a tar stream (the build context) into memory. Regular
// files, directories and symlinks are kept; names are cleaned and refused
// if they leave the context; other entry types are refused. specName, if
// found, is returned apart and not kept as a context file.
func ReadContext(r io.Reader, specName string) (*Context, []byte, error) {
	c := NewContext()
	var spec []byte
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, errdefs.Invalid("body", "reading the build context (tar): %v", err)
		}
		name, err := ContextPath(h.Name)
		if err != nil {
			return nil, nil, errdefs.Invalid("body", "tar entry: %v", err)
		}
		if name == "." {
			continue
		}
		if len(c.entries) >= maxEntries {
			return nil, nil, fmt.Errorf("%w: the build context has more than %d entries", errdefs.ErrTooLarge, maxEntries)
		}
		e := &entry{name: name, mode: h.Mode & 0o7777, mod: h.ModTime}
		switch h.Typeflag {
		case tar.TypeReg:
			e.typ = tar.TypeReg
			if total+h.Size > MaxContext {
				return nil, nil, fmt.Errorf("%w: the build context exceeds %d bytes", errdefs.ErrTooLarge, MaxContext)
			}
			if e.data, err = io.ReadAll(io.LimitReader(tr, h.Size)); err != nil {
				return nil, nil, errdefs.Invalid("body", "reading %s from the build context: %v", trunc(name), err)
			}
			total += int64(len(e.data))
			e.sum = sha256.Sum256(e.data)
		case tar.TypeDir:
			e.typ = tar.TypeDir
		case tar.TypeSymlink:
			e.typ, e.link = tar.TypeSymlink, h.Linkname
		default:
			return nil, nil, errdefs.Invalid("body", "build context entry %s has type %q; only files, directories and symlinks are accepted", trunc(name), h.Typeflag)
		}
		if name == specName && e.typ == tar.TypeReg {
			spec = e.data
			continue
		}
		c.entries[name] = e
	}
	if err := c.checkParents(); err != nil {
		return nil, nil, err
	}
	return c, spec, nil
}

// checkParents refuses an entry whose parent in the context is not a
// directory: "link/file" beside a symbolic link "link" would be written
// through the link when the step extracts it (the sandbox's extraction
// refuses that when the link leads out of the destination; this names the
// fault before a build starts).
func (c *Context) checkParents() error {
	for name := range c.entries {
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if e := c.entries[p]; e != nil && e.typ != tar.TypeDir {
				what := "a file"
				if e.typ == tar.TypeSymlink {
					what = "a symbolic link"
				}
				return errdefs.Invalid("body", "build context entry %s is under %s, which is %s", trunc(name), trunc(p), what)
			}
		}
	}
	return nil
}

// Put is what a copy step writes: entries to extract at Dir in the
// sandbox, and Hash, the digest of their content (names, types, modes,
// link targets and bytes; not times), which goes into the step's cache
// key. The entries share the context's bytes; the tar is only made when
// the step runs.
type Put struct {
	Dir     string
	Hash    string
	entries []*entry
}

// WriteTar writes the entries as a tar stream.
func (p Put) WriteTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, e := range p.entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, ModTime: e.mod, Size: int64(len(e.data))}
		if e.typ == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Resolve prepares a copy step.
func (c *Context) Resolve(cp api.TemplateCopy) (Put, error) {
	var sel []*entry
	dir := cp.Dest
	if cp.Content != nil {
		mode := int64(0o644)
		if cp.Mode != nil {
			mode = int64(*cp.Mode) & 0o7777
		}
		dir = path.Dir(cp.Dest)
		data := []byte(*cp.Content)
		sel = append(sel, &entry{name: path.Base(cp.Dest), typ: tar.TypeReg, mode: mode, data: data, sum: sha256.Sum256(data)})
	} else {
		src, err := ContextPath(cp.Src)
		if err != nil {
			return Put{}, errdefs.Invalid("copy.src", "%v", err)
		}
		e := c.entries[src]
		switch {
		case e != nil && e.typ != tar.TypeDir:
			// A file (or a link) lands at Dest, or in Dest/ under its name.
			name := path.Base(cp.Dest)
			if strings.HasSuffix(cp.Dest, "/") {
				name = path.Base(src)
			} else {
				dir = path.Dir(cp.Dest)
			}
			c := *e
			c.name = name
			sel = append(sel, &c)
		default:
			// A directory's contents land in Dest.
			prefix := src + "/"
			if src == "." {
				prefix = ""
			}
			for name, e := range c.entries {
				if rel, ok := strings.CutPrefix(name, prefix); ok && rel != "" {
					c := *e
					c.name = rel
					sel = append(sel, &c)
				}
			}
			if e == nil && len(sel) == 0 {
				return Put{}, errdefs.Invalid("copy.src", "%q is not in the build context", trunc(cp.Src))
			}
		}
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].name < sel[j].name })
	h := sha256.New()
	for _, e := range sel {
		fmt.Fprintf(h, "%q %c %o %q %x\n", e.name, e.typ, e.mode, e.link, e.sum)
	}
	return Put{Dir: path.Clean(dir), Hash: hex.EncodeToString(h.Sum(nil)), entries: sel}, nil
}

func sorted(s []string) []string { sort.Strings(s); return s }
