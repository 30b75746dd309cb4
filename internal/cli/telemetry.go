package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

func telemetryCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{statsCmd(g), topCmd(g), eventsCmd(g), inContainer([]*cobra.Command{logsCmd(g)})[0], updateCmd(g)}
}

func statsCmd(g *globals) *cobra.Command {
	var asJSON bool
	var since time.Duration
	var container string
	cmd := &cobra.Command{
		Use:   "stats ID",
		Short: "Print a sandbox's current metrics, each container's share too (with --json, its history)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			opts := client.MetricsOptions{}
			if since > 0 {
				opts.Since = time.Now().Add(-since)
			}
			m, err := c.Metrics(client.WithContainer(cmd.Context(), container), args[0], opts)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, m)
			}
			if m.Current == nil {
				return fmt.Errorf("sandbox %s has not been sampled (it is not running)", args[0])
			}
			printStats(g.stdout, m)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, with the history")
	cmd.Flags().DurationVar(&since, "since", 0, "history to include with --json (default 15m)")
	cmd.Flags().StringVarP(&container, "container", "c", "", "one container's share and history (default the whole sandbox)")
	return cmd
}

func limitString(n int64, format func(int64) string) string {
	if n <= 0 {
		return "unlimited"
	}
	return format(n)
}

func count(n int64) string { return strconv.FormatInt(n, 10) }

func printStats(w io.Writer, m *api.Metrics) {
	s := m.Current
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if m.Container != "" {
		fmt.Fprintf(tw, "container\t%s\t\t\n", m.Container)
	}
	fmt.Fprintf(tw, "cpu\t%.2f s\t%.1f%%\tthrottled %.2f s\n", s.CPUSeconds, s.CPUPercent, s.CPUThrottledSeconds)
	fmt.Fprintf(tw, "memory\t%s\tpeak %s\tlimit %s\n", formatSize(s.MemoryBytes), formatSize(s.MemoryPeakBytes), limitString(s.MemoryLimitBytes, formatSize))
	fmt.Fprintf(tw, "pids\t%d\tlimit %s\t\n", s.Pids, limitString(s.PidsLimit, count))
	fmt.Fprintf(tw, "disk\t%s\tof %s\t\n", formatSize(s.DiskUsedBytes), formatSize(s.DiskBytes))
	if st := m.Storage; st != nil {
		short := ""
		if st.ShortBytes > 0 {
			short = "SHORT " + formatSize(st.ShortBytes) + ": writes may fail"
		}
		fmt.Fprintf(tw, "storage\t%s free\tof %s (host %s free)\t%s\n", formatSize(st.FreeBytes), formatSize(st.SizeBytes), formatSize(st.HostFreeBytes), short)
	}
	fmt.Fprintf(tw, "network\tin %s\tout %s\t\n", formatSize(int64(s.NetRxBytes)), formatSize(int64(s.NetTxBytes)))
	fmt.Fprintf(tw, "egress\t%d allowed\t%d denied\t\n", s.EgressAllowed, s.EgressDenied)
	fmt.Fprintf(tw, "oom kills\t%d\t\t\n", s.OOMKills)
	if m.Budgets != nil {
		for _, b := range m.Budgets.Budgets {
			state := ""
			switch {
			case b.Exceeded:
				state = "EXCEEDED (" + b.Action + ")"
			case b.Warned:
				state = "warned"
			}
			fmt.Fprintf(tw, "budget %s\t%.6g / %.6g\tremaining %.6g\t%s\n", b.Budget, b.Used, b.Limit, b.Remaining, state)
		}
	}
	if m.Autoscale != nil {
		fmt.Fprintf(tw, "autoscale\t%g CPUs\t%s\t\n", m.Autoscale.CPUs, formatSize(m.Autoscale.MemoryBytes))
	}
	tw.Flush()
	if len(s.Containers) > 0 {
		fmt.Fprintln(w)
		printContainerStats(w, s.Containers)
	}
}

// printContainerStats is a table of each container's share.
func printContainerStats(w io.Writer, cs []api.ContainerSample) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONTAINER\tCPU\tCPU%\tMEMORY\tLIMIT\tPIDS\tDISK")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%.2f s\t%.1f%%\t%s\t%s\t%d\t%s\n", c.Name, c.CPUSeconds, c.CPUPercent, formatSize(c.MemoryBytes),
			limitString(c.MemoryLimitBytes, formatSize), c.Pids, formatSize(c.DiskUsedBytes))
	}
	tw.Flush()
}

