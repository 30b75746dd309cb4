package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// fileCmds are cp and files.
func fileCmds(g *globals) []*cobra.Command {
	files := &cobra.Command{
		Use:   "files",
		Short: "Work with the files of a sandbox",
		Long: "Paths are inside the sandbox, resolved under its root (a symbolic link to /etc is the\n" +
			"sandbox's /etc); relative paths start at the sandbox's workdir.",
	}
	files.AddCommand(filesLsCmd(g), filesCatCmd(g), filesRmCmd(g), filesMkdirCmd(g), filesMvCmd(g),
		filesWatchCmd(g), filesStatCmd(g), filesWriteCmd(g))
	return []*cobra.Command{cpCmd(g), files}
}

func filesLsCmd(g *globals) *cobra.Command {
	var long bool
	var depth int
	cmd := &cobra.Command{
		Use:   "ls [-l] [--depth N] ID [PATH]",
		Short: "List a directory (default: the workdir)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if depth < 1 {
				return fmt.Errorf("--depth: %d is below 1", depth)
			}
			dir := "."
			if len(args) == 2 {
				dir = args[1]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// Names are shown relative to the directory listed.
			base := ""
			var tw *tabwriter.Writer
			if long {
				tw = tabwriter.NewWriter(g.stdout, 0, 4, 1, ' ', 0)
			}
			err = c.ListFilesFunc(cmd.Context(), args[0], dir, depth, func(fi client.FileInfo) error {
				if base == "" {
					base = path.Dir(fi.Path)
				}
				name := strings.TrimPrefix(strings.TrimPrefix(fi.Path, base), "/")
				if !long {
					_, err := fmt.Fprintln(g.stdout, name)
					return err
				}
				if fi.LinkTarget != "" {
					name += " -> " + fi.LinkTarget
				}
				_, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", lsMode(&fi), owner(fi.User, fi.UID), owner(fi.Group, fi.GID),
					fi.Size, fi.ModTime.Local().Format("2006-01-02 15:04"), name)
				return err
			})
			if tw != nil {
				tw.Flush()
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "show type, mode, owner, size, time and link target")
	cmd.Flags().IntVar(&depth, "depth", 1, "levels to descend (1: the directory's own entries)")
	return cmd
}

func owner(name string, id uint32) string {
	if name != "" {
		return name
	}
	return fmt.Sprint(id)
}

// lsMode renders type and mode the way ls -l does.
func lsMode(fi *client.FileInfo) string {
	t := byte('-')
	switch fi.Type {
	case client.TypeDir:
		t = 'd'
	case client.TypeSymlink:
		t = 'l'
	case client.TypeOther:
		t = '?'
	}
	b := []byte{t}
	const rwx = "rwxrwxrwx"
	for i := 0; i < 9; i++ {
		if fi.Mode&(1<<(8-i)) != 0 {
			b = append(b, rwx[i])
		} else {
			b = append(b, '-')
		}
	}
	special := func(bit client.FileMode, at int, set, unset byte) {
		if fi.Mode&bit != 0 {
			if b[at] == '-' {
				b[at] = unset
			} else {
				b[at] = set
			}
		}
	}
	special(0o4000, 3, 's', 'S')
	special(0o2000, 6, 's', 'S')
	special(0o1000, 9, 't', 'T')
	return string(b)
}

func filesCatCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cat ID PATH...",
		Short: "Print files",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.eachPath(args, func(c *client.Client, id, p string) error {
				rc, err := c.ReadFile(cmd.Context(), id, p)
				if err != nil {
					return err
				}
				defer rc.Close()
				if _, err := io.Copy(g.stdout, rc); err != nil {
					return fmt.Errorf("reading %s: %w", p, err)
				}
				return nil
			})
		},
	}
}

