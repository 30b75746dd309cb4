package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sigs.k8s.io/yaml"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// createFlags are the flags that describe a new sandbox.
type createFlags struct {
	image   string
	cpus    float64
	memory  string
	pids    int64
	disk    string
	env     []string
	workdir string
	timeout time.Duration
	// onTimeout is what the timeout does: remove (default) or pause.
	onTimeout string
	labels    []string
	// autoPause pauses the sandbox after this long idle; noAutoResume
	// keeps it paused until resumed explicitly.
	autoPause    time.Duration
	noAutoResume bool
	from         string
	volumes      []string
	policy       policyFlags
	elastic      elasticFlags
	runtime      string
}

func (f *createFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", `image to run (default "host")`)
	fl.StringVar(&f.runtime, "runtime", "", `isolation tier: "native" (namespaces, seccomp) or "gvisor" (a kernel in user space; stronger, slower system calls); default: the daemon's`)
	fl.Float64Var(&f.cpus, "cpus", 0, "CPU quota in cores, e.g. 0.5")
	fl.StringVar(&f.memory, "memory", "", "memory cap, e.g. 512m")
	fl.Int64Var(&f.pids, "pids", 0, "cap on processes and threads")
	fl.StringVar(&f.disk, "disk", "", "cap on the writable layer, e.g. 1g")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE; repeatable")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory inside the sandbox")
	fl.DurationVar(&f.timeout, "timeout", 0, "lifetime, after which the sandbox is removed (or paused: --on-timeout), e.g. 10m")
	fl.StringVar(&f.onTimeout, "on-timeout", "", `what the timeout does: "remove" (default) or "pause" (kept until resumed or removed)`)
	fl.StringArrayVarP(&f.labels, "label", "l", nil, "label KEY=VALUE; repeatable")
	fl.DurationVar(&f.autoPause, "auto-pause", 0, "pause the sandbox after it has been idle this long, e.g. 10m")
	fl.BoolVar(&f.noAutoResume, "no-auto-resume", false, "do not resume a paused sandbox on the next call that needs it")
	fl.StringVar(&f.from, "from", "", "start from a snapshot id, a template or an image")
	fl.StringArrayVarP(&f.volumes, "volume", "v", nil, "mount a volume NAME:/path[:ro] (or a directory snapshot SNAPSHOT:/path); repeatable")
	f.policy.register(cmd)
	f.elastic.register(fl)
}

func (f *createFlags) request() (api.CreateRequest, error) {
	req := api.CreateRequest{Image: f.image, Workdir: f.workdir, From: f.from, Runtime: f.runtime}
	req.Resources.CPUs = f.cpus
	req.Resources.Pids = f.pids
	var err error
	if f.memory != "" {
		if req.Resources.MemoryBytes, err = parseSize(f.memory); err != nil {
			return req, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		if req.Resources.DiskBytes, err = parseSize(f.disk); err != nil {
			return req, fmt.Errorf("--disk: %w", err)
		}
	}
	if f.timeout < 0 {
		return req, fmt.Errorf("--timeout: %s is negative", f.timeout)
	}
	if f.timeout > 0 && f.timeout < time.Second {
		return req, fmt.Errorf("--timeout: %s is shorter than a second", f.timeout)
	}
	req.TimeoutSeconds = int64(f.timeout / time.Second)
	switch a := api.TimeoutAction(f.onTimeout); a {
	case "", api.TimeoutRemove, api.TimeoutPause:
		req.OnTimeout = a
	default:
		return req, fmt.Errorf("--on-timeout: %q is neither %q nor %q", f.onTimeout, api.TimeoutRemove, api.TimeoutPause)
	}
	if req.OnTimeout != "" && f.timeout == 0 {
		return req, fmt.Errorf("--on-timeout needs --timeout")
	}
	if f.autoPause < 0 {
		return req, fmt.Errorf("--auto-pause: %s is negative", f.autoPause)
	}
	req.AutoPauseSeconds = int64((f.autoPause + time.Second - 1) / time.Second)
	if f.noAutoResume {
		no := false
		req.AutoResume = &no
	}
	if req.Env, err = keyValues("--env", f.env); err != nil {
		return req, err
	}
	if req.Labels, err = keyValues("--label", f.labels); err != nil {
		return req, err
	}
	if req.Policy, err = f.policy.policy(os.Stdin); err != nil {
		return req, err
	}
	if req.Autoscale, req.Budget, err = f.elastic.values(); err != nil {
		return req, err
	}
	for _, v := range f.volumes {
		m, err := parseVolume(v)
		if err != nil {
			return req, err
		}
		req.Volumes = append(req.Volumes, m)
	}
	return req, nil
}

// parseVolume reads NAME:/path[:ro|:rw]; a NAME that is a snapshot id
// mounts that directory snapshot.
func parseVolume(s string) (api.VolumeMount, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return api.VolumeMount{}, fmt.Errorf("--volume: %q is not NAME:/path[:ro]", s)
	}
	m := api.VolumeMount{Name: parts[0], Path: parts[1]}
	if strings.HasPrefix(m.Name, "snap-") {
		m.Snapshot, m.Name = m.Name, ""
	}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			m.ReadOnly = true
		case "rw":
		default:
			return api.VolumeMount{}, fmt.Errorf("--volume: %q: mode must be ro or rw", s)
		}
	}
	return m, nil
}

