package main

import (
	"errors"
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
		Short: "Show the moves that would even out load across the servers",
		Long: "Ask the master for its balance plan: which primary roles to hand off and which replicas to\n" +
			"move so every server is within a band (±15%) of the mean replica count, reads/s, writes/s,\n" +
			"engine time, disk and memory, respecting fault domains, capacity and a limit on moves in\n" +
			"flight. --dry-run prints the plan (what moves where and why) and the servers' loads before\n" +
			"and after it; nothing changes. Carrying the plan out is not built yet: --dry-run is required.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !dryRun {
				return errors.New("cluster balance: only --dry-run is built yet (the master does not carry plans out)")
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			plan, err := masterCallFor(ctx, g, func(mc api.MasterClient) (*api.BalancePlanResponse, error) {
				return mc.BalancePlan(ctx, &api.BalancePlanRequest{})
			})
			if err != nil {
				return fmt.Errorf("cluster balance: %w", err)
			}
			return printBalancePlan(cmd.OutOrStdout(), plan)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the plan; change nothing")
	return cmd
}

// printBalancePlan prints the actions in order, then the servers before
// and after them.
func printBalancePlan(out io.Writer, plan *api.BalancePlanResponse) error {
	fmt.Fprintf(out, "balance plan at map version %d (band ±%.0f%% of the mean)\n", plan.GetMapVersion(), 100*plan.GetBand())
	if len(plan.GetActions()) == 0 {
		fmt.Fprintln(out, "no moves")
	}
	for i, a := range plan.GetActions() {
		what := "move replica of"
		if a.GetKind() == api.BalanceActionKind_BALANCE_ACTION_KIND_TRANSFER_PRIMARY {
			what = "hand primary of"
		}
		fmt.Fprintf(out, "%3d. %s %s/%s#%d (id %d) %s -> %s\n     why: %s\n", i+1, what, a.GetTenant(), a.GetTable(), a.GetIndex(),
			a.GetPartitionId(), a.GetFrom(), a.GetTo(), a.GetReason())
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
