package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
)

func partitionMergeCmd(g *globals) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "merge TABLE PARTITION",
		Short: "Merge a partition with the next one while they serve",
		Long: "Merge partition PARTITION (its index) of TABLE with partition PARTITION+1 into one, the\n" +
			"inverse of `tabula partition split`. If the two have replicas on different servers, the\n" +
			"master first moves PARTITION+1's replicas onto PARTITION's servers (copying its data) and\n" +
			"hands its primary role to PARTITION's primary's server; then each primary closes its log\n" +
			"with a merge record and every server merges the two engines. The child takes the index\n" +
			"PARTITION; the partitions after it shift down by one. Clients follow and no request fails.\n" +
			"With --wait it returns once the child takes writes, printing the phases on the way.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			idx, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil {
				return fmt.Errorf("partition %q: want its index, a number from 0", args[1])
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			start := time.Now()
			req := &api.MergePartitionsRequest{Tenant: g.tenant, Table: args[0], Index: uint32(idx)}
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.MergePartitionsResponse, error) {
				return mc.MergePartitions(ctx, req)
			})
			if err != nil {
				return fmt.Errorf("merge partitions %s/%d and %d: %w", args[0], idx, idx+1, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "merging partitions %s/%d and %d (ids %d and %d) into id %d (map version %d)\n",
				args[0], idx, idx+1, resp.GetLeftId(), resp.GetRightId(), resp.GetChildId(), resp.GetMapVersion())
			if !wait {
				fmt.Fprintln(out, "`tabula table describe` shows it done (or run with --wait)")
				return nil
			}
			c, err := waitMerge(ctx, g, args[0], resp, out)
			if err != nil {
				return fmt.Errorf("merge partitions %s/%d and %d: %w", args[0], idx, idx+1, err)
			}
			where := fmt.Sprintf("hashes [%#016x, %#016x]", c.GetStart(), c.GetEnd())
			if len(c.GetKeyStart()) > 0 || len(c.GetKeyEnd()) > 0 {
				where = fmt.Sprintf("keys [%q, %q)", c.GetKeyStart(), c.GetKeyEnd())
			}
			fmt.Fprintf(out, "merged in %v: partition %d: id %d, epoch %d, %s, primary %s\n",
				time.Since(start).Round(time.Millisecond), c.GetIndex(), c.GetId(), c.GetEpoch(), where, primaryIDOf(c))
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "return once the child takes writes, showing the progress")
	return cmd
}

// waitMerge follows a merge in the table's map until its child has its
// log, printing each new phase: the alignment's steps (the partitions'
// replicas), the records, the child's log.
func waitMerge(ctx context.Context, g *globals, table string, resp *api.MergePartitionsResponse, out io.Writer) (*api.Partition, error) {
	last := ""
	for {
		m, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.GetPartitionMapResponse, error) {
			return mc.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: g.tenant, Table: table})
		})
		if err != nil {
			return nil, err
		}
		var l, r, c *api.Partition
		for _, p := range m.GetMap().GetPartitions() {
			switch p.GetId() {
			case resp.GetLeftId():
				l = p
			case resp.GetRightId():
				r = p
			case resp.GetChildId():
				c = p
			}
		}
		var line string
		switch {
		case c != nil && c.GetLog().GetExtent() != 0:
			return c, nil
		case c != nil:
			line = "the child is in the map; allocating its log"
		case l == nil || r == nil:
			return nil, fmt.Errorf("partitions %d and %d left the map without their child %d", resp.GetLeftId(), resp.GetRightId(), resp.GetChildId())
		case !sameReplicas(l, r):
			line = fmt.Sprintf("aligning: %d on %s, %d on %s", l.GetId(), replicasLine(l), r.GetId(), replicasLine(r))
		default:
			line = fmt.Sprintf("aligned on %s: merge records and the engines' merge", replicasLine(l))
		}
		if line != last {
			fmt.Fprintln(out, "  "+line)
			last = line
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("still %s: %w", line, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sameReplicas: a and b have replicas on the same servers, the same one
// primary.
func sameReplicas(a, b *api.Partition) bool {
	return replicasLine(a) == replicasLine(b)
}

// replicasLine is p's replica servers, sorted, the primary starred.
func replicasLine(p *api.Partition) string {
	var rs []string
	for _, r := range p.GetReplicas() {
		s := r.GetServerId()
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			s += "*"
		}
		rs = append(rs, s)
	}
	slices.Sort(rs)
	return "[" + strings.Join(rs, " ") + "]"
}

// reshaping describes the pending splits and merges of a table's
// partitions (sorted by index), one line each.
func reshaping(parts []*api.Partition) []string {
	var out []string
	for i, p := range parts {
		if sp := p.GetSplit(); sp != nil {
			out = append(out, fmt.Sprintf("  #%d (id %d): splitting into %d and %d", p.GetIndex(), p.GetId(), sp.GetLeftId(), sp.GetRightId()))
		}
		mg := p.GetMerge()
		if mg == nil || mg.GetLeftId() != p.GetId() || i+1 >= len(parts) {
			continue
		}
		r := parts[i+1]
		state := "aligned: merge records and the engines' merge"
		if !sameReplicas(p, r) {
			state = fmt.Sprintf("aligning (replicas %s and %s)", replicasLine(p), replicasLine(r))
		}
		out = append(out, fmt.Sprintf("  #%d (id %d) and #%d (id %d): merging into %d, %s", p.GetIndex(), p.GetId(), r.GetIndex(), r.GetId(), mg.GetChildId(), state))
	}
	return out
}
