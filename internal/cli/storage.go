package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// snapshotCmd is `paddock snapshot ID [--path DIR | --memory]` with ls
// and rm.
func snapshotCmd(g *globals) *cobra.Command {
	var path, container string
	var labels []string
	var verbose, memory bool
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Capture a running sandbox's files (or one directory) and print the snapshot id",
		Long: "Capture a sandbox's filesystem without stopping it: its processes are frozen only for\n" +
			"the moment of the copy. With --path, capture one directory (a directory snapshot),\n" +
			"which other sandboxes can mount with --volume SNAPSHOT:/path. With --memory (a gvisor\n" +
			"sandbox), checkpoint its processes too: create --from the snapshot starts copies of them.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lm, err := keyValues("--label", labels)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Snapshot(client.WithContainer(cmd.Context(), container), args[0], api.SnapshotRequest{Path: path, Labels: lm, Memory: memory})
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, s.ID)
			if verbose {
				fmt.Fprintf(g.stderr, "frozen %.1f ms, total %.1f ms, shared %v%s\n", s.FrozenMS, s.TotalMS, s.Shared, memoryNote(s.Memory))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "path", "", "capture only this directory of the sandbox")
	cmd.Flags().StringVarP(&container, "container", "c", "", "with --path, the container whose directory to capture (default the sandbox's first)")
	cmd.Flags().BoolVar(&memory, "memory", false, "checkpoint the sandbox's processes too (gvisor runtime)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE; repeatable")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "report the freeze window on stderr")

	var sandbox string
	ls := listCmd(g, listing[api.Snapshot]{
		short:  "List snapshots",
		fetch:  func(c *client.Client, ctx context.Context) ([]api.Snapshot, error) { return c.Snapshots(ctx, sandbox) },
		key:    func(s api.Snapshot) string { return s.ID },
		header: "ID\tSANDBOX\tPATH\tIMAGE\tCREATED\tSIZE\tDATA\tMEMORY\tFROZEN\tUSED BY",
		row: func(s api.Snapshot) string {
			mem := "-"
			if s.Memory != nil {
				mem = formatSize(s.Memory.CheckpointBytes)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1fms\t%d", s.ID, s.Sandbox, s.Path, s.Image,
				ago(s.CreatedAt), formatSize(s.SizeBytes), formatSize(s.AllocatedBytes), mem, s.FrozenMS, len(s.UsedBy))
		},
	})
	ls.Flags().StringVar(&sandbox, "sandbox", "", "only snapshots of this sandbox")
	rm := removeCmd(g, "rm SNAPSHOT...", "Remove snapshots that nothing uses", (*client.Client).DeleteSnapshot)
	cmd.AddCommand(ls, rm)
	return cmd
}

// forkCmd is `paddock fork ID [-n N]`.
func forkCmd(g *globals) *cobra.Command {
	var n int
	var labels []string
	var copyVolumes, verbose, memory bool
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Copy a running sandbox N times and print the new ids",
		Long: "Copy a sandbox N times: each copy has its own disk, id and network. On a runtime that\n" +
			"keeps memory (gvisor) the copies keep its processes running (one checkpoint restored N\n" +
			"times); --memory=false starts them afresh from its files, as on native.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lm, err := keyValues("--label", labels)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			req := api.ForkRequest{Count: n, Labels: lm, CopyVolumes: copyVolumes}
			if cmd.Flags().Changed("memory") {
				req.Memory = &memory
			}
			res, err := c.Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			for _, sb := range res.Sandboxes {
				fmt.Fprintln(g.stdout, sb.ID)
			}
			if verbose {
				fmt.Fprintf(g.stderr, "frozen %.1f ms, total %.1f ms, shared %v%s\n", res.FrozenMS, res.TotalMS, res.Shared, memoryNote(res.Memory))
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "how many copies")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE for the copies; repeatable")
	cmd.Flags().BoolVar(&copyVolumes, "copy-volumes", false, "give each copy its own copy of the volumes (default: shared)")
	cmd.Flags().BoolVar(&verbose, "verbose", false, "report the freeze window on stderr")
	cmd.Flags().BoolVar(&memory, "memory", false, "keep the processes (default: where the runtime keeps memory)")
	return cmd
}

// memoryNote describes a memory checkpoint for --verbose.
func memoryNote(m *api.SnapshotMemory) string {
	if m == nil {
		return ""
	}
	return fmt.Sprintf(", memory checkpoint %s of %s", formatSize(m.CheckpointBytes), formatSize(m.MemoryBytes))
}

// volumeCmd is `paddock volume create|ls|rm|inspect`.
func volumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage named volumes, mounted into sandboxes with --volume NAME:/path[:ro]",
	}
	var size, fromSnap string
	var labels []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.VolumeRequest{Name: args[0], FromSnapshot: fromSnap}
			var err error
			if size != "" {
				if req.SizeBytes, err = parseSize(size); err != nil {
					return fmt.Errorf("--size: %w", err)
				}
			}
			if req.Labels, err = keyValues("--label", labels); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, v.Name)
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "", "size cap, e.g. 5g (default: the daemon's disk size)")
	create.Flags().StringVar(&fromSnap, "from-snapshot", "", "fill it with a directory snapshot's files")
	create.Flags().StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE; repeatable")

	ls := listCmd(g, listing[api.Volume]{
		short:  "List volumes",
		fetch:  (*client.Client).Volumes,
		key:    func(v api.Volume) string { return v.Name },
		header: "NAME\tSIZE\tUSED\tCREATED\tMOUNTED BY\tLABELS",
		row: func(v api.Volume) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s", v.Name, formatSize(v.SizeBytes), formatSize(v.UsedBytes),
				ago(v.CreatedAt), len(v.UsedBy), labelString(v.Labels))
		},
	})
	rm := removeCmd(g, "rm NAME...", "Remove volumes that no sandbox mounts", (*client.Client).DeleteVolume)
	inspect := &cobra.Command{
		Use:   "inspect NAME...",
		Short: "Print volumes as JSON",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var out []*api.Volume
			for _, n := range args {
				v, err := c.GetVolume(cmd.Context(), n)
				if err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
				out = append(out, v)
			}
			return writeJSON(g.stdout, out)
		},
	}
	cmd.AddCommand(create, ls, rm, inspect)
	return cmd
}
