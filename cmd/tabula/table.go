package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tabuladb/tabula/api"
)

func tableCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "table", Short: "Create, list, describe, alter and drop tables"}
	cmd.AddCommand(tableCreateCmd(g), tableListCmd(g), tableDescribeCmd(g), tableDropCmd(g), tableClearLossCmd(g), tableAlterCmd(g))
	return cmd
}

// tableClearLossCmd acknowledges a recorded data loss (OpClearDataLoss).
func tableClearLossCmd(g *globals) *cobra.Command {
	var partition uint64
	cmd := &cobra.Command{
		Use:   "clear-data-loss NAME",
		Short: "Acknowledge that partitions of a table lost their data (operator)",
		Long: "Acknowledge that partitions of a table lost every copy of their data (a server forgotten with --accept-data-loss): " +
			"they stop answering DATA_LOSS for keys they do not hold and serve what was written since. " +
			"The loss stays in the server's log and the master's events; `tabula table describe` stops listing it. Needs the cluster credential.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.ClearDataLossResponse, error) {
				return mc.ClearDataLoss(ctx, &api.ClearDataLossRequest{Tenant: g.tenant, Table: args[0], PartitionId: partition})
			})
			if err != nil {
				return fmt.Errorf("clear the data loss of table %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			if len(resp.GetCleared()) == 0 {
				fmt.Fprintf(out, "table %s/%s: no partition has a data loss to clear\n", g.tenant, args[0])
				return nil
			}
			ids := make([]string, len(resp.GetCleared()))
			for i, id := range resp.GetCleared() {
				ids[i] = fmt.Sprint(id)
			}
			fmt.Fprintf(out, "table %s/%s: data loss acknowledged for partition(s) %s; they serve what they hold\n", g.tenant, args[0], strings.Join(ids, ", "))
			return nil
		},
	}
	cmd.Flags().Uint64Var(&partition, "partition", 0, "partition id to clear (default: every partition of the table that lost its data)")
	return cmd
}

