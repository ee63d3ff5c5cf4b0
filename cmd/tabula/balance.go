package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

func clusterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "Operate on the cluster as a whole"}
	cmd.AddCommand(clusterBalanceCmd(g))
	return cmd
}

func clusterBalanceCmd(g *globals) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "balance",
		Short: "Even out load across the servers (or show how, with --dry-run)",
		Long: "Ask the master for its balance plan: which primary roles to hand off and which replicas to\n" +
			"move so every server is within a band (±15%) of the mean replica count, reads/s, writes/s,\n" +
			"engine time, disk and memory, respecting fault domains, capacity and a limit on moves in\n" +
			"flight. --dry-run prints the plan (what moves where and why) and the servers' loads before\n" +
			"and after it; nothing changes. Without --dry-run the master runs one balancing round now: it\n" +
			"starts the plan's primary transfers and replica moves (the moves copy in the background; run\n" +
			"it again to go on until the plan is empty; the master does so itself unless started with\n" +
			"--rebalance=false) and this\n" +
			"prints what it started.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			plan, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.BalancePlanResponse, error) {
				return mc.BalancePlan(ctx, &api.BalancePlanRequest{Apply: !dryRun})
			})
			if err != nil {
				return fmt.Errorf("cluster balance: %w", err)
			}
			return printBalancePlan(cmd.OutOrStdout(), plan, !dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan; change nothing")
	// Without --dry-run the round's answer says which actions started.
	return cmd
}

// printBalancePlan prints the actions in order, then the servers before
// and after them.
// apply: the plan was a round the master ran, whose actions say whether
// they started.
func printBalancePlan(out io.Writer, plan *api.BalancePlanResponse, apply bool) error {
	fmt.Fprintf(out, "balance plan at map version %d (band ±%.0f%% of the mean)\n", plan.GetMapVersion(), 100*plan.GetBand())
	if len(plan.GetActions()) == 0 {
		fmt.Fprintln(out, "no moves")
	}
	started := 0
	for i, a := range plan.GetActions() {
		what := "move replica of"
		if a.GetKind() == api.BalanceActionKind_BALANCE_ACTION_KIND_TRANSFER_PRIMARY {
			what = "hand primary of"
		}
		fmt.Fprintf(out, "%3d. %s %s/%s#%d (id %d) %s -> %s\n     why: %s\n", i+1, what, a.GetTenant(), a.GetTable(), a.GetIndex(),
			a.GetPartitionId(), a.GetFrom(), a.GetTo(), a.GetReason())
		switch {
		case a.GetStarted():
			started++
			fmt.Fprintln(out, "     started")
		case a.GetRefused() != "":
			fmt.Fprintf(out, "     not started: %s\n", a.GetRefused())
		}
	}
	if apply {
		fmt.Fprintf(out, "started %d of %d actions (moves copy in the background: run again to go on)\n", started, len(plan.GetActions()))
	}
	if n := plan.GetNote(); n != "" {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	for _, side := range []struct {
		title   string
		servers []*api.BalanceServer
	}{{"before", plan.GetBefore()}, {"after", plan.GetAfter()}} {
		fmt.Fprintf(out, "\n%s:\n", side.title)
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SERVER\tDOMAIN\tREPLICAS\tPRIMARIES\tREADS/S\tWRITES/S\tBUSY CORES\tDISK\tMEMORY\t")
		for _, s := range side.servers {
			state := ""
			if s.GetDraining() {
				state = "draining"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%.1f\t%.1f\t%.2f\t%s\t%s\t%s\n", s.GetId(), s.GetFaultDomain(), s.GetReplicas(), s.GetPrimaries(),
				s.GetReadsPerSec(), s.GetWritesPerSec(), s.GetBusyCores(), balance.Bytes(float64(s.GetDiskBytes())), balance.Bytes(float64(s.GetMemoryBytes())), state)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return nil
}
