package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
)

func partitionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "partition", Short: "Operate on one partition of a table"}
	cmd.AddCommand(partitionMoveCmd(g))
	return cmd
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
