package cli

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

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
			if !quiet {
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
// every file under dir that a copy step names.
func writeContext(w io.Writer, dir string, spec []byte, srcs []string) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "paddock.yaml", Mode: 0o644, Size: int64(len(spec)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(spec); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, src := range srcs {
		rel := path.Clean(strings.TrimPrefix(src, "./"))
		root := filepath.Join(dir, filepath.FromSlash(rel))
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			name = filepath.ToSlash(name)
			if seen[name] || name == "." {
				return nil
			}
			seen[name] = true
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name, h.Uname, h.Gname, h.Uid, h.Gid = name, "", "", 0, 0
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(tw, f)
				f.Close()
				return err
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("reading the build context: %w", err)
		}
	}
	return tw.Close()
}
