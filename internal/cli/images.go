package cli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// imageCmd is `paddock image ls|pull|import|inspect|rm`.
func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "Manage images: the built-in host image and OCI images",
		Long: "Sandboxes are made from an image (`paddock create --image NAME`): the built-in\n" +
			"\"host\" image (the default), or an OCI image imported from a `docker save` archive\n" +
			"or an OCI layout, or pulled from a registry. Images are unpacked once into\n" +
			"read-only layers that every sandbox shares.",
	}
	cmd.AddCommand(imageLsCmd(g), imagePullCmd(g), imageImportCmd(g), imageInspectCmd(g), imageRmCmd(g))
	return cmd
}

func imageLsCmd(g *globals) *cobra.Command {
	return listCmd(g, listing[api.Image]{
		short:  "List images",
		fetch:  (*client.Client).Images,
		key:    func(img api.Image) string { return img.Name },
		header: "NAME\tID\tLAYERS\tSIZE\tCREATED",
		row: func(img api.Image) string {
			created := "-"
			if img.CreatedAt != nil {
				created = ago(*img.CreatedAt)
			}
			size := "-"
			if !img.BuiltIn {
				size = formatSize(img.SizeBytes)
			}
			name := img.Name
			if name == "" {
				name = "<none>"
			}
			if len(img.Names) > 1 {
				name += fmt.Sprintf(" (+%d)", len(img.Names)-1)
			}
			return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", name, shortID(img.ID), img.Layers, size, created)
		},
	})
}

// shortID abbreviates an image ID for tables.
func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func imagePullCmd(g *globals) *cobra.Command {
	var req api.PullRequest
	var passwordStdin, tokenStdin, quiet bool
	cmd := &cobra.Command{
		Use:   "pull HOST[:PORT]/REPOSITORY[:TAG|@DIGEST]",
		Short: "Pull an image from a registry and print its ID",
		Long: "Pull an image from an OCI registry. The registry must be named. --digest pins the\n" +
			"manifest: the pull fails unless the registry serves exactly that. Credentials are\n" +
			"read from stdin (--password-stdin with --username, or --token-stdin) and never stored.\n" +
			"Plain HTTP (--insecure) is allowed to loopback registries, and to others only when the\n" +
			"daemon runs with --allow-insecure-registries.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Reference = args[0]
			if passwordStdin && tokenStdin {
				return fmt.Errorf("--password-stdin and --token-stdin exclude each other")
			}
			if passwordStdin || tokenStdin {
				secret, err := readSecret(cmd.InOrStdin())
				if err != nil {
					return err
				}
				if passwordStdin {
					req.Password = secret
				} else {
					req.Token = secret
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var progress func(api.PullEvent)
			if !quiet {
				start := time.Now()
				progress = func(e api.PullEvent) {
					switch {
					case e.Image != nil:
						fmt.Fprintf(g.stderr, "pulled %s: %d layers, %s unpacked, %s received in %.1fs\n",
							e.Image.Name, e.Image.Layers, formatSize(e.Image.SizeBytes), formatSize(e.Bytes), time.Since(start).Seconds())
					case e.Bytes > 0:
						fmt.Fprintf(g.stderr, "%s: %s received\n", e.Status, formatSize(e.Bytes))
					default:
						fmt.Fprintf(g.stderr, "%s %s\n", e.Status, req.Reference)
					}
				}
			}
			img, err := c.PullImage(cmd.Context(), req, progress)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, img.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Digest, "digest", "", "pin the manifest to this sha256:<hex> digest")
	f.StringVarP(&req.Username, "username", "u", "", "registry user name (with --password-stdin)")
	f.BoolVar(&passwordStdin, "password-stdin", false, "read the registry password from stdin")
	f.BoolVar(&tokenStdin, "token-stdin", false, "read a registry bearer token from stdin")
	f.BoolVar(&req.Insecure, "insecure", false, "allow plain HTTP to the registry")
	f.StringVar(&req.Platform, "platform", "", "os/arch[/variant] to pick from a multi-platform image")
	f.BoolVarP(&quiet, "quiet", "q", false, "print no progress")
	return cmd
}

// readSecret reads one line from r.
func readSecret(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("reading stdin: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("stdin held no secret")
	}
	return line, nil
}

func imageImportCmd(g *globals) *cobra.Command {
	var name string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "import FILE|-",
		Short: "Import an image archive (`docker save` or an OCI layout tar) and print its ID",
		Long: "Import an image from a `docker save` archive or an OCI image layout packed as a tar\n" +
			"(either may be gzip-compressed), from FILE or, with -, from stdin. The image is stored\n" +
			"under --name, or else under the names the archive gives it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = cmd.InOrStdin()
			var total int64
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				if fi, err := f.Stat(); err == nil {
					total = fi.Size()
				}
				in = f
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			cr := &countingReader{r: in}
			done := make(chan struct{})
			if !quiet {
				go reportUpload(g.stderr, cr, total, done)
			}
			start := time.Now()
			img, err := c.ImportImage(cmd.Context(), cr, name)
			close(done)
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintf(g.stderr, "imported %s: %d layers, %s unpacked, %s sent in %.1fs\n",
					img.Name, img.Layers, formatSize(img.SizeBytes), formatSize(cr.n.Load()), time.Since(start).Seconds())
			}
			fmt.Fprintln(g.stdout, img.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "name to store the image under (picks it from an archive of several)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print no progress")
	return cmd
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// reportUpload prints how much of an upload was sent, once a second.
func reportUpload(w io.Writer, cr *countingReader, total int64, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if total > 0 {
				fmt.Fprintf(w, "sent %s of %s\n", formatSize(cr.n.Load()), formatSize(total))
			} else {
				fmt.Fprintf(w, "sent %s\n", formatSize(cr.n.Load()))
			}
		}
	}
}

func imageInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect IMAGE",
		Short: "Describe an image (and the sandboxes made from it) as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			img, err := c.GetImage(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return writeJSON(g.stdout, img)
		},
	}
}

func imageRmCmd(g *globals) *cobra.Command {
	return removeCmd(g, "rm IMAGE...", "Remove images that no sandbox or snapshot uses", (*client.Client).DeleteImage)
}