func filesRmCmd(g *globals) *cobra.Command {
	var recursive, force bool
	cmd := &cobra.Command{
		Use:   "rm [-r] [-f] ID PATH...",
		Short: "Remove files (directories with -r; a symbolic link, never its target)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.eachPath(args, func(c *client.Client, id, p string) error {
				err := c.Remove(cmd.Context(), id, p, recursive)
				if force && errors.Is(err, client.ErrNotFound) && !strings.Contains(err.Error(), "sandbox") {
					return nil
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "ignore missing files")
	return cmd
}

func filesMkdirCmd(g *globals) *cobra.Command {
	var parents bool
	var mode, owner string
	cmd := &cobra.Command{
		Use:   "mkdir [-p] [-m MODE] [--owner USER[:GROUP]] ID PATH...",
		Short: "Make directories",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := modeFlag(mode)
			if err != nil {
				return err
			}
			opts := client.MkdirOptions{Parents: parents, Mode: m, Owner: owner}
			return g.eachPath(args, func(c *client.Client, id, p string) error {
				_, err := c.Mkdir(cmd.Context(), id, p, opts)
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "make parents as needed; an existing directory is no error")
	cmd.Flags().StringVarP(&mode, "mode", "m", "", "mode in octal, e.g. 0750 (default 0755)")
	cmd.Flags().StringVar(&owner, "owner", "", "owner, USER[:GROUP] as the sandbox knows them (default root)")
	return cmd
}

// eachPath runs fn on each PATH of "ID PATH..." arguments, in order,
// until one fails.
func (g *globals) eachPath(args []string, fn func(c *client.Client, id, p string) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	for _, p := range args[1:] {
		if err := fn(c, args[0], p); err != nil {
			return err
		}
	}
	return nil
}

// parseMode parses an octal mode, as the API writes it, into an
// os.FileMode with its special bits.
func parseMode(s string) (os.FileMode, error) {
	m, err := api.ParseFileMode(s)
	if err != nil {
		return 0, err
	}
	return m.OS(), nil
}

// modeFlag parses a --mode flag; empty is 0, the command's default.
func modeFlag(s string) (os.FileMode, error) {
	if s == "" {
		return 0, nil
	}
	m, err := parseMode(s)
	if err != nil {
		return 0, fmt.Errorf("--mode: %w", err)
	}
	return m, nil
}

func filesMvCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "mv [-f] ID SRC DST",
		Short: "Rename a file or directory (DST is the new name)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			_, err = c.Move(cmd.Context(), args[0], args[1], args[2], force)
			return err
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace an existing DST")
	return cmd
}

func filesStatCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stat ID PATH",
		Short: "Describe a file as JSON",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			fi, err := c.Stat(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			enc := json.NewEncoder(g.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(fi)
		},
	}
}

func filesWriteCmd(g *globals) *cobra.Command {
	var mode, owner string
	cmd := &cobra.Command{
		Use:   "write [-m MODE] [--owner USER[:GROUP]] ID PATH",
		Short: "Write stdin to a file, atomically",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := modeFlag(mode)
			if err != nil {
				return err
			}
			opts := client.WriteOptions{Mode: m, Owner: owner}
			c, err := g.client()
			if err != nil {
				return err
			}
			_, err = c.WriteFile(cmd.Context(), args[0], args[1], os.Stdin, opts)
			return err
		},
	}
	cmd.Flags().StringVarP(&mode, "mode", "m", "", "mode in octal (default: the existing file's, or 0644)")
	cmd.Flags().StringVar(&owner, "owner", "", "owner, USER[:GROUP] (default: the existing file's, or root)")
	return cmd
}

func filesWatchCmd(g *globals) *cobra.Command {
	var recursive, asJSON bool
	cmd := &cobra.Command{
		Use:   "watch [-r] [--json] ID PATH",
		Short: "Print changes under a directory until interrupted",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			w, err := c.Watch(ctx, args[0], args[1], recursive)
			if err != nil {
				return err
			}
			defer w.Close()
			enc := json.NewEncoder(g.stdout)
			for ev := range w.Events {
				if asJSON {
					err = enc.Encode(ev)
				} else {
					line := fmt.Sprintf("%s %-6s %s", ev.Time.Local().Format(time.TimeOnly+".000"), ev.Type, ev.Path)
					if ev.OldPath != "" {
						line += " (from " + ev.OldPath + ")"
					}
					_, err = fmt.Fprintln(g.stdout, line)
				}
				if err != nil {
					return err
				}
			}
			if ctx.Err() != nil && cmd.Context().Err() == nil {
				return nil // interrupted
			}
			if err := w.Err(); err != nil {
				return fmt.Errorf("watch ended: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "watch subdirectories too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a JSON line")
	return cmd
}