func topCmd(g *globals) *cobra.Command {
	var once bool
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Show running sandboxes' resource use, refreshing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if every <= 0 {
				return fmt.Errorf("--interval must be positive")
			}
			for {
				list, err := c.AllMetrics(cmd.Context())
				if err != nil {
					return err
				}
				if !once {
					fmt.Fprint(g.stdout, "\x1b[H\x1b[2J") // home, clear
					fmt.Fprintf(g.stdout, "paddock top — %d running — %s\n\n", len(list), time.Now().Format(time.TimeOnly))
				}
				printTop(g.stdout, list)
				if once {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "print once and exit")
	cmd.Flags().DurationVar(&every, "interval", time.Second, "refresh interval")
	return cmd
}

func printTop(w io.Writer, list []api.SandboxSample) {
	sort.Slice(list, func(i, j int) bool {
		if list[i].Sample.CPUPercent != list[j].Sample.CPUPercent {
			return list[i].Sample.CPUPercent > list[j].Sample.CPUPercent
		}
		return list[i].ID < list[j].ID
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCPU%\tCPU S\tMEMORY\tLIMIT\tPIDS\tNET IN\tNET OUT\tDENIED\tOOM")
	for _, l := range list {
		s := l.Sample
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%s\t%s\t%d\t%s\t%s\t%d\t%d\n", l.ID, s.CPUPercent, s.CPUSeconds,
			formatSize(s.MemoryBytes), limitString(s.MemoryLimitBytes, formatSize), s.Pids,
			formatSize(int64(s.NetRxBytes)), formatSize(int64(s.NetTxBytes)), s.EgressDenied, s.OOMKills)
	}
	tw.Flush()
}

func eventsCmd(g *globals) *cobra.Command {
	var follow, asJSON bool
	var types []string
	var after uint64
	cmd := &cobra.Command{
		Use:   "events ID",
		Short: "Print a sandbox's events (lifecycle, exec, oom, limits, policy, budget, ...)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			opts := client.EventOptions{After: after, Types: types}
			print := func(e api.Event) error {
				if asJSON {
					return writeJSONLine(g.stdout, e)
				}
				_, err := fmt.Fprintf(g.stdout, "%s  %-5d %-9s %s\n", e.Time.Local().Format("15:04:05.000"), e.Seq, e.Type, e.Message)
				return err
			}
			if follow {
				err := c.FollowEvents(cmd.Context(), args[0], opts, print)
				if err == context.Canceled {
					return nil
				}
				return err
			}
			opts.Limit = 1000
			evs, err := c.Events(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			for _, e := range evs {
				if err := print(e); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object a line")
	cmd.Flags().StringSliceVar(&types, "type", nil, "only these event types (comma-separated)")
	cmd.Flags().Uint64Var(&after, "after", 0, "only events after this seq")
	return cmd
}

func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

func logsCmd(g *globals) *cobra.Command {
	var pid int
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "List the processes whose output was kept, or print one's output (--exec PID)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if pid == 0 {
				if follow {
					return fmt.Errorf("--follow needs --exec PID")
				}
				logs, err := c.Logs(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
				group := slices.ContainsFunc(logs, func(l api.ExecLog) bool { return l.Container != "" })
				if group {
					fmt.Fprint(tw, "CONTAINER\t")
				}
				fmt.Fprintln(tw, "PID\tSTARTED\tEXIT\tBYTES\tCOMMAND")
				for _, l := range logs {
					exit := "running"
					if l.Exit != nil {
						exit = strconv.Itoa(l.Exit.ExitCode)
						if l.Exit.Signal != "" {
							exit = l.Exit.Signal
						}
					}
					if group {
						fmt.Fprint(tw, cmp.Or(l.Container, "(first)")+"\t")
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\n", l.PID, ago(l.StartedAt), exit, l.End-l.Start, strings.Join(l.Cmd, " "))
				}
				return tw.Flush()
			}
			s, err := c.Log(cmd.Context(), args[0], pid, client.LogOptions{Follow: follow})
			if err != nil {
				return err
			}
			defer s.Close()
			_, err = s.Wait(g.stdout, g.stderr)
			return err
		},
	}
	cmd.Flags().IntVar(&pid, "exec", 0, "print the output of this process")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "with --exec, keep printing until the process ends")
	return cmd
}

// elasticFlags are the autoscale range and the budget, shared by create,
// run and update.
type elasticFlags struct {
	minMem, maxMem   string
	minCPUs, maxCPUs float64
	bud              api.Budget
}

func (e *elasticFlags) register(f *pflag.FlagSet) {
	f.StringVar(&e.minMem, "autoscale-min-memory", "", "autoscale: smallest memory limit")
	f.StringVar(&e.maxMem, "autoscale-max-memory", "", "autoscale: largest memory limit")
	f.Float64Var(&e.minCPUs, "autoscale-min-cpus", 0, "autoscale: smallest CPU limit")
	f.Float64Var(&e.maxCPUs, "autoscale-max-cpus", 0, "autoscale: largest CPU limit")
	f.Float64Var(&e.bud.CPUSeconds, "budget-cpu-seconds", 0, "budget: CPU-seconds (replaces the whole budget)")
	f.Int64Var(&e.bud.WallSeconds, "budget-wall-seconds", 0, "budget: seconds since the sandbox was created")
	f.Int64Var(&e.bud.EgressBytes, "budget-egress-bytes", 0, "budget: bytes through the egress proxy, both ways")
	f.Int64Var(&e.bud.EgressRequests, "budget-egress-requests", 0, "budget: requests through the egress proxy")
	f.Float64Var(&e.bud.Cost, "budget-cost", 0, "budget: cost from the daemon's prices")
	f.Float64Var(&e.bud.WarnAt, "budget-warn-at", 0, "budget: fraction at which a warning event fires (default 0.8)")
	f.StringVar(&e.bud.Action, "budget-action", "", "budget: pause (default), kill, cut_network or none")
}

// values returns the autoscale range and budget the flags give, nil for
// those not given.
func (e *elasticFlags) values() (*api.Autoscale, *api.Budget, error) {
	var a *api.Autoscale
	var err error
	if e.minMem != "" || e.maxMem != "" || e.minCPUs != 0 || e.maxCPUs != 0 {
		a = &api.Autoscale{MinCPUs: e.minCPUs, MaxCPUs: e.maxCPUs}
		if e.minMem != "" {
			if a.MinMemoryBytes, err = parseSize(e.minMem); err != nil {
				return nil, nil, fmt.Errorf("--autoscale-min-memory: %w", err)
			}
		}
		if e.maxMem != "" {
			if a.MaxMemoryBytes, err = parseSize(e.maxMem); err != nil {
				return nil, nil, fmt.Errorf("--autoscale-max-memory: %w", err)
			}
		}
	}
	var b *api.Budget
	if e.bud != (api.Budget{}) {
		bud := e.bud
		b = &bud
	}
	return a, b, nil
}

func updateCmd(g *globals) *cobra.Command {
	var memory string
	var cpus float64
	var pids int64
	var el elasticFlags
	cmd := &cobra.Command{
		Use:   "update ID",
		Short: "Change a running sandbox's limits in place (and its autoscale range or budget)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.UpdateRequest
			var err error
			if memory != "" {
				if req.Resources.MemoryBytes, err = parseSize(memory); err != nil {
					return fmt.Errorf("--memory: %w", err)
				}
			}
			req.Resources.CPUs, req.Resources.Pids = cpus, pids
			if req.Autoscale, req.Budget, err = el.values(); err != nil {
				return err
			}
			if req.Resources == (api.Resources{}) && req.Autoscale == nil && req.Budget == nil {
				return fmt.Errorf("nothing to change: give --memory, --cpus, --pids, an --autoscale-* bound or a --budget-*")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Update(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s: %g CPUs, %s memory, %d pids\n", sb.ID, sb.Resources.CPUs, formatSize(sb.Resources.MemoryBytes), sb.Resources.Pids)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&memory, "memory", "m", "", "memory limit, e.g. 4g")
	f.Float64Var(&cpus, "cpus", 0, "CPU limit in cores, e.g. 2 or 0.5")
	f.Int64Var(&pids, "pids", 0, "process and thread limit")
	el.register(f)
	return cmd
}