func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s: %q is not KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// splitCommand returns the command after "--" (or all args when there is no
// dash), requiring `before` positional args before it.
func splitCommand(cmd *cobra.Command, args []string, before int) (head, command []string, err error) {
	dash := cmd.ArgsLenAtDash()
	if dash < 0 {
		dash = before
		if len(args) < before {
			dash = len(args)
		}
	}
	head, command = args[:dash], args[dash:]
	// With interspersed flags off, cobra passes a "--" after the first
	// positional argument through.
	if len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	if len(head) != before {
		return nil, nil, fmt.Errorf("expected %d argument(s) before the command, got %d", before, len(head))
	}
	if len(command) == 0 {
		return nil, nil, fmt.Errorf("no command given (usage: %s)", cmd.Use)
	}
	return head, command, nil
}

func runCmd(g *globals) *cobra.Command {
	var cf createFlags
	var interactive, tty bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Create a sandbox, run a command in it with live output, and remove it",
		Long:  "run exits with the command's exit code; 125 when the sandbox cannot be created.",
		RunE: func(cmd *cobra.Command, args []string) error {
			_, command, err := splitCommand(cmd, args, 0)
			if err != nil {
				return err
			}
			req, err := cf.request()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sb, err := c.Create(ctx, req)
			if err != nil {
				fmt.Fprintln(g.stderr, "paddock: creating sandbox:", oneLine(err))
				return exitError{125}
			}
			defer func() {
				dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := c.Delete(dctx, sb.ID, true); err != nil {
					fmt.Fprintln(g.stderr, "paddock: removing sandbox:", oneLine(err))
				}
			}()
			return runExec(ctx, g, c, sb.ID, command, execOptions{interactive: interactive, tty: tty})
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "stream stdin to the command")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a terminal (raw mode locally)")
	return cmd
}

// execOptions are how the CLI runs one command.
type execOptions struct {
	interactive bool // stream stdin
	tty         bool // on a pseudo-terminal
	env         map[string]string
	cwd         string
	user        string
}

// runExec runs one command and turns its exit into the CLI's exit code.
func runExec(ctx context.Context, g *globals, c *client.Client, id string, command []string, o execOptions) error {
	req := api.ExecRequest{Cmd: command, Env: o.env, Cwd: o.cwd, User: o.user}
	if o.tty {
		req.TTY = localSize()
	}
	s, err := c.ExecStream(ctx, id, req, o.interactive || o.tty)
	if err != nil {
		return err
	}
	defer s.Close()
	return g.follow(ctx, s, o.interactive || o.tty, o.tty)
}

