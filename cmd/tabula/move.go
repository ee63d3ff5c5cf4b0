package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
)

func partitionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "partition", Short: "Operate on one partition of a table"}
	cmd.AddCommand(partitionMoveCmd(g))
	cmd.AddCommand(partitionSplitCmd(g))
	cmd.AddCommand(partitionMergeCmd(g))
	return cmd
}

func partitionSplitCmd(g *globals) *cobra.Command {
	var at string
	var nowait bool
	cmd := &cobra.Command{
		Use:   "split TABLE PARTITION",
		Short: "Split a partition in two while it serves",
		Long: "Split partition PARTITION (its index) of TABLE in two, copying no data: a point table's\n" +
			"partition at the midpoint of its hash range, or at --at HASH (decimal or 0x hex); an ordered\n" +
			"table's at --at KEY (required). The children take the indexes PARTITION and PARTITION+1; the\n" +
			"partitions after it shift by one. Clients follow within a second and no request fails. It\n" +
			"returns once both children take writes, and prints them and the time it took.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			idx, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil {
				return fmt.Errorf("partition %q: want its index, a number from 0", args[1])
			}
			req := &api.SplitPartitionRequest{Tenant: g.tenant, Table: args[0], Index: uint32(idx), Wait: !nowait}
			if at != "" {
				req.Key = []byte(at)
				if h, err := strconv.ParseUint(at, 0, 64); err == nil {
					req.Hash = h
				}
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			start := time.Now()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.SplitPartitionResponse, error) {
				return mc.SplitPartition(ctx, req)
			})
			if err != nil {
				return fmt.Errorf("split partition %s/%d: %w", args[0], idx, err)
			}
			out := cmd.OutOrStdout()
			if !resp.GetDone() {
				fmt.Fprintf(out, "splitting partition %s/%d (id %d) into %d and %d (map version %d); `tabula table describe` shows it done\n",
					args[0], idx, resp.GetParentId(), resp.GetLeft().GetId(), resp.GetRight().GetId(), resp.GetMapVersion())
				return nil
			}
			fmt.Fprintf(out, "split partition %s/%d (id %d) in %v (map version %d):\n", args[0], idx, resp.GetParentId(), time.Since(start).Round(time.Millisecond), resp.GetMapVersion())
			for _, p := range []*api.Partition{resp.GetLeft(), resp.GetRight()} {
				where := fmt.Sprintf("hashes [%#016x, %#016x]", p.GetStart(), p.GetEnd())
				if len(p.GetKeyStart()) > 0 || len(p.GetKeyEnd()) > 0 {
					where = fmt.Sprintf("keys [%q, %q)", p.GetKeyStart(), p.GetKeyEnd())
				}
				fmt.Fprintf(out, "  partition %d: id %d, epoch %d, %s, primary %s\n", p.GetIndex(), p.GetId(), p.GetEpoch(), where, primaryIDOf(p))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&at, "at", "", "the split point: a hash for point tables (default: the midpoint), a key for ordered tables")
	cmd.Flags().BoolVar(&nowait, "no-wait", false, "return once the split has started")
	return cmd
}

func primaryIDOf(p *api.Partition) string {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r.GetServerId()
		}
	}
	return "none"
}

func partitionMoveCmd(g *globals) *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "move TABLE PARTITION",
		Short: "Move a replica of a partition to another server, with its data",
		Long: "Move one replica of partition PARTITION (its index) of TABLE to another server: the target\n" +
			"is added, copies the data and catches up, takes the primary role if the moving replica had it,\n" +
			"then the old replica leaves. No request fails. It returns once the move has started;\n" +
			"`tabula table describe` shows the target copying, catching up, then the move done.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			idx, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil {
				return fmt.Errorf("partition %q: want its index, a number from 0", args[1])
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.MovePartitionResponse, error) {
				return mc.MovePartition(ctx, &api.MovePartitionRequest{Tenant: g.tenant, Table: args[0], Index: uint32(idx), From: from, To: to})
			})
			if err != nil {
				return fmt.Errorf("move partition %s/%d: %w", args[0], idx, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "moving partition %s/%d from %s to %s (map version %d)\n", args[0], idx, resp.GetFrom(), resp.GetTo(), resp.GetMapVersion())
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the server whose replica moves (default: the primary's)")
	cmd.Flags().StringVar(&to, "to", "", "the target server (default: placement's choice)")
	return cmd
}

func serverDrainCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "drain ID",
		Short: "Move every replica off a server, with its data",
		Long: "Drain a table server: its primaries hand off at once, and every replica moves to other\n" +
			"servers the way `tabula partition move` moves one (a few at a time), with no failed request.\n" +
			"The server keeps running; once `tabula table describe` lists it nowhere it holds nothing\n" +
			"still needed and can be stopped. SIGTERM to a server drains it the same way.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			resp, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.DrainServerResponse, error) {
				return mc.DrainServer(ctx, &api.DrainServerRequest{ServerId: args[0]})
			})
			if err != nil {
				return fmt.Errorf("drain server %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "draining server %s: %d replica(s) to move (map version %d)\n", args[0], resp.GetReplicas(), resp.GetMapVersion())
			return nil
		},
	}
}
