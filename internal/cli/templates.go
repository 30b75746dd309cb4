package cli

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/template"
)

// templateCmd is `paddock template build|ls|rm`.
func templateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build, list and remove templates (an image plus cached setup steps)",
	}
	var file, name string
	var quiet bool
	build := &cobra.Command{
		Use:   "build [DIR]",
		Short: "Build a template from paddock.yaml; DIR (default .) holds the files its copy steps name",
		Long: "Build a template. Each step is cached by its content: a rebuild reuses the steps\n" +
			"before the first one that changed. The build's output streams to stdout.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			if file == "" {
				file = filepath.Join(dir, "paddock.yaml")
			}
			raw, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			spec, err := template.Parse(raw)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			var srcs []string
			for _, s := range spec.Steps {
				if s.Copy != nil && s.Copy.Src != "" {
					srcs = append(srcs, s.Copy.Src)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(writeContext(pw, dir, raw, srcs)) }()
			defer pr.Close()
			t, err := c.BuildTemplateContext(cmd.Context(), pr, client.BuildOptions{Name: name, Progress: func(e api.TemplateEvent) {
				switch {
				case e.Step > 0 && !quiet:
					cached := ""
					if e.Cache == "hit" {
						cached = " (cached)"
					}
					fmt.Fprintf(g.stderr, "step %d/%d: %s%s\n", e.Step, e.Steps, e.Action, cached)
				case e.Stream == "stdout" && !quiet:
					io.WriteString(g.stdout, e.Data)
				case e.Stream == "stderr" && !quiet:
					io.WriteString(g.stderr, e.Data)
				}
			}})
			if err != nil {
				return err
			}
			if !quiet && len(t.Spec.Containers) > 0 {
				fmt.Fprintf(g.stderr, "recorded %s: a group of %d containers, %d kept ready (paddock pool set template:%s N)\n", t.Name, len(t.Spec.Containers), t.Warm, t.Name)
			} else if !quiet {
				fmt.Fprintf(g.stderr, "built %s in %.0f ms: %d cached, %d run; snapshot %s\n", t.Name, t.BuildMS, t.CacheHits, t.CacheMisses, t.Snapshot)
			}
			fmt.Fprintln(g.stdout, t.Name)
			return nil
		},
	}
	build.Flags().StringVarP(&file, "file", "f", "", "the spec (default DIR/paddock.yaml)")
	build.Flags().StringVar(&name, "name", "", "the template's name (default: the spec's)")
	build.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the template's name")

	ls := listCmd(g, listing[api.Template]{
		short:  "List templates",
		fetch:  (*client.Client).Templates,
		key:    func(t api.Template) string { return t.Name },
		header: "NAME\tIMAGE\tSTEPS\tSNAPSHOT\tWARM\tBUILT",
		row: func(t api.Template) string {
			return fmt.Sprintf("%s\t%s\t%d\t%s\t%d/%d\t%s", t.Name, t.Image, len(t.Steps), t.Snapshot, t.WarmReady, t.Warm, ago(t.CreatedAt))
		},
	})

	rm := removeCmd(g, "rm NAME...", "Remove templates (sandboxes made from them keep their files)", (*client.Client).DeleteTemplate)
	cmd.AddCommand(build, ls, rm)
	return cmd
}

// writeContext writes the build context: the spec as paddock.yaml and
// every file under dir that a copy step names. Each path is resolved
// under dir (os.Root): a symbolic link on the way is followed only while
// it stays in dir, and one that leaves it (an absolute target, or one
// with "..", say a link that came out of a sandbox) is refused, so no host
// file outside dir goes into a template. Links inside what is copied are
// sent as links and never followed here; the sandbox resolves them.
func writeContext(w io.Writer, dir string, spec []byte, srcs []string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening the build context: %w", err)
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "paddock.yaml", Mode: 0o644, Size: int64(len(spec)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(spec); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, src := range srcs {
		name, err := template.ContextPath(src)
		if err != nil {
			return fmt.Errorf("copy.src: %w", err)
		}
		if err := addContext(tw, root, name, seen); err != nil {
			return fmt.Errorf("reading the build context %s: %w", dir, err)
		}
	}
	return tw.Close()
}

// addContext writes name (resolved under root) and, for a directory,
// what it holds.
func addContext(tw *tar.Writer, root *os.Root, name string, seen map[string]bool) error {
	fi, err := root.Lstat(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return fmt.Errorf("%w (a path in the build context must stay in it: a symbolic link leading out of it is not followed)", err)
	}
	if !seen[name] && name != "." {
		seen[name] = true
		if err := addContextEntry(tw, root, name, fi); err != nil {
			return err
		}
	}
	if !fi.IsDir() {
		return nil
	}
	d, err := root.Open(name)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		if err := addContext(tw, root, path.Join(name, n), seen); err != nil {
			return err
		}
	}
	return nil
}

func addContextEntry(tw *tar.Writer, root *os.Root, name string, fi fs.FileInfo) error {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = root.Readlink(name); err != nil {
			return err
		}
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	h.Name, h.Uname, h.Gname, h.Uid, h.Gid = name, "", "", 0, 0
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(h)
	}
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	// What was opened must be what was looked at (not something swapped in).
	if ofi, err := f.Stat(); err != nil || !os.SameFile(fi, ofi) {
		return fmt.Errorf("%s: changed while the context was read", name)
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if n, err := io.CopyN(tw, f, h.Size); err != nil {
		return fmt.Errorf("%s: changed while it was read (%d of %d bytes): %w", name, n, h.Size, err)
	}
	return nil
}