// exitCode turns an exit status into the CLI's exit, saying why on stderr
// when the command did not simply return.
func (g *globals) exitCode(st *api.ExitStatus) error {
	if st.Error != "" {
		fmt.Fprintln(g.stderr, "paddock:", st.Error)
	}
	if st.OOMKilled {
		fmt.Fprintln(g.stderr, "paddock: the command was killed for exceeding the sandbox's memory limit")
	}
	if st.TimedOut {
		fmt.Fprintln(g.stderr, "paddock: the command was killed when its timeout was up")
	}
	if st.ExitCode != 0 {
		code := st.ExitCode
		if code < 0 || code > 255 {
			code = 255
		}
		return exitError{code}
	}
	return nil
}

func createCmd(g *globals) *cobra.Command {
	var cf createFlags
	var file string
	var containers []string
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := cf.request()
			if err != nil {
				return err
			}
			if file != "" {
				if req, err = requestFromFile(file, req); err != nil {
					return err
				}
			}
			for _, c := range containers {
				name, image, ok := strings.Cut(c, "=")
				if !ok || name == "" {
					return fmt.Errorf("--container: %q is not NAME=IMAGE", c)
				}
				req.Containers = append(req.Containers, api.Container{Name: name, Image: image})
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, sb.ID)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "take the request from a YAML (or JSON) file: a sandbox.yaml with containers; flags fill what it leaves unset")
	cmd.Flags().StringArrayVar(&containers, "container", nil, "add a container NAME=IMAGE (the first is the default of exec, files, ps); repeatable")
	return cmd
}

// requestFromFile reads a create request from a sandbox.yaml (the API's
// CreateRequest in YAML, unknown fields refused) and fills what it leaves
// unset from flags'.
func requestFromFile(path string, flags api.CreateRequest) (api.CreateRequest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return flags, err
	}
	var req api.CreateRequest
	if err := yaml.UnmarshalStrict(data, &req); err != nil {
		return flags, fmt.Errorf("%s: %w", path, err)
	}
	if req.Image == "" && len(req.Containers) == 0 {
		req.Image = flags.Image
	}
	if req.Resources == (api.Resources{}) {
		req.Resources = flags.Resources
	}
	if req.TimeoutSeconds == 0 {
		req.TimeoutSeconds, req.OnTimeout = flags.TimeoutSeconds, flags.OnTimeout
	}
	if req.Labels == nil {
		req.Labels = flags.Labels
	}
	if req.Policy == nil {
		req.Policy = flags.Policy
	}
	if req.Runtime == "" {
		req.Runtime = flags.Runtime
	}
	if req.AutoPauseSeconds == 0 {
		req.AutoPauseSeconds = flags.AutoPauseSeconds
	}
	return req, nil
}

func execCmd(g *globals) *cobra.Command {
	var o execOptions
	var env []string
	var detach bool
	var container string
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD [ARG...]",
		Short: "Run a command in a running sandbox; exits with its exit code",
		RunE: func(cmd *cobra.Command, args []string) error {
			head, command, err := splitCommand(cmd, args, 1)
			if err != nil {
				return err
			}
			if o.env, err = keyValues("--env", env); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := client.WithContainer(cmd.Context(), container)
			if detach {
				return startDetached(ctx, g, c, head[0], command, o)
			}
			return runExec(ctx, g, c, head[0], command, o)
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "start the command in the background and print its PID")
	cmd.Flags().BoolVarP(&o.interactive, "interactive", "i", false, "stream stdin to the command")
	cmd.Flags().BoolVarP(&o.tty, "tty", "t", false, "run the command on a terminal (raw mode locally)")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE; repeatable")
	cmd.Flags().StringVarP(&o.cwd, "workdir", "w", "", "working directory inside the sandbox")
	cmd.Flags().StringVarP(&o.user, "user", "u", "", "user to run as inside the sandbox (default root)")
	cmd.Flags().StringVarP(&container, "container", "c", "", "the container to run in (default the sandbox's first)")
	return cmd
}