func tableCreateCmd(g *globals) *cobra.Command {
	var (
		kind       string
		opts       api.TableOptions
		defaultTTL time.Duration
		splits     []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a table",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := api.ParseKind(kind)
			if err != nil {
				return fmt.Errorf("--kind: %w", err)
			}
			switch {
			case k == api.TableKind_TABLE_KIND_ORDERED:
				if cmd.Flags().Changed("partitions") {
					return fmt.Errorf("--partitions: an ordered table is partitioned by key range: give --split-points (N points make N+1 partitions)")
				}
				opts.Partitions = 0
				for _, sp := range splits {
					opts.SplitPoints = append(opts.SplitPoints, []byte(sp))
				}
			case len(splits) > 0:
				return fmt.Errorf("--split-points: only ordered tables are partitioned by key range (%s tables by key hash: --partitions)", kind)
			case opts.Partitions == 0 || opts.Partitions > api.MaxPartitions:
				return fmt.Errorf("--partitions %d: want 1 to %d", opts.Partitions, api.MaxPartitions)
			}
			if defaultTTL < 0 {
				return fmt.Errorf("--default-ttl %v is negative", defaultTTL)
			}
			opts.DefaultTtlMs = uint64(defaultTTL.Milliseconds())
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			m, err := c.CreateTable(ctx, args[0], k, &opts)
			if err != nil {
				return fmt.Errorf("create table %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created table %s/%s (id %d, kind %s, %d partitions)\n",
				m.GetTable().GetTenant(), m.GetTable().GetName(), m.GetTable().GetId(), api.KindName(k), len(m.GetPartitions()))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "point", "table kind: point (online reads and writes), ordered (reads and writes, keys kept in order: range scans) or bulk (published in versions with tabula bulk)")
	f.StringSliceVar(&splits, "split-points", nil, "ordered tables: keys where one partition ends and the next begins, in increasing order, comma-separated (none: one partition)")
	f.Uint32Var(&opts.Partitions, "partitions", api.DefaultPartitions, fmt.Sprintf("number of partitions (1..%d)", api.MaxPartitions))
	f.Uint32Var(&opts.Replication, "replicas", 0, "copies of each partition, 1-5, each in its own fault domain, so at most the number of fault domains of live servers (default: 3 for point tables, or as many as the live servers' fault domains when fewer; bulk tables serve 1)")
	f.Uint32Var(&opts.Replication, "replication", 0, "same as --replicas")
	_ = f.MarkHidden("replication")
	f.Uint64Var(&opts.MaxValueBytes, "max-value-bytes", api.DefaultMaxValueBytes, fmt.Sprintf("largest value accepted (at most %d)", api.MaxValueBytesLimit))
	f.DurationVar(&defaultTTL, "default-ttl", 0, "TTL of writes that give none (0: never expire)")
	f.StringVar(&opts.Storage, "storage", "", "storage of point tables: ssd (default: the disk store, durable) or memory")
	f.Uint32Var(&opts.BulkRetainedVersions, "retain", 0, "bulk tables: versions kept loaded for rollback, the serving one included (default 2, at most 8)")
	f.StringVar(&opts.Compression, "compression", "", "ssd tables: none (default) or s2 (compress values of 64 bytes or more)")
	f.StringVar(&opts.Durability, "durability", "", "ssd tables: sync (default: acknowledged once on disk) or lazy (acknowledged at once; a crash can lose the last ~50 ms of writes)")
	splitSettingFlags(f, &opts)
	return cmd
}

// splitSettingFlags are the automatic split settings of table create and
// alter (0: the cluster's, tabula master --split-size and the like).
func splitSettingFlags(f *pflag.FlagSet, o *api.TableOptions) {
	f.Uint32Var(&o.MinPartitions, "min-partitions", 0, "point and ordered tables: merges never take the table below this many partitions (0: no minimum)")
	f.Uint32Var(&o.MaxPartitions, "max-partitions", 0, fmt.Sprintf("point and ordered tables: automatic splits stop at this many partitions (0: the master's --max-table-partitions, 256; at most %d)", api.MaxPartitions))
	f.Uint64Var(&o.SplitSizeBytes, "split-size", 0, "point and ordered tables: split a partition once it holds this many bytes (0: the master's --split-size, 512 MiB)")
	f.Uint64Var(&o.SplitQps, "split-qps", 0, "point and ordered tables: split a partition whose reads+writes per second stay over this (0: the master's --split-qps, 2500)")
}

func tableAlterCmd(g *globals) *cobra.Command {
	var opts api.TableOptions
	cmd := &cobra.Command{
		Use:   "alter NAME",
		Short: "Change a live table's split settings",
		Long: "Change a live table's automatic split settings: the flags given change, the others stay " +
			"(0 returns a setting to the cluster's). Bulk tables take none (they do not split).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &api.AlterTableRequest{Tenant: g.tenant, Table: args[0]}
			fl := cmd.Flags()
			if fl.Changed("min-partitions") {
				req.MinPartitions = &opts.MinPartitions
			}
			if fl.Changed("max-partitions") {
				req.MaxPartitions = &opts.MaxPartitions
			}
			if fl.Changed("split-size") {
				req.SplitSizeBytes = &opts.SplitSizeBytes
			}
			if fl.Changed("split-qps") {
				req.SplitQps = &opts.SplitQps
			}
			if req.MinPartitions == nil && req.MaxPartitions == nil && req.SplitSizeBytes == nil && req.SplitQps == nil {
				return fmt.Errorf("nothing to change: give --min-partitions, --max-partitions, --split-size or --split-qps")
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.AlterTableResponse, error) {
				return mc.AlterTable(ctx, req)
			})
			if err != nil {
				return fmt.Errorf("alter table %s: %w", args[0], err)
			}
			t := resp.GetTable()
			fmt.Fprintf(cmd.OutOrStdout(), "altered table %s/%s: %s\n", t.GetTenant(), t.GetName(), splitSettingsLine(t.GetOptions()))
			return nil
		},
	}
	splitSettingFlags(cmd.Flags(), &opts)
	return cmd
}

// splitSettingsLine says a table's split settings in words.
func splitSettingsLine(o *api.TableOptions) string {
	or := func(v uint64, unit string) string {
		if v == 0 {
			return "the cluster's"
		}
		return fmt.Sprintf("%d%s", v, unit)
	}
	lo := "none"
	if o.GetMinPartitions() > 0 {
		lo = fmt.Sprint(o.GetMinPartitions())
	}
	return fmt.Sprintf("min partitions %s, max partitions %s, split at %s or %s", lo, or(uint64(o.GetMaxPartitions()), ""),
		or(o.GetSplitSizeBytes(), " bytes"), or(o.GetSplitQps(), " reads+writes/s"))
}

func tableListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the tenant's tables",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			tables, err := c.ListTables(ctx)
			if err != nil {
				return fmt.Errorf("list tables: %w", err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tKIND\tPARTITIONS\tSTORAGE\tID")
			for _, t := range tables {
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\n", t.GetName(), api.KindName(t.GetKind()), t.GetOptions().GetPartitions(), t.GetOptions().GetStorage(), t.GetId())
			}
			return w.Flush()
		},
	}
}

func tableDescribeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "describe NAME",
		Short: "Show a table's options, partitions and where they are served",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.DescribeTable(ctx, args[0])
			if err != nil {
				return fmt.Errorf("describe table %s: %w", args[0], err)
			}
			t, o := d.GetMap().GetTable(), d.GetMap().GetTable().GetOptions()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "table        %s/%s (id %d)\n", t.GetTenant(), t.GetName(), t.GetId())
			fmt.Fprintf(out, "kind         %s\nstorage      %s\n", api.KindName(t.GetKind()), o.GetStorage())
			if c := o.GetCompression(); c != "" {
				fmt.Fprintf(out, "compression  %s\n", c)
			}
			if d := o.GetDurability(); d != "" {
				fmt.Fprintf(out, "durability   %s\n", d)
			}
			fmt.Fprintf(out, "partitions   %d\nreplication  %d\n", o.GetPartitions(), o.GetReplication())
			if t.GetKind() != api.TableKind_TABLE_KIND_BULK {
				fmt.Fprintf(out, "splits       %s\n", splitSettingsLine(o))
			}
			if b := d.GetMap().GetBulk(); t.GetKind() == api.TableKind_TABLE_KIND_BULK {
				fmt.Fprintf(out, "version      %d serving, %d retained (keeps %d)\n", b.GetCurrent(), len(b.GetVersions()), o.GetBulkRetainedVersions())
			}
			fmt.Fprintf(out, "max value    %d bytes\ndefault TTL  %v\ncreated      %s\nmap version  %d\n\n",
				o.GetMaxValueBytes(), time.Duration(o.GetDefaultTtlMs())*time.Millisecond, time.UnixMilli(t.GetCreatedUnixMs()).UTC().Format(time.RFC3339), d.GetMap().GetVersion())
			down := map[string]bool{}
			if servers, err := c.ListServers(ctx); err == nil {
				for _, s := range servers {
					down[s.GetId()] = !s.GetAlive()
				}
			}
			// The primary's report counts the partition; every replica's
			// says how far it has applied the log.
			status := map[uint64]*api.ReplicaStatus{}
			replicaStatus := map[string]*api.ReplicaStatus{} // partition/server
			for _, s := range d.GetReplicas() {
				replicaStatus[fmt.Sprintf("%d/%s", s.GetPartitionId(), s.GetServerId())] = s
				if s.GetRole() != api.ReplicaRole_REPLICA_ROLE_SECONDARY || status[s.GetPartitionId()] == nil {
					status[s.GetPartitionId()] = s
				}
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			rangeCol := "HASH RANGE"
			if t.GetKind() == api.TableKind_TABLE_KIND_ORDERED {
				rangeCol = "KEY RANGE"
			}
			fmt.Fprintln(w, "#\tID\t"+rangeCol+"\tEPOCH\tPRIMARY\tADDR\tLSN\tSECONDARIES (applied LSN, state, lag)\tKEYS\tBYTES\tREADS/S\tWRITES/S")
			var short []string // under-replicated partitions, and why
			parts := d.GetMap().GetPartitions()
			sort.Slice(parts, func(i, j int) bool { return parts[i].GetIndex() < parts[j].GetIndex() })
			var keys, bytes, live, garbage, segments, hits, misses uint64
			var readRate, writeRate float64 // smoothed by the master (ReplicaStatus.load)
			for _, p := range parts {
				srv, addr := "(unplaced)", "-"
				for _, r := range p.GetReplicas() {
					if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
						srv, addr = r.GetServerId(), r.GetAddr()
						if down[srv] {
							srv += " (down)"
						}
					}
				}
				st := status[p.GetId()]
				keys += st.GetKeys()
				bytes += st.GetBytes()
				live += st.GetLiveBytes()
				garbage += st.GetGarbageBytes()
				segments += st.GetSegments()
				hits += st.GetCacheHits()
				misses += st.GetCacheMisses()
				var secs, why []string
				inSync := 0
				// Reads: every replica's (read_any reads go to
				// secondaries); writes: the primary's (every replica
				// applies them).
				var reads float64
				for _, r := range p.GetReplicas() {
					reads += replicaStatus[fmt.Sprintf("%d/%s", p.GetId(), r.GetServerId())].GetLoad().GetReadsPerSec()
				}
				writes := st.GetLoad().GetWritesPerSec()
				readRate += reads
				writeRate += writes
				for _, r := range p.GetReplicas() {
					rs := replicaStatus[fmt.Sprintf("%d/%s", p.GetId(), r.GetServerId())]
					if js := rs.GetSync(); js.GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC {
						inSync++
					} else if js != nil {
						why = append(why, r.GetServerId()+": "+js.GetReason())
					} else if p.GetLog() != nil {
						why = append(why, r.GetServerId()+": no report")
					}
					if r.GetRole() != api.ReplicaRole_REPLICA_ROLE_SECONDARY {
						continue
					}
					s := r.GetServerId()
					switch {
					case down[s]:
						s += " (down)"
					case rs == nil:
						s += " (no report)"
					case rs.GetSync() != nil:
						s += " " + replicaSync(rs)
					default:
						s += " " + replicaProgress(rs)
					}
					secs = append(secs, s)
				}
				if rf := int(o.GetReplication()); p.GetLog() != nil && inSync < rf && len(d.GetReplicas()) > 0 && d.GetReplicas()[0].GetSync() != nil {
					short = append(short, fmt.Sprintf("  #%d (id %d): %d of %d replicas in sync: %s", p.GetIndex(), p.GetId(), inSync, rf, strings.Join(why, "; ")))
				}
				if len(secs) == 0 {
					secs = []string{"-"}
				}
				lsn := "-"
				if p.GetLog() != nil && st != nil {
					lsn = fmt.Sprint(st.GetAppliedLsn())
				}
				rng := fmt.Sprintf("%016x-%016x", p.GetStart(), p.GetEnd())
				if t.GetKind() == api.TableKind_TABLE_KIND_ORDERED {
					end := printable(p.GetKeyEnd())
					if len(p.GetKeyEnd()) == 0 {
						end = "(end)"
					}
					rng = "[" + printable(p.GetKeyStart()) + ", " + end + ")"
				}
				fmt.Fprintf(w, "%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%.1f\t%.1f\n", p.GetIndex(), p.GetId(), rng, p.GetEpoch(), srv, addr, lsn, strings.Join(secs, ", "), st.GetKeys(), st.GetBytes(), reads, writes)
			}
			fmt.Fprintf(w, "total\t\t\t\t\t\t\t\t%d\t%d\t%.1f\t%.1f\n", keys, bytes, readRate, writeRate)
			if err := w.Flush(); err != nil {
				return err
			}
			printSplitNotes(out, t, parts, status)
			if lines := reshaping(parts); len(lines) > 0 {
				fmt.Fprintf(out, "\nSPLITS AND MERGES IN PROGRESS\n%s\n", strings.Join(lines, "\n"))
			}
			if len(short) > 0 {
				fmt.Fprintf(out, "\nUNDER-REPLICATED  %d partition(s) have fewer in-sync replicas (in the log's ack set, within the master's in-sync bound, default 1s) than the replication factor:\n%s\n", len(short), strings.Join(short, "\n"))
			}
			var lost *api.ListDataLossResponse
			err = g.masterCall(ctx, func(mc api.MasterClient) error {
				var err error
				lost, err = mc.ListDataLoss(ctx, &api.ListDataLossRequest{Tenant: t.GetTenant(), Table: t.GetName()})
				return err
			})
			if err != nil && api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNIMPLEMENTED { // an older master keeps no such record
				return fmt.Errorf("describe table %s: list data loss: %w", args[0], err)
			}
			if l := lost.GetLost(); len(l) > 0 {
				fmt.Fprintf(out, "\nDATA LOST    %d partition(s) lost every copy (an operator forgot the server with --accept-data-loss) and started again EMPTY:\n", len(l))
				if err := printLost(out, l); err != nil {
					return err
				}
			}
			if o.GetStorage() != "memory" {
				rate := "-"
				if hits+misses > 0 {
					rate = fmt.Sprintf("%.1f%%", 100*float64(hits)/float64(hits+misses))
				}
				fmt.Fprintf(out, "\ndisk         %d live bytes, %d garbage bytes, %d segments, cache hit rate %s\n", live, garbage, segments, rate)
			}
			return nil
		},
	}
}

func tableDropCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "drop NAME",
		Short: "Drop a table and all its data",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.DropTable(ctx, args[0]); err != nil {
				return fmt.Errorf("drop table %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dropped table %s/%s\n", g.tenant, args[0])
			return nil
		},
	}
}

// replicaProgress is a secondary's applied LSN, or where it is in joining
// its partition: copying (with bytes copied of the source's estimate) or
// catching up (applied LSN and how far it is behind the commit point).
func replicaProgress(rs *api.ReplicaStatus) string {
	switch rs.GetState() {
	case api.ReplicaState_REPLICA_STATE_COPYING:
		s := fmt.Sprintf("copying %s", humanBytes(rs.GetCopiedBytes()))
		if t := rs.GetCopyTotalBytes(); t > 0 {
			s += fmt.Sprintf(" of ~%s (%d%%)", humanBytes(t), min(100, rs.GetCopiedBytes()*100/t))
		}
		return "(" + s + ")"
	case api.ReplicaState_REPLICA_STATE_FAILED:
		return "(FAILED: being replaced)"
	case api.ReplicaState_REPLICA_STATE_CATCHING_UP:
		lag := uint64(0)
		if rs.GetCommitLsn() > rs.GetAppliedLsn() {
			lag = rs.GetCommitLsn() - rs.GetAppliedLsn()
		}
		return fmt.Sprintf("%d (catching up, %d behind)", rs.GetAppliedLsn(), lag)
	}
	return fmt.Sprint(rs.GetAppliedLsn())
}

