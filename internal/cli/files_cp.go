package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/sparse"
)

// defaultMaxCopy caps what a copy out of a sandbox writes on the host
// unless --max-size says otherwise.
const defaultMaxCopy = 16 << 30

func cpCmd(g *globals) *cobra.Command {
	var archive bool
	var maxSize string
	cmd := &cobra.Command{
		Use:   "cp [-a] SRC DST",
		Short: "Copy files and directories between the host and a sandbox",
		Long: `Copy files and directories between the host and a sandbox, as docker cp does.

One of SRC and DST is ID:PATH, a path in sandbox ID (relative paths start at
its workdir); the other is a host path (write ./a:b for a host file named a:b).

  SRC a file:       DST an existing directory gets DST/NAME; otherwise DST is
                    the file written (a DST ending in / must be a directory).
  SRC a directory:  DST an existing directory gets DST/NAME; otherwise DST is
                    made as the copy. SRC ending in /. copies its contents.
  SRC or DST "-":   a tar stream on stdin, extracted into the sandbox directory
                    DST, or the tar of SRC written to stdout.

Symbolic links are copied as links, their targets kept as written (an
absolute one included): a target is only text, which paddock never follows
on the host (nothing is extracted through a link, and a template build
refuses a copy source reached through one that leaves its context). Files copied into a sandbox belong to root
and files copied out to you, unless -a keeps the numeric owners. Copies out
never make set-id files.

Holes of sparse files are kept both ways (only their data travels). A copy
out writes at most --max-size bytes of files on the host (holes included;
default 16g, 0 for no cap): a sandbox's file can be far larger than the
host has room for.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseLocation(args[0]), parseLocation(args[1])
			limit, err := parseSize(maxSize)
			if err != nil {
				return fmt.Errorf("--max-size: %w", err)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			switch {
			case src.stdio && dst.remote:
				_, err := c.UploadTar(ctx, dst.id, dst.path, os.Stdin, client.UploadOptions{})
				return err
			case src.remote && dst.stdio:
				rc, err := c.DownloadTar(ctx, src.id, src.path)
				if err != nil {
					return err
				}
				defer rc.Close()
				if _, err := io.Copy(g.stdout, rc); err != nil {
					return fmt.Errorf("copying %s:%s: %w", src.id, src.path, err)
				}
				return nil
			case src.stdio || dst.stdio:
				return errors.New(`"-" goes with a sandbox path on the other side (cp - ID:DIR, or cp ID:PATH -)`)
			case src.remote && dst.remote:
				return errors.New("cp copies between the host and a sandbox, not between sandboxes")
			case !src.remote && !dst.remote:
				return errors.New("one of SRC and DST must be a sandbox path, ID:PATH")
			case dst.remote:
				return upload(ctx, c, src.path, dst, archive)
			default:
				return download(ctx, c, src, dst.path, archive, limit)
			}
		},
	}
	cmd.Flags().BoolVarP(&archive, "archive", "a", false, "keep numeric owners (uid/gid)")
	cmd.Flags().StringVar(&maxSize, "max-size", formatSize(defaultMaxCopy), "most bytes of files a copy out of a sandbox writes on the host, holes included (0: no cap)")
	return cmd
}

// location is one side of a cp.
type location struct {
	id, path string
	remote   bool
	stdio    bool
}

func parseLocation(arg string) location {
	if arg == "-" {
		return location{stdio: true}
	}
	if id, p, ok := strings.Cut(arg, ":"); ok && api.IsSandboxID(id) {
		if p == "" {
			p = "."
		}
		return location{id: id, path: p, remote: true}
	}
	return location{path: arg}
}

// contentsOnly reports a source written DIR/. (copy what is in DIR).
func contentsOnly(p string) bool { return strings.HasSuffix(p, "/.") || p == "." }

// upload copies a host file or tree into a sandbox.
func upload(ctx context.Context, c *client.Client, src string, dst location, archive bool) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	dstInfo, err := c.Stat(ctx, dst.id, dst.path)
	exists := err == nil
	if err != nil && !isFileNotFound(err) {
		return err
	}
	dstIsDir := exists && (dstInfo.IsDir() || dstInfo.Type == client.TypeSymlink && remoteDirLink(ctx, c, dst))
	if fi.Mode().IsRegular() {
		target := dst.path
		switch {
		case dstIsDir:
			target = path.Join(dst.path, filepath.Base(src))
		case !exists && strings.HasSuffix(dst.path, "/"):
			return fmt.Errorf("%s:%s: no such directory", dst.id, dst.path)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 < st.Size {
			// A file with holes goes as a sparse tar entry: only its
			// data travels, and the holes stay holes in the sandbox.
			return uploadTar(ctx, c, dst.id, path.Dir(target), src, path.Base(target), archive)
		}
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		opts := client.WriteOptions{Mode: fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)}
		if archive {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				opts.Owner = fmt.Sprintf("%d:%d", st.Uid, st.Gid)
			}
		}
		_, err = c.WriteFile(ctx, dst.id, target, f, opts)
		return err
	}
	if !fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 {
		return fmt.Errorf("%s: not a file, directory or symbolic link", src)
	}
	if fi.IsDir() && exists && !dstIsDir {
		return fmt.Errorf("cannot copy directory %s onto %s:%s, which is not a directory", src, dst.id, dst.path)
	}
	// The tar's entries are named so that extracting them into dir
	// makes target.
	var dir, prefix string
	if dstIsDir && !(fi.IsDir() && contentsOnly(src)) {
		dir, prefix = dst.path, filepath.Base(filepath.Clean(src))
	} else if exists && dstIsDir {
		dir = dst.path // contents into an existing directory
	} else {
		dir, prefix = path.Dir(path.Clean(dst.path)), path.Base(path.Clean(dst.path))
	}
	return uploadTar(ctx, c, dst.id, dir, src, prefix, archive)
}

// uploadTar sends the host file or tree src as a tar whose names start
// with prefix, extracted into the sandbox directory dir.
func uploadTar(ctx context.Context, c *client.Client, id, dir, src, prefix string, archive bool) error {
	pr, pw := io.Pipe()
	werr := make(chan error, 1)
	go func() {
		err := writeLocalTar(pw, src, prefix, archive)
		pw.CloseWithError(err)
		werr <- err
	}()
	_, err := c.UploadTar(ctx, id, dir, pr, client.UploadOptions{})
	pr.CloseWithError(errors.New("upload ended"))
	if terr := <-werr; terr != nil && err != nil {
		return terr
	}
	return err
}

// isFileNotFound tells a missing file from a missing sandbox.
func isFileNotFound(err error) bool {
	return errors.Is(err, client.ErrNotFound) && !strings.Contains(err.Error(), "sandbox")
}

// remoteDirLink reports whether a symbolic link in the sandbox leads to a
// directory (listing follows it, inside the sandbox).
func remoteDirLink(ctx context.Context, c *client.Client, l location) bool {
	err := c.ListFilesFunc(ctx, l.id, l.path, 1, func(client.FileInfo) error { return io.EOF })
	return err == nil || err == io.EOF
}

// writeLocalTar writes a host file or tree as a tar whose names start
// with prefix (none: relative to src). Links are stored as links.
func writeLocalTar(w io.Writer, src, prefix string, archive bool) error {
	tw := tar.NewWriter(w)
	buf := make([]byte, 256<<10)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := path.Join(prefix, filepath.ToSlash(rel))
		if name == "." || name == "" {
			return nil // the destination itself
		}
		link := ""
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode()&(os.ModeDevice|os.ModeSocket|os.ModeCharDevice) != 0:
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a type tar cannot hold
		}
		h.Name = name
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if !archive {
			h.Uid, h.Gid = 0, 0
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{uint64(st.Dev), uint64(st.Ino)} // Dev is an int32 on macOS
			if first, ok := links[key]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				links[key] = name
			}
		}
		if h.Typeflag != tar.TypeReg {
			return tw.WriteHeader(h)
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if ex, err := sparse.Extents(f, h.Size); err == nil && sparse.Sparse(ex, h.Size) {
			return sparse.WriteTar(tw, w, h, f, ex, buf)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if n, err := io.CopyN(tw, f, h.Size); err != nil {
			return fmt.Errorf("%s: changed while it was copied (%d of %d bytes): %w", p, n, h.Size, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// download copies a sandbox file or tree to the host. What comes out of
// the sandbox is hostile: it is extracted under a handle on the target
// directory with the same checks as an upload into a sandbox (no "..",
// nothing written through a link that leads out), and set-id bits are
// dropped.
//
// At most limit bytes of files are written (holes included; 0: no cap).
func download(ctx context.Context, c *client.Client, src location, dst string, archive bool, limit int64) error {
	info, err := c.Stat(ctx, src.id, src.path)
	if err != nil {
		return err
	}
	contents := contentsOnly(src.path) && info.IsDir()
	dfi, derr := os.Stat(dst)
	dstIsDir := derr == nil && dfi.IsDir()
	if derr != nil && !os.IsNotExist(derr) {
		return derr
	}
	// The tar's names start with the source's name ("." for the root).
	// A file goes through it too: a sparse file's holes travel as holes,
	// and its entry is made beside the target and renamed over it once
	// complete.
	var dir string
	var rename func(string) string
	switch {
	case info.Type == client.TypeFile:
		target := dst
		switch {
		case dstIsDir:
			name, err := hostName(info.Name)
			if err != nil {
				return fmt.Errorf("copying %s:%s: %w", src.id, src.path, err)
			}
			target = filepath.Join(dst, name)
		case derr != nil && strings.HasSuffix(dst, "/"):
			return fmt.Errorf("%s: no such directory", dst)
		}
		dir, rename = filepath.Dir(filepath.Clean(target)), replaceFirst(filepath.Base(filepath.Clean(target)))
	case info.IsDir() && derr == nil && !dstIsDir:
		return fmt.Errorf("cannot copy directory %s:%s onto %s, which is not a directory", src.id, src.path, dst)
	case info.Path == "/":
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		dir = dst
	case dstIsDir && !contents:
		dir = dst
	case dstIsDir:
		dir, rename = dst, replaceFirst("")
	default:
		dir, rename = filepath.Dir(filepath.Clean(dst)), replaceFirst(filepath.Base(filepath.Clean(dst)))
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	rc, err := c.DownloadTar(ctx, src.id, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	err = extractTar(d, rc, archive, rename, limit)
	if errors.Is(err, errdefs.ErrTooLarge) {
		err = fmt.Errorf("%w (--max-size raises the cap)", err)
	}
	if err != nil {
		return fmt.Errorf("copying %s:%s to %s: %w", src.id, src.path, dst, err)
	}
	return nil
}

// hostName checks a file name the sandbox reported before it is joined
// to a host directory: one element, so that it names a file in that
// directory and nowhere else.
func hostName(name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return "", fmt.Errorf("%w: the sandbox named the file %q, which is not a file name", errdefs.ErrInvalid, name)
	}
	return name, nil
}

// replaceFirst returns a Rename that replaces a name's first element
// with to ("" drops it, and the entry for the element itself).
func replaceFirst(to string) func(string) string {
	return func(name string) string {
		_, rest, _ := strings.Cut(name, "/")
		if to == "" {
			return rest
		}
		if rest == "" {
			return to
		}
		return to + "/" + rest
	}
}