func lsCmd(g *globals) *cobra.Command {
	var asJSON, quiet bool
	var labels []string
	var state string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lm, err := keyValues("--label", labels)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), client.ListOptions{Labels: lm, State: api.State(state)})
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return writeJSON(g.stdout, list)
			case quiet:
				for _, sb := range list {
					fmt.Fprintln(g.stdout, sb.ID)
				}
				return nil
			}
			groups := false
			for _, sb := range list {
				groups = groups || len(sb.Containers) > 0
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			head := "ID\tIMAGE\tSTATE\tCREATED\tCPUS\tMEMORY\tDISK\tLABELS"
			if groups {
				head += "\tCONTAINERS"
			}
			fmt.Fprintln(tw, head)
			for _, sb := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\t%s", sb.ID, sb.Image, sb.State,
					ago(sb.CreatedAt), sb.Resources.CPUs, formatSize(sb.Resources.MemoryBytes),
					formatSize(sb.Resources.DiskBytes), labelString(sb.Labels))
				if groups {
					fmt.Fprintf(tw, "\t%s", containersString(sb.Containers))
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print ids only")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label KEY=VALUE; repeatable")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (running, stopped, failed)")
	return cmd
}

func ago(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// containersString lists a sandbox's containers as NAME(IMAGE):STATE.
func containersString(cs []api.ContainerStatus) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s(%s):%s", c.Name, c.Image, c.State)
	}
	return strings.Join(parts, ",")
}

func labelString(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID...",
		Short: "Print sandboxes (or snapshots: snap-...) as JSON",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var out []any
			for _, id := range args {
				var v any
				if strings.HasPrefix(id, "snap-") {
					v, err = c.GetSnapshot(cmd.Context(), id)
				} else {
					v, err = c.Get(cmd.Context(), id)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				out = append(out, v)
			}
			if len(out) == 1 {
				return writeJSON(g.stdout, out[0])
			}
			return writeJSON(g.stdout, out)
		},
	}
}

func rmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm [-f] ID...",
		Short: "Remove sandboxes (running ones need -f)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range args {
				if err := c.Delete(cmd.Context(), id, force); err != nil {
					fmt.Fprintf(g.stderr, "paddock: %s: %s\n", id, oneLine(err))
					failed++
					continue
				}
				fmt.Fprintln(g.stdout, id)
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove running sandboxes too")
	return cmd
}

// stateCmds are stop, pause, resume, freeze and thaw: each changes the
// state of the sandboxes named and prints their ids.
func stateCmds(g *globals) []*cobra.Command {
	verbs := []struct {
		use, short string
		call       func(c *client.Client, ctx context.Context, id string) (*api.Sandbox, error)
	}{
		{"stop", "End a sandbox's processes, keeping its files", (*client.Client).Stop},
		{"pause", "Hibernate a sandbox: no processes, memory or CPU; files, environment and limits kept", (*client.Client).Pause},
		{"resume", "Start a paused or stopped sandbox again with the same id (or thaw a frozen one)", (*client.Client).Resume},
		{"archive", "Move a paused sandbox's disk to the object store: resumable on any node, same id", (*client.Client).Archive},
		{"freeze", "Stop a sandbox's processes in place (memory kept): the cheap pause", (*client.Client).Freeze},
		{"thaw", "Let a frozen sandbox's processes run again", (*client.Client).Thaw},
	}
	var cmds []*cobra.Command
	for _, v := range verbs {
		cmds = append(cmds, &cobra.Command{
			Use:   v.use + " ID...",
			Short: v.short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				for _, id := range args {
					if _, err := v.call(c, cmd.Context(), id); err != nil {
						return fmt.Errorf("%s: %w", id, err)
					}
					fmt.Fprintln(g.stdout, id)
				}
				return nil
			},
		})
	}
	return cmds
}