// replicaSync is a replicated partition's replica as the master judged
// it (ReplicaSync): its applied LSN, state and lag in records and time.
func replicaSync(rs *api.ReplicaStatus) string {
	js := rs.GetSync()
	state := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(js.GetState().String(), "REPLICA_STATE_"), "_", " "))
	switch js.GetState() {
	case api.ReplicaState_REPLICA_STATE_COPYING, api.ReplicaState_REPLICA_STATE_FAILED:
		return replicaProgress(rs)
	case api.ReplicaState_REPLICA_STATE_DROPPED, api.ReplicaState_REPLICA_STATE_UNSPECIFIED:
		state = strings.ToUpper(state)
		if js.GetState() == api.ReplicaState_REPLICA_STATE_UNSPECIFIED {
			state = "NOT REPORTED"
		}
	}
	lag := "never in step"
	if ms := js.GetLagMs(); ms >= 0 {
		lag = (time.Duration(ms) * time.Millisecond).String()
	}
	return fmt.Sprintf("%d (%s, %d rec, %s)", rs.GetAppliedLsn(), state, js.GetLagRecords(), lag)
}

// humanBytes is n in B, KiB, MiB or GiB.
func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// printSplitNotes lists, per partition, the split points its primary
// reports (by load, by size) and, for a split's child, why and when it
// was made.
func printSplitNotes(out io.Writer, t *api.Table, parts []*api.Partition, status map[uint64]*api.ReplicaStatus) {
	point := func(h *api.SplitHint) string {
		if t.GetKind() == api.TableKind_TABLE_KIND_ORDERED {
			return "key " + printable(h.GetKey())
		}
		return fmt.Sprintf("hash %016x", h.GetHash())
	}
	var lines []string
	for _, p := range parts {
		var notes []string
		st := status[p.GetId()]
		if h := st.GetLoadSplit(); h != nil {
			notes = append(notes, fmt.Sprintf("load halves at %s (%.0f%% left of it, %d samples)", point(h), 100*h.GetLeftShare(), h.GetSamples()))
		}
		if h := st.GetSizeSplit(); h != nil {
			notes = append(notes, fmt.Sprintf("data halves at %s (%.0f%% left of it, from %d files)", point(h), 100*h.GetLeftShare(), h.GetSamples()))
		}
		if p.GetSplitFrom() != 0 && p.GetSplitUnixMs() != 0 {
			by := "an operator"
			if r := p.GetSplitReason(); r != "" {
				by = r
			}
			notes = append(notes, fmt.Sprintf("split from %d by %s at %s", p.GetSplitFrom(), by, time.UnixMilli(p.GetSplitUnixMs()).UTC().Format(time.RFC3339)))
		}
		if len(notes) > 0 {
			lines = append(lines, fmt.Sprintf("  #%d (id %d): %s", p.GetIndex(), p.GetId(), strings.Join(notes, "; ")))
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(out, "\nSPLITS\n%s\n", strings.Join(lines, "\n"))
	}
}
